"""``agentrl sft backend=verl``: oracle play as verl's multi-turn SFT data, run by verl's trainer.

    agentrl make-data --sft hardware=a100 model=qwen_halfb 'sft.presets=[simpleSokobanAgent]'
    agentrl sft --dry-run backend=verl hardware=a100 model=qwen_halfb   # command + config, checked
    agentrl sft backend=verl hardware=a100 model=qwen_halfb             # torchrun, verl's trainer

    from agentrl.verl.sft import write_sft_data, sft_overrides, compose_sft_config
    paths = write_sft_data(config, folder)          # sft_train.parquet, sft_val.parquet
    verl_config = compose_sft_config(sft_overrides(config, paths))

**Data.** One parquet row per demonstration episode with a ``messages`` column (the chat:
system, user, assistant, user, ..., assistant; a preset with ``context: state``: one row a
turn, its own chat and reply, as the PPO rows), the layout verl 0.9.1's
``MultiTurnSFTDataset`` reads (``data.messages_key``), plus ``preset`` and ``seed`` for people.
The episodes are those ``agentrl sft`` plays locally (same presets, seeds and oracle replies,
:func:`agentrl.rollout.demonstrations.demonstration_chats`); validation rows are oracle
episodes of ``val.presets`` on ``val.group_num`` held-out seeds (verl reports their loss).
verl tokenizes each message with the chat template and learns every assistant message, so
``sft.random_action_share`` > 0 is refused here: its random turns must stay unlearned, and
verl's dataset has no per-turn mask.

**Launch.** ``torchrun --nnodes N --nproc_per_node G -m verl.trainer.sft_trainer <overrides>``
(verl's own FSDP SFT trainer, config ``sft_trainer_engine``): ``sft.mini_batch_size`` is verl's
global ``data.train_batch_size``, ``sft.micro_batch_size`` its ``micro_batch_size_per_gpu``,
``sft.epochs``/``lr``/``weight_decay``/``grad_clip`` its epochs and optimizer, the ``lora``
section its LoRA, ``verl.max_prompt_length + verl.max_response_length`` its ``max_length``.
Checkpoints go to ``<sft.output_dir>/verl`` and include a Hugging Face model
(``global_step_N/huggingface``) that ``agentrl train model.name=<that folder>`` starts from.
On several nodes add torchrun's rendezvous options (``--rdzv_endpoint``) to the printed command
on each node. ``hardware=cpu-verl`` runs it on this CPU (one process, gloo, fp32, sdpa:
:func:`agentrl.verl.cpu_platform.sft_overrides`); the model is loaded from where the PPO launch
loads it (:func:`agentrl.verl.overrides.model_path`: ``model=tiny_vllm`` is written there first).

**Dry run.** The overrides are composed with hydra over verl's config folder and built into
verl's config dataclasses as its trainer does (``omega_conf_to_dataclass`` of ``engine``,
``optim``, ``checkpoint``, and ``model`` when the model is a local folder, since verl's
``HFModelConfig`` reads the model files); nothing else starts, so it runs on a CPU machine.
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from agentrl.config import TrainConfig
from agentrl.verl.launch import verl_config_dir, write_model_folder
from agentrl.verl.overrides import chat_template, hydra_value, launch_env, model_path, on_cpu

__all__ = ["SFT_ENTRY", "SFT_TRAIN_FILE", "SFT_VAL_FILE", "compose_sft_config", "launch_sft",
           "sft_command", "sft_overrides", "sft_paths", "write_sft_data"]

SFT_ENTRY = "verl.trainer.sft_trainer"
SFT_CONFIG = "sft_trainer_engine"
SFT_TRAIN_FILE = "sft_train.parquet"
SFT_VAL_FILE = "sft_val.parquet"
CHECKED_SECTIONS = ("engine", "optim", "checkpoint")
"""Sections verl's SFT trainer builds into dataclasses first (``SFTTrainer._build_config``)."""


def sft_output_dir(config: TrainConfig) -> Path:
    return Path(config.sft.output_dir or config.run_dir / "sft")


def sft_paths(config: TrainConfig) -> tuple[Path, Path]:
    """Where ``make-data --sft`` and the launch write the SFT data by default."""
    folder = sft_output_dir(config) / "data"
    return folder / SFT_TRAIN_FILE, folder / SFT_VAL_FILE


# -- data ------------------------------------------------------------------------------------------
def check_sft_data(config: TrainConfig) -> None:
    """What verl's SFT data cannot hold (ValueError naming the key)."""
    share = config.sft.random_action_share
    if share > 0:
        raise ValueError(f"sft.random_action_share={share} is not allowed for verl's SFT data: "
                         "verl's MultiTurnSFTDataset learns every assistant message, and random "
                         "turns must stay unlearned; allowed: 0 (or train with backend=local)")


def check_verl_sft(config: TrainConfig) -> None:
    """What verl's SFT trainer cannot run with this config (ValueError naming the key)."""
    check_sft_data(config)
    sft, v = config.sft, config.verl
    gpus = v.nnodes * v.n_gpus_per_node
    if sft.mini_batch_size % gpus:
        raise ValueError(f"sft.mini_batch_size={sft.mini_batch_size} is not allowed on {gpus} "
                         f"GPUs: verl splits data.train_batch_size evenly over them; allowed: a "
                         f"multiple of {gpus}")
    if sft.episodes < sft.mini_batch_size:
        raise ValueError(f"sft.episodes={sft.episodes} is not allowed: verl drops the last "
                         f"incomplete batch of sft.mini_batch_size={sft.mini_batch_size}, so no "
                         f"step would run; allowed: an integer >= {sft.mini_batch_size}")


def sft_rows(config: TrainConfig, split: str) -> list[dict[str, Any]]:
    """Rows of the ``train`` (demonstrations) or ``val`` (held-out oracle episodes) file."""
    from agentrl.envs.splits import split_seeds
    from agentrl.rollout.demonstrations import demonstration_chats, demonstration_seeds

    if split == "train":
        names, seeds = config.sft_presets, demonstration_seeds(config.sft.episodes, config.seed)
        plan = [(names[i % len(names)], seed) for i, seed in enumerate(seeds)]
    else:
        seeds = split_seeds("val", config.val.group_num)
        plan = [(name, seed) for seed in seeds for name in config.val.presets]
    agents = dict(config.playing_presets(dict.fromkeys(name for name, _ in plan),
                                         config.rollout.max_new_tokens))  # as the local run
    rows = []
    for name, seed in plan:
        chats, _ = demonstration_chats(agents[name], seed, rng_seed=config.seed)
        rows += [{"messages": messages, "preset": name, "seed": seed} for messages in chats]
    return rows


def write_sft_data(config: TrainConfig, folder: str | Path) -> list[Path]:
    """``sft_train.parquet`` and ``sft_val.parquet`` in ``folder`` (see the module docstring)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    check_sft_data(config)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, name in (("train", SFT_TRAIN_FILE), ("val", SFT_VAL_FILE)):
        path = folder / name
        pq.write_table(pa.Table.from_pylist(sft_rows(config, split)), path)
        paths.append(path)
    return paths


# -- verl's SFT config -----------------------------------------------------------------------------
def sft_overrides(config: TrainConfig, data_paths: tuple[Path, Path]) -> list[str]:
    """Hydra overrides of verl's ``sft_trainer_engine`` config that run ``config.sft``; then
    ``verl.overrides`` is not applied (those are ppo_trainer keys)."""
    sft, v, model, lora = config.sft, config.verl, config.model, config.lora
    settings: dict[str, Any] = {
        "data.train_files": str(Path(data_paths[0]).resolve()),
        "data.val_files": str(Path(data_paths[1]).resolve()),
        "data.messages_key": "messages",
        "data.train_batch_size": sft.mini_batch_size,
        "data.micro_batch_size_per_gpu": sft.micro_batch_size,
        "data.use_dynamic_bsz": False,
        "data.max_length": v.max_prompt_length + v.max_response_length,
        "data.truncation": "error",
        "model.path": model_path(config),
        "model.enable_gradient_checkpointing": model.gradient_checkpointing,
        "engine.strategy": v.strategy,
        "engine.param_offload": v.param_offload,
        "engine.optimizer_offload": v.optimizer_offload,
        "optim.lr": sft.lr,
        "optim.weight_decay": sft.weight_decay,
        "optim.clip_grad": sft.grad_clip,
        "optim.lr_scheduler_type": "constant",
        "checkpoint.save_contents": ["model", "optimizer", "extra", "hf_model"],
        "trainer.default_local_dir": str(sft_output_dir(config) / "verl"),
        "trainer.project_name": config.project,
        "trainer.experiment_name": f"{config.experiment}-sft",
        "trainer.total_epochs": sft.epochs,
        "trainer.logger": list(config.trainer.logger),
        "trainer.nnodes": v.nnodes,
        "trainer.n_gpus_per_node": v.n_gpus_per_node,
        "trainer.seed": config.seed,
        "trainer.resume_mode": "disable",
    }
    if model.chat_template is not None:
        settings["model.custom_chat_template"] = chat_template(model.chat_template)
    if lora.rank:
        settings.update({"model.lora_rank": lora.rank, "model.lora_alpha": lora.alpha,
                         "model.target_modules": list(lora.target_modules)})
    overrides = [f"{key}={hydra_value(value)}" for key, value in settings.items()]
    if on_cpu(config):
        from agentrl.verl import cpu_platform

        overrides += cpu_platform.sft_overrides()
    return overrides


def compose_sft_config(overrides: list[str], validate: bool = True) -> Any:
    """verl's ``sft_trainer_engine`` config with ``overrides``, built into verl's dataclasses."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(version_base=None, config_dir=str(verl_config_dir())):
            verl_config = compose(SFT_CONFIG, overrides=overrides)
    except (HydraException, OmegaConfBaseException) as error:
        message = str(error).split("\nConfig search path:")[0].strip()
        raise ValueError(f"verl's {SFT_CONFIG} config rejects an override: {message}") from None
    finally:
        GlobalHydra.instance().clear()
    if validate:
        _validate(verl_config)
    return verl_config


def _validate(verl_config: Any) -> None:
    from hydra.errors import InstantiationException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException
    from verl.utils.config import omega_conf_to_dataclass

    sections = list(CHECKED_SECTIONS)
    if Path(str(verl_config.model.path)).expanduser().is_dir():
        sections.append("model")  # HFModelConfig reads the model's files
    try:
        with contextlib.redirect_stdout(sys.stderr):
            for section in sections:
                omega_conf_to_dataclass(OmegaConf.select(verl_config, section))
    except (AssertionError, ValueError, TypeError, KeyError, OmegaConfBaseException,
            InstantiationException) as error:
        cause = error.__cause__ or error
        raise ValueError(f"verl's SFT config check failed: {str(cause).strip()[:600]}") from None


# -- the launch ------------------------------------------------------------------------------------
def sft_command(config: TrainConfig, overrides: list[str]) -> list[str]:
    """``torchrun ... -m verl.trainer.sft_trainer <overrides>`` (hydra's output in the run dir)."""
    v = config.verl
    hydra_dir = hydra_value(str(sft_output_dir(config) / "verl" / "hydra"))
    return [sys.executable, "-m", "torch.distributed.run", f"--nnodes={v.nnodes}",
            f"--nproc_per_node={v.n_gpus_per_node}", "-m", SFT_ENTRY, *overrides,
            f"hydra.run.dir={hydra_dir}"]


def launch_sft(config: TrainConfig, dry_run: bool = False) -> int:
    """Write the SFT data, then run verl's SFT trainer (``dry_run``: print the checked config
    and the command instead); returns the exit status."""
    from omegaconf import OmegaConf

    check_verl_sft(config)
    paths = sft_paths(config)
    overrides = sft_overrides(config, paths)
    verl_config = compose_sft_config(overrides)
    command = sft_command(config, overrides)
    env = launch_env(config)
    if dry_run:
        print(OmegaConf.to_yaml(verl_config, resolve=True), end="")
        print(f"# verl's SFT config above passed verl's checks. The run writes {paths[0]} and "
              f"{paths[1]} (agentrl make-data --sft), then runs:")
        print(f"PYTHONPATH={shlex.quote(env['PYTHONPATH'])} \\")
        lines = [shlex.join(command[:7]), *(shlex.quote(part) for part in command[7:])]
        print("  " + " \\\n    ".join(lines))
        return 0
    print(f"writing the SFT data into {paths[0].parent}", flush=True)
    write_sft_data(config, paths[0].parent)
    write_model_folder(config)
    print(f"starting verl's SFT trainer ({len(overrides)} overrides)", flush=True)
    return subprocess.run(command, env=env, check=False).returncode
