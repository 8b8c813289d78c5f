"""``agentrl train backend=verl``: our config -> verl's ``ppo_trainer`` config -> its ``main_ppo``.

    agentrl train --dry-run hardware=a100 model=qwen_3b        # config + command, validated; CPU ok
    agentrl train hardware=a100 model=qwen_3b 'train.presets=[simpleSokobanAgent]'

    from agentrl.verl.launch import compose_verl_config, launch, verl_overrides
    overrides = verl_overrides(config, (train_path, val_path))   # hydra overrides of ppo_trainer
    verl_config = compose_verl_config(overrides)                 # composed and validated by verl

What runs is verl's own trainer, unchanged (``python -m verl.trainer.main_ppo <overrides>``): PPO
with a critic and GAE (``algorithm.*``; ``gamma`` 1 by default, because GAE discounts per generated
token; ``algorithm.gamma_unit=turn`` sets it to 1 and discounts through the turns' rewards
instead), FSDP actor and critic, vLLM in async mode with our AgentLoop
(:mod:`agentrl.verl.agent_loop`, whose own :func:`~agentrl.verl.agent_loop.verl_overrides` say how
verl finds it, ``trainer.use_v1`` included), greedy validation (``rollout.val_kwargs``, temperature
0) on the held-out task file, console and WandB loggers, checkpoints every ``trainer.save_freq``
steps under ``<run_dir>/checkpoints`` and ``resume_mode`` from our ``resume``. How our keys map
onto verl's is spelled out in :mod:`agentrl.verl.overrides`, section by section; ``verl.overrides``
(raw verl overrides) come last and win. Keys of the local engine alone (``device``, ``threads``,
``model.dtype``: verl keeps fp32 master weights and computes in bf16, ``rollout.max_batch``,
``rollout.max_wait_ms``, ``rollout.prefix_cache_tokens``: vLLM caches prefixes itself) are not
read; settings verl has no counterpart for and that would change the training
(``rollout.filter_ratio``, ``rollout.norm_method``, ``critic.share_backbone``, ``lora.dropout``)
fail at start-up (:mod:`agentrl.config.verl_rules`). ``critic.value_clip_scale: returns`` is
patched into verl (:mod:`agentrl.verl.returns`).

Before anything starts, :mod:`agentrl.verl.preflight` fits the micro-batches to each GPU's
share and the memory estimate to the card, and checks verl's dispatch divisions on the composed
config (in ``--dry-run`` too). On GPUs, :mod:`agentrl.verl.cluster` then checks the Ray cluster
the run joins (its GPUs against ``verl.nnodes`` x ``verl.n_gpus_per_node``, the same checkout
and a shared ``run_dir`` on every node, flash-attn on every node; not in ``--dry-run``). On a
CPU (``device: cpu``, ``hardware=cpu-verl``) the run goes through
:mod:`agentrl.verl.cpu_platform`; on GPUs where any node lacks flash-attn, through PyTorch's
sdpa (:func:`without_flash_attn`). ``PYTHONPATH``, ``WANDB_*`` and ``AGENTRL_CACHE`` reach every Ray
worker through ``ray_kwargs.ray_init.runtime_env`` (a cluster started before the launch does
not inherit the launcher's environment).
Then the task files are written to ``<run_dir>/data`` (:mod:`agentrl.verl.data`)
and our resolved config to ``<run_dir>/config.yaml``. While it runs, our AgentLoop's manager
writes our per-preset metrics (``train/<preset>/...``, ``val/<preset>/...``) and verl's own
(``actor/*``, ``critic/*``, ``timing_s/*``: verl's ``file`` logger, followed) to
``<run_dir>/metrics.jsonl`` and verl's WandB run, and a sample of episodes to
``<run_dir>/episodes/step_N.jsonl`` (:mod:`agentrl.verl.metrics`, :mod:`agentrl.verl.episodes`;
on V1 our replay buffer does, :mod:`agentrl.verl.agent_loop_v1`); when it ends, the launch adds
what verl logged last and draws ``learning_curves.png`` (``trainer.plot``): the folder a local
run leaves, which ``agentrl report`` reads. The child process
gets ``PYTHONPATH`` with this checkout, so the Ray workers that a local cluster starts import
``agentrl``; on a multi-node cluster every node needs ``agentrl`` installed
(``bash env_setup.sh --gpu``), see docs/HARDWARE.md.

**Dry run** (``--dry-run``): the same overrides are composed with hydra over verl's own config
folder and checked by verl's own code: ``verl.utils.config.validate_config`` (the first thing
``main_ppo`` does: batch divisibility, micro-batch rules, the actor's and critic's config
dataclasses) and ``omega_conf_to_dataclass`` for the algorithm and rollout sections.
Two checks are left to the real run: verl's ``HFModelConfig`` reads the model's config and
tokenizer files (from the hub for a hub id), so the dry run builds it only when the model is a
local folder; and the LoRA rank limit is vLLM's, checked only where vLLM is installed. Nothing
else is fetched or started, no Ray, no GPU: it runs on a CPU machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from agentrl.config import TrainConfig
from agentrl.trainers.plots import plot_learning_curves, reference_success
from agentrl.trainers.tracking import METRICS_FILE
from agentrl.verl import constrained, preflight, restart
from agentrl.verl.cluster import check_cluster
from agentrl.verl.data import write_tasks
from agentrl.verl.metrics import ingest_verl_log, verl_log_path
from agentrl.verl.overrides import (
    hydra_value,
    launch_env,
    micro_batch_per_gpu,
    model_path,
    on_cpu,
    sdpa_env,
    task_paths,
    verl_overrides,
    worker_env_key,
)

__all__ = ["VERL_ENTRY", "compose_verl_config", "hydra_value", "launch", "launch_command",
           "launch_env", "micro_batch_per_gpu", "model_path", "on_cpu", "task_paths",
           "validate_verl_config", "verl_config_dir", "verl_overrides", "without_flash_attn"]

VERL_ENTRY = "verl.trainer.main_ppo"
"""The module ``launch`` runs: verl's own PPO entry point."""
VERL_CONFIG = "ppo_trainer"
CHECKED_SECTIONS = ("algorithm", "actor_rollout_ref.rollout")
"""Sections built into verl's dataclasses on top of what ``validate_config`` builds."""


# -- verl's config, composed and validated ---------------------------------------------------------
def verl_config_dir() -> Path:
    """verl's own config folder (``verl/trainer/config``), found without importing verl."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("backend='verl' needs the verl package; install it with "
                         "`bash env_setup.sh --gpu` (GPU machine) or `bash env_setup.sh`")
    return Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"


def compose_verl_config(overrides: Sequence[str], validate: bool = True) -> Any:
    """verl's ``ppo_trainer`` config with ``overrides`` (a DictConfig), validated by verl."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(version_base=None, config_dir=str(verl_config_dir())):
            verl_config = compose(VERL_CONFIG, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as error:
        message = str(error).split("\nConfig search path:")[0].strip()
        raise ValueError(f"verl's {VERL_CONFIG} config rejects an override: {message}") from None
    finally:
        GlobalHydra.instance().clear()
    if validate:
        validate_verl_config(verl_config)
    return verl_config


def validate_verl_config(verl_config: Any) -> None:
    """verl's own checks (see the module docstring); a failure -> ValueError with verl's words.
    verl's notices go to stderr, so a dry run's stdout is the config and the command only."""
    from hydra.errors import InstantiationException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    checked = _checkable_copy(verl_config)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            validate_config(checked, use_reference_policy=need_reference_policy(checked),
                            use_critic=need_critic(checked))
            for section in CHECKED_SECTIONS:
                omega_conf_to_dataclass(OmegaConf.select(checked, section))
            if "_target_" in checked.actor_rollout_ref.model:
                omega_conf_to_dataclass(checked.actor_rollout_ref.model)
    except (AssertionError, ValueError, TypeError, KeyError, OmegaConfBaseException,
            InstantiationException) as error:
        raise ValueError(f"verl's config check failed: {_first_lines(error)}") from None


def _checkable_copy(verl_config: Any) -> Any:
    """A copy without what a CPU machine cannot check: the model sections stay plain mappings
    unless the model is a local folder, and vLLM's LoRA rank limit needs vLLM installed."""
    from omegaconf import open_dict

    checked = verl_config.copy()
    with open_dict(checked):
        for model in (checked.actor_rollout_ref.model, checked.critic.model):
            if not Path(os.path.expanduser(str(model.path))).is_dir():
                model.pop("_target_", None)
        if importlib.util.find_spec("vllm") is None:
            checked.actor_rollout_ref.model.lora_rank = 0
            checked.actor_rollout_ref.model.lora.rank = 0
    return checked


def _first_lines(error: BaseException, lines: int = 6) -> str:
    cause = error.__cause__ or error
    return "\n".join(str(cause).strip().splitlines()[:lines]) or type(cause).__name__


# -- the launch ------------------------------------------------------------------------------------
def launch_command(overrides: Sequence[str], config: TrainConfig) -> list[str]:
    """``python -m verl.trainer.main_ppo <overrides>``; hydra's own output goes to the run dir."""
    hydra_dir = hydra_value(str(config.run_dir / "verl"))
    return [sys.executable, "-m", VERL_ENTRY, *overrides, f"hydra.run.dir={hydra_dir}"]


def launch(config: TrainConfig, dry_run: bool = False) -> int:
    """Validate, then run verl's ``main_ppo`` (``dry_run``: print the verl config and the command
    instead); returns the exit status."""
    config, notes = preflight.fit(config)
    paths = task_paths(config)
    overrides = verl_overrides(config, paths)
    verl_config = compose_verl_config(overrides)
    constrained.check_verl_config(verl_config)
    preflight.check_dispatch(verl_config, preflight.rows_vary(config))
    report = [preflight.describe(config), *(f"preflight: {note}" for note in notes)]
    command = launch_command(overrides, config)
    env = launch_env(config)
    if dry_run:
        _print_dry_run(verl_config, command, env, paths, report)
        return 0
    if not on_cpu(config):
        flash_attn, cluster_notes = check_cluster(config)
        report += [f"preflight: {note}" for note in cluster_notes]
        if not flash_attn:
            config = without_flash_attn(config)
            overrides = verl_overrides(config, paths)
            compose_verl_config(overrides)
            command, env = launch_command(overrides, config), launch_env(config)
    print("\n".join(report), flush=True)
    prepare_restart(config, verl_config)
    config.run_dir.mkdir(parents=True, exist_ok=True)
    (config.run_dir / "config.yaml").write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
    print(f"writing the task files into {paths[0].parent}", flush=True)
    write_tasks(config, paths[0].parent)
    write_model_folder(config)
    print(f"starting verl: {shlex.join(command[:3])} ... ({len(overrides)} overrides)", flush=True)
    command, env = _same_wandb_run(config, command, env)
    ingest_verl_log(config.run_dir)  # what a killed launch's verl logged last (verl empties it)
    verl_log_path(config.run_dir).parent.mkdir(parents=True, exist_ok=True)  # verl's file logger
    returncode = run_verl(command, env)
    ingest_verl_log(config.run_dir)  # verl's last step: logged after our last batch
    metrics = config.run_dir / METRICS_FILE  # written by the manager (V1: the replay buffer)
    if config.trainer.plot and metrics.exists():
        references = reference_success(config.run_dir, list(config.val.presets),
                                       config.val.group_num)
        plot = plot_learning_curves(metrics, config.run_dir / "learning_curves.png",
                                    references=references)
        print(f"metrics: {metrics}\nlearning curves: {plot}", flush=True)
    return returncode


EXIT_INTERRUPTED = 130
"""What :func:`run_verl` returns after Ctrl-C (128 + SIGINT, as a shell reports it)."""
VERL_STOP_S = 60.0
"""How long Ctrl-C waits for verl, which got the signal too, to end before it is killed."""


def run_verl(command: Sequence[str], env: dict[str, str] | None) -> int:
    """verl's ``main_ppo`` as a child process; its exit status. Ctrl-C reaches verl too (the
    terminal's process group): this waits up to :data:`VERL_STOP_S` for it to end (a second
    Ctrl-C does not stop the wait), kills what is left, and returns :data:`EXIT_INTERRUPTED`
    instead of raising, so the launch still takes in verl's last records and the command
    says where the run stands (``agentrl.cli.train``)."""
    process = subprocess.Popen(command, env=env, preexec_fn=restart.die_with_parent)
    try:
        return process.wait()
    except KeyboardInterrupt:
        deadline = time.monotonic() + VERL_STOP_S
        while process.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(KeyboardInterrupt, subprocess.TimeoutExpired):
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
        if process.poll() is None:
            process.kill()
            process.wait()
        return EXIT_INTERRUPTED


def prepare_restart(config: TrainConfig, verl_config: Any) -> None:
    """What a killed earlier launch into ``run_dir`` left, put right (:mod:`.restart`): its
    processes ended, verl's resume tracker pointed at the newest intact checkpoint."""
    from verl.trainer.ppo.utils import need_critic

    restart.end_leftovers(config.run_dir)
    roles = ("actor", "critic") if need_critic(verl_config) else ("actor",)
    restart.resume_point(config.run_dir / "checkpoints", str(config.resume), roles)


def _same_wandb_run(config: TrainConfig, command: list[str], env: Mapping[str, str]
                    ) -> tuple[list[str], dict[str, str]]:
    """verl's WandB run continued by a restart, as the local engine's: the run id kept in
    ``run_dir/run.json`` and ``resume=allow`` (verl's ``wandb.init`` names no id; WandB reads
    these variables; a Ray cluster started before the launch gets them in the runtime_env)."""
    from agentrl.trainers.tracking import run_id_for

    if "wandb" not in config.trainer.logger or "WANDB_RUN_ID" in env:
        return command, dict(env)
    wandb = {"WANDB_RUN_ID": run_id_for(config.run_dir, config.experiment),
             "WANDB_RESUME": "allow"}
    runtime = [f"{worker_env_key(key)}={hydra_value(value)}" for key, value in wandb.items()]
    return [*command[:-1], *runtime, command[-1]], {**env, **wandb}


def write_model_folder(config: TrainConfig) -> None:
    """A model the package builds (a tiny test model, the embedded one) written where
    :func:`model_path` points, for verl's workers to load."""
    from agentrl.models.embedded import embedded_model_folder
    from agentrl.models.loading import TINY_MODELS, save_tiny_model

    folder = Path(model_path(config))
    if config.model.name in TINY_MODELS and not (folder / "tokenizer_config.json").exists():
        print(f"writing the {config.model.name} model into {folder}", flush=True)
        save_tiny_model(config.model.name, folder)
    elif config.model.name == "embedded":
        embedded_model_folder()   # converted once, then reused: the folder model_path names


def without_flash_attn(config: TrainConfig) -> TrainConfig:
    """``config`` on PyTorch's sdpa attention, with a loud warning: flash-attn is not installed
    (``env_setup.sh --gpu`` compiles it and falls back when the build fails). Slower, the same
    results; verl's critic loader is patched for it (:mod:`agentrl.verl.cpu_platform`)."""
    from agentrl.verl import cpu_platform

    print("!!!! WARNING: flash-attn is not installed: verl runs with PyTorch's sdpa attention "
          "(slower, same results).\n!!!! Install it: MAX_JOBS=4 pip install "
          "--no-build-isolation flash-attn==2.8.3", file=sys.stderr, flush=True)
    overrides = (*cpu_platform.sdpa_overrides(), *config.verl.overrides)
    env_vars = [f"{worker_env_key(key)}={hydra_value(value)}"
                for key, value in sdpa_env().items()]
    return dataclasses.replace(config, verl=dataclasses.replace(
        config.verl, overrides=(*overrides, *env_vars)))


def _print_dry_run(verl_config: Any, command: list[str], env: Mapping[str, str],
                   paths: Sequence[Path], report: Sequence[str]) -> None:
    from omegaconf import OmegaConf

    print(OmegaConf.to_yaml(verl_config, resolve=True), end="")  # as verl's workers see it
    print("".join(f"# {line}\n" for line in report), end="")
    print(f"# verl's config above passed verl's checks. The run writes the task files "
          f"{paths[0]} and {paths[1]}, then runs:")
    shown = {key: env[key] for key in ("PYTHONPATH", "WANDB_MODE", "WANDB_DIR")}
    print(" ".join(f"{key}={shlex.quote(value)}" for key, value in shown.items()), "\\")
    lines = [shlex.join(command[:3]), *(shlex.quote(part) for part in command[3:])]
    print("  " + " \\\n    ".join(lines))
