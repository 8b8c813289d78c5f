"""verl's checkpoints as files: whether a ``global_step_N`` folder is whole, and the model a verl
run saved. Here, below the verl backend, so that ``agentrl eval``, ``play --model`` and a run's
``model=`` read a verl run folder as they read a local one
(:func:`agentrl.trainers.checkpoint.model_folder`), and :mod:`agentrl.verl.restart` resumes from
the newest whole step; nothing here imports verl.

    verl_model(Path("runs/agentrl/quick"), "last")  # .../global_step_N/actor/huggingface
    verl_run_of(folder)                             # runs/agentrl/quick

verl's checkpoint of step N is ``<run>/checkpoints/global_step_N/`` (``trainer.default_local_dir``):
per role (``actor/``, ``critic/``) its FSDP shards per rank and ``fsdp_config.json``, and the data
loader's position ``data.pt``; with ``hf_model`` in the actor's ``checkpoint.save_contents``
(agentrl's verl runs set it, :mod:`agentrl.verl.overrides`) rank 0 also writes the whole model as
a Hugging Face folder, ``actor/huggingface/``: the folder a local engine loads. Without it that
folder holds only the config and tokenizer. verl keeps no best checkpoint by validation, so
``best`` is the newest intact one (as for a local run without ``best.json``).
"""

from __future__ import annotations

import json
import re
import zipfile
from collections.abc import Sequence
from pathlib import Path

__all__ = ["HF_FOLDER", "STEP_DIR", "checkpoint_problem", "is_verl_run", "newest_intact",
           "step_folders", "verl_model", "verl_run_of"]

STEP_DIR = re.compile(r"global_step_(\d+)")
SHARD = re.compile(r"(model|optim|extra_state)_world_size_(\d+)_rank_(\d+)\.pt")
HF_FOLDER = "huggingface"
"""The Hugging Face model verl writes inside a role's checkpoint folder."""
WEIGHTS = ("*.safetensors", "pytorch_model*.bin")


# -- whole or not ---------------------------------------------------------------------------------
def checkpoint_problem(folder: Path, roles: Sequence[str]) -> str | None:
    """Why ``global_step_N`` cannot be resumed from, or None when it is intact."""
    for role in roles:
        if (problem := _role_problem(folder / role)) is not None:
            return f"{role}: {problem}"
    return _archive_problem(folder / "data.pt")


def _role_problem(folder: Path) -> str | None:
    try:
        world = int(json.loads((folder / "fsdp_config.json").read_text())["world_size"])
    except (OSError, ValueError, TypeError, KeyError):
        return "no readable fsdp_config.json"
    shards = {SHARD.fullmatch(p.name).group(1, 2, 3) for p in folder.glob("*.pt")
              if SHARD.fullmatch(p.name)}
    for kind in {"model"} | {kind for kind, _, _ in shards}:
        missing = [r for r in range(world) if (kind, str(world), str(r)) not in shards]
        if missing:
            return f"{kind} shards of rank(s) {missing} missing (world size {world})"
    for path in sorted(folder.glob("*.pt")):
        if (problem := _archive_problem(path)) is not None:
            return problem
    return None


def _archive_problem(path: Path) -> str | None:
    """``torch.save`` writes a zip archive whose directory comes last: a file cut short by a
    kill has none."""
    if not path.is_file():
        return f"{path.name} missing"
    if not zipfile.is_zipfile(path):
        return f"{path.name} cut short ({path.stat().st_size} bytes)"
    return None


def step_folders(checkpoints: Path) -> list[tuple[int, Path]]:
    """``global_step_N`` folders, newest first."""
    found = [(int(m.group(1)), p) for p in checkpoints.glob("global_step_*")
             if p.is_dir() and (m := STEP_DIR.fullmatch(p.name))]
    return sorted(found, reverse=True)


def newest_intact(checkpoints: Path, roles: Sequence[str] = ("actor",)) -> Path | None:
    """The newest ``global_step_N`` folder whose ``roles`` are intact (what ``resume=auto``
    would take), without moving verl's tracker; None when there is none."""
    return next((folder for _, folder in step_folders(checkpoints)
                 if checkpoint_problem(folder, roles) is None), None)


def is_verl_run(run: Path) -> bool:
    """Whether ``run`` is a run folder verl checkpointed into."""
    return bool(step_folders(run / "checkpoints"))


def verl_model(run: Path, checkpoint: str | None = None) -> Path:
    """The Hugging Face model folder of ``run``'s actor at ``checkpoint`` (``best``, the default,
    and ``last``: the newest intact step; ``step_N`` or ``N``: that step, intact). ``ValueError``
    saying what is wrong and what is allowed."""
    from agentrl.trainers.checkpoint import checkpoint_choice

    checkpoints = run / "checkpoints"
    _, step = checkpoint_choice(checkpoint)
    if step is None:
        folder = newest_intact(checkpoints)
        if folder is None:
            raise ValueError(f"{checkpoints} holds no intact verl checkpoint (global_step_N with "
                             "the actor's shards); allowed: a run folder verl checkpointed into")
    else:
        folder = checkpoints / f"global_step_{step}"
        if (problem := checkpoint_problem(folder, ("actor",))) is not None:
            kept = ", ".join(f.name for _, f in reversed(step_folders(checkpoints))) or "none"
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
    model = model.resolve()
    parts = model.parts
    if len(parts) < 5 or parts[-1] != HF_FOLDER or parts[-2] != "actor" \
            or not STEP_DIR.fullmatch(parts[-3]) or parts[-4] != "checkpoints":
        return None
    return model.parents[3]
