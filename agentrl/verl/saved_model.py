"""The model a verl run saved, found from its run folder: ``agentrl eval``, ``play --model`` and
the benchmarks read a verl run as they read a local one.

    folder = verl_model(Path("runs/agentrl/quick"), "last")   # .../global_step_N/actor/huggingface
    verl_run_of(folder)                                      # runs/agentrl/quick

verl's checkpoint of step N is ``<run>/checkpoints/global_step_N/`` (``trainer.default_local_dir``),
its actor's weights sharded per FSDP rank; with ``hf_model`` in the actor's
``checkpoint.save_contents`` (agentrl's verl runs set it, :mod:`agentrl.verl.overrides`) rank 0
also writes the whole model as a Hugging Face folder, ``actor/huggingface/``: the folder a
local engine loads. Without it that folder holds only the config and tokenizer. verl keeps no
best checkpoint by validation, so ``best`` is the newest intact one (as for a local run
without ``best.json``).
"""

from __future__ import annotations

from pathlib import Path

from agentrl.verl.restart import STEP_DIR, checkpoint_problem, newest_intact

__all__ = ["HF_FOLDER", "is_verl_run", "verl_model", "verl_run_of"]

HF_FOLDER = "huggingface"
"""The Hugging Face model verl writes inside a role's checkpoint folder."""
WEIGHTS = ("*.safetensors", "pytorch_model*.bin")


def is_verl_run(run: Path) -> bool:
    """Whether ``run`` is a run folder verl checkpointed into."""
    checkpoints = run / "checkpoints"
    return checkpoints.is_dir() and any(STEP_DIR.fullmatch(p.name) and p.is_dir()
                                        for p in checkpoints.iterdir())


def verl_model(run: Path, checkpoint: str | None = None) -> Path:
    """The Hugging Face model folder of ``run``'s actor at ``checkpoint`` (``best``, the default,
    and ``last``: the newest intact step; ``step_N`` or ``N``: that step, intact). ``ValueError``
    saying what is wrong and what is allowed."""
    from agentrl.trainers.checkpoint import CHECKPOINT_CHOICES, STEP_CHOICE

    checkpoints = run / "checkpoints"
    which = "best" if checkpoint is None else str(checkpoint)
    step = STEP_CHOICE.fullmatch(which)
    if which not in ("best", "last") and step is None:
        raise ValueError(f"checkpoint={which!r} is not allowed; allowed: {CHECKPOINT_CHOICES}")
    if step is None:
        folder = newest_intact(checkpoints)
        if folder is None:
            raise ValueError(f"{checkpoints} holds no intact verl checkpoint (global_step_N with "
                             "the actor's shards); allowed: a run folder verl checkpointed into")
    else:
        folder = checkpoints / f"global_step_{int(step.group(1))}"
        if (problem := checkpoint_problem(folder, ("actor",))) is not None:
            kept = ", ".join(sorted(p.name for p in checkpoints.glob("global_step_*"))) or "none"
            raise ValueError(f"verl checkpoint {folder}: {problem}; allowed: checkpoint=last, "
                             f"or step_N of one kept ({kept})")
    model = folder / "actor" / HF_FOLDER
    if not any(any(model.glob(pattern)) for pattern in WEIGHTS):
        raise ValueError(
            f"verl saved no Hugging Face model in {model} (its actor's checkpoint.save_contents "
            "had no hf_model); allowed: a run agentrl started (it saves one), or verl's merger "
            f"first: python -m verl.model_merger merge --backend fsdp --local_dir "
            f"{folder / 'actor'} --target_dir <folder>, then that folder")
    return model


def verl_run_of(model: Path) -> Path | None:
    """The run folder of a verl actor's Hugging Face folder
    (``<run>/checkpoints/global_step_N/actor/huggingface``), or None for any other path."""
    parts = model.resolve().parts
    if len(parts) < 5 or parts[-1] != HF_FOLDER or parts[-2] != "actor" \
            or not STEP_DIR.fullmatch(parts[-3]) or parts[-4] != "checkpoints":
        return None
    return model.resolve().parents[3]
