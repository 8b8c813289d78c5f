"""``agentrl train backend=verl``: our config -> verl's ``ppo_trainer`` config -> its ``main_ppo``.

    agentrl train --dry-run hardware=a100 model=qwen_3b        # config + command, validated; CPU ok
    agentrl train hardware=a100 model=qwen_3b 'train.presets=[simpleSokobanAgent]'

    from agentrl.verl.launch import compose_verl_config, launch, verl_overrides
    overrides = verl_overrides(config, (train_path, val_path))   # hydra overrides of ppo_trainer
    verl_config = compose_verl_config(overrides)                 # composed and validated by verl

What runs is verl's own trainer, unchanged (``python -m verl.trainer.main_ppo <overrides>``):
PPO with a critic and GAE (``algorithm.*``; ``gamma`` 1 by default, because GAE discounts per
generated token; ``algorithm.gamma_unit=turn`` sets it to 1 and discounts through the turns'
rewards instead), FSDP actor and critic, vLLM in async mode with our AgentLoop
(:mod:`agentrl.verl.agent_loop`, whose own :func:`~agentrl.verl.agent_loop.verl_overrides` say
how verl finds it, ``trainer.use_v1`` included), greedy validation (``rollout.val_kwargs``,
temperature 0) on the held-out task file, console and WandB loggers, checkpoints every
``trainer.save_freq`` steps under ``<run_dir>/checkpoints`` and ``resume_mode`` from our
``resume``. How our keys map onto verl's is spelled out in :func:`verl_overrides`, section by
section; ``verl.overrides`` (raw verl overrides) come last and win. Keys of the local engine
alone (``device``, ``threads``, ``model.dtype``: verl keeps fp32 master weights and computes in
bf16, ``rollout.max_batch``, ``rollout.max_wait_ms``, ``rollout.prefix_cache_tokens``: vLLM
caches prefixes itself) are not read; settings verl has no counterpart for and that would change
the training (``rollout.filter_ratio``, ``rollout.norm_method``, ``critic.share_backbone``,
``lora.dropout``) fail at start-up (``TrainConfig``'s verl checks). ``critic.value_clip_scale:
returns`` and the bootstrap of episodes the response budget cut are patched into verl
(:mod:`agentrl.verl.returns`).

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
writes our per-preset metrics (``train/<preset>/...``, ``val/<preset>/...``) to
``<run_dir>/metrics.jsonl`` and verl's WandB run (:mod:`agentrl.verl.metrics`; legacy trainer);
when it ends, ``learning_curves.png`` is drawn from them (``trainer.plot``). The child process
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
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

import agentrl
from agentrl.config import TrainConfig
from agentrl.trainers.plots import plot_learning_curves, reference_success
from agentrl.trainers.tracking import METRICS_FILE
from agentrl.verl import constrained, preflight, restart, returns
from agentrl.verl.cluster import check_cluster
from agentrl.verl.data import TRAIN_FILE, VAL_FILE, write_tasks

__all__ = ["VERL_ENTRY", "compose_verl_config", "hydra_value", "launch", "launch_command",
           "launch_env", "micro_batch_per_gpu", "model_path", "on_cpu", "task_paths",
           "validate_verl_config", "verl_config_dir", "verl_overrides", "without_flash_attn"]

VERL_ENTRY = "verl.trainer.main_ppo"
"""The module ``launch`` runs: verl's own PPO entry point."""
VERL_CONFIG = "ppo_trainer"
CHECKED_SECTIONS = ("algorithm", "actor_rollout_ref.rollout")
"""Sections built into verl's dataclasses on top of what ``validate_config`` builds."""
PROJECT_ROOT = Path(agentrl.__file__).resolve().parents[1]
VALIDATION_DUMPS = "validation_generations"
"""Folder of ``run_dir`` where verl dumps every validation episode (``validation_data_dir``)."""
CRITIC_INFER_TOKENS = "critic.ppo_infer_max_token_len_per_gpu"
"""The key verl 0.9.1's critic reads for its no-grad forward's token budget."""


# -- our config -> verl's overrides ----------------------------------------------------------------
def task_paths(config: TrainConfig) -> tuple[Path, Path]:
    """Where ``launch`` writes the training and validation task files."""
    folder = config.run_dir / "data"
    return folder / TRAIN_FILE, folder / VAL_FILE


def verl_overrides(config: TrainConfig, data_paths: Sequence[str | Path]) -> list[str]:
    """Hydra overrides of verl's ``ppo_trainer`` config that run ``config``; the AgentLoop's
    own overrides, then ``verl.overrides`` last."""
    from agentrl.verl.agent_loop import verl_overrides as agent_loop_overrides

    sections = (_data(config, data_paths), _models(config), _algorithm(config), _actor(config),
                _critic(config), _rollout(config), _trainer(config), _worker_env(config))
    settings = {key: value for section in sections for key, value in section.items()}
    return ([f"{key}={hydra_value(value)}" for key, value in settings.items()]
            + agent_loop_overrides(config.verl.trainer == "v1") + _platform_overrides(config)
            + list(config.verl.overrides))


def on_cpu(config: TrainConfig) -> bool:
    """verl's trainer on this machine's CPU (``hardware=cpu-verl``, :mod:`.cpu_platform`)."""
    return config.device == "cpu"


def _platform_overrides(config: TrainConfig) -> list[str]:
    if not on_cpu(config):
        return []
    from agentrl.verl import cpu_platform

    return cpu_platform.verl_overrides()


def model_path(config: TrainConfig) -> str:
    """Where verl's workers load the model: a local folder or checkpoint (absolute: workers have other cwds),
    the folder ``tiny-vllm`` is written to at launch, or a hub id."""
    from agentrl.models.loading import TINY_MODELS, cache_root

    from agentrl.models.loading import checkpoint_model_folder

    name = config.model.name
    folder = checkpoint_model_folder(Path(name).expanduser())  # an SFT checkpoint: its actor/
    if folder.is_dir():
        return str(folder.resolve())
    if name in TINY_MODELS:
        return str(cache_root() / f"{name}-hf")
    return name


def _data(config: TrainConfig, data_paths: Sequence[str | Path]) -> dict[str, Any]:
    train_path, val_path = (str(Path(path).resolve()) for path in data_paths)
    return {
        "data.train_files": train_path,
        "data.val_files": val_path,
        "data.train_batch_size": config.train.group_num,   # a row is a group: one game
        "data.max_prompt_length": config.verl.max_prompt_length,
        "data.max_response_length": config.verl.max_response_length,
        "data.shuffle": False,                               # rows are in step order already
        "data.seed": config.seed,
    }


def _models(config: TrainConfig) -> dict[str, Any]:
    model, lora, path = config.model, config.lora, model_path(config)
    out: dict[str, Any] = {}
    for role in ("actor_rollout_ref.model", "critic.model"):
        out[f"{role}.path"] = path
        out[f"{role}.enable_gradient_checkpointing"] = model.gradient_checkpointing
    if model.chat_template is not None:
        out["actor_rollout_ref.model.custom_chat_template"] = _chat_template(model.chat_template)
    if lora.rank:
        out["actor_rollout_ref.model.lora_rank"] = lora.rank
        out["actor_rollout_ref.model.lora_alpha"] = lora.alpha
        out["actor_rollout_ref.model.target_modules"] = list(lora.target_modules)
    return out


def _algorithm(config: TrainConfig) -> dict[str, Any]:
    a = config.algorithm
    return {
        "algorithm.adv_estimator": a.adv_estimator,
        # gamma_unit turn: the turns' rewards carry the discount (agentrl.verl.data, turn_gamma)
        "algorithm.gamma": 1.0 if a.gamma_unit == "turn" else a.gamma,
        "algorithm.lam": a.lam,
        "algorithm.use_kl_in_reward": a.use_kl_in_reward,
        "algorithm.kl_penalty": a.kl_penalty,
        "algorithm.kl_ctrl.kl_coef": a.kl_coef,
        "algorithm.norm_adv_by_std_in_grpo": a.norm_adv_by_std_in_grpo,
    }


def micro_batch_per_gpu(config: TrainConfig) -> int:
    """``actor.micro_batch_size``, made a divisor of a GPU's share of a mini-batch (which
    shrinks as GPUs are added: the presets' sizes then still hold on several nodes); verl
    splits that share into whole micro-batches."""
    from agentrl.verl.preflight import largest_divisor

    gpus = config.verl.nnodes * config.verl.n_gpus_per_node
    mini = config.actor.ppo_mini_batch_size or config.train.group_num * config.train.group_size
    return largest_divisor(max(1, mini // gpus), config.actor.micro_batch_size)


def _actor(config: TrainConfig) -> dict[str, Any]:
    a, v, size = config.actor, config.verl, config.train.group_size
    mini_trajectories = a.ppo_mini_batch_size or config.train.group_num * size
    prefix = "actor_rollout_ref.actor"
    return {
        **_optimizer(prefix, a.lr, a.warmup_steps, a.weight_decay, a.grad_clip),
        **_fsdp(prefix, "fsdp_config", v.strategy, v.param_offload, v.optimizer_offload),
        f"{prefix}.ppo_epochs": a.ppo_epochs,
        f"{prefix}.ppo_mini_batch_size": mini_trajectories // size,   # verl counts groups here
        f"{prefix}.ppo_micro_batch_size_per_gpu": micro_batch_per_gpu(config),
        f"{prefix}.clip_ratio_low": a.clip_ratio_low,
        f"{prefix}.clip_ratio_high": a.clip_ratio_high,
        f"{prefix}.clip_ratio_c": a.clip_ratio_c,
        f"{prefix}.loss_agg_mode": a.loss_agg_mode,
        f"{prefix}.policy_loss.loss_mode": a.policy_loss,
        f"{prefix}.entropy_coeff": a.entropy_coeff,
        f"{prefix}.use_kl_loss": a.use_kl_loss,
        f"{prefix}.kl_loss_coef": a.kl_loss_coef,
        f"{prefix}.kl_loss_type": a.kl_loss_type,
        # the reference model (built only with a KL term): forward passes only
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu":
            v.log_prob_micro_batch_size_per_gpu,
        "actor_rollout_ref.ref.fsdp_config.param_offload": v.param_offload,
    }


def _critic(config: TrainConfig) -> dict[str, Any]:
    """verl 0.9.1's critic (an engine ``TrainingWorker``) always batches by tokens: its
    ``*micro_batch_size*`` keys are read by nobody; ``ppo_max_token_len_per_gpu`` bounds an
    update's micro-batch and ``ppo_infer_max_token_len_per_gpu`` the no-grad value forward
    (``ray_trainer``: ``engine_config.infer_max_token_len_per_gpu``; ``critic.yaml`` lacks the
    key, hence ``++``; its ``forward_max_token_len_per_gpu`` is read by nobody). Sized here as
    the actor's micro-batches of whole-length trajectories."""
    c, v = config.critic, config.verl
    tokens = v.max_prompt_length + v.max_response_length
    out = {
        **_optimizer("critic", c.lr, c.warmup_steps, c.weight_decay, c.grad_clip),
        **_fsdp("critic", "fsdp", v.strategy, v.param_offload, v.optimizer_offload),
        "critic.cliprange_value": c.cliprange_value,
        "critic.use_dynamic_bsz": True,
        "critic.ppo_max_token_len_per_gpu": micro_batch_per_gpu(config) * tokens,
        f"++{CRITIC_INFER_TOKENS}": v.log_prob_micro_batch_size_per_gpu * tokens,
    }
    if c.ppo_epochs is not None:  # else verl's default: the actor's
        out["critic.ppo_epochs"] = c.ppo_epochs
    return out


def _rollout(config: TrainConfig) -> dict[str, Any]:
    r, v, prefix = config.rollout, config.verl, "actor_rollout_ref.rollout"
    return {
        f"{prefix}.name": "vllm",
        f"{prefix}.mode": "async",
        f"{prefix}.n": config.train.group_size,            # every episode of a group: one row
        f"{prefix}.temperature": r.temperature,
        f"{prefix}.top_p": r.top_p,
        f"{prefix}.top_k": r.top_k or -1,                  # verl's "off" is -1, ours 0
        f"{prefix}.tensor_model_parallel_size": v.tensor_model_parallel_size,
        f"{prefix}.gpu_memory_utilization": v.gpu_memory_utilization,
        f"{prefix}.log_prob_micro_batch_size_per_gpu": v.log_prob_micro_batch_size_per_gpu,
        f"{prefix}.agent.num_workers": v.agent_workers,
        # our AgentLoop sets every episode's reward itself: verl's reward-loop workers (8 Ray
        # actors by default) would only idle (none is asked while reward_score is set)
        "reward.num_workers": 0,
        # validation: greedy, val.group_size episodes per held-out game
        f"{prefix}.val_kwargs.n": config.val.group_size,
        f"{prefix}.val_kwargs.temperature": 0,
        f"{prefix}.val_kwargs.top_p": 1.0,
        f"{prefix}.val_kwargs.top_k": -1,
        f"{prefix}.val_kwargs.do_sample": False,
        # constrained actions: vLLM masks the sampler (the trainer's side: launch_env)
        **({f"+{prefix}.engine_kwargs.vllm.logits_processors": [constrained.PROCESSOR]}
           if config.constrained_actions else {}),
    }


def _trainer(config: TrainConfig) -> dict[str, Any]:
    t, v, steps = config.trainer, config.verl, config.train.total_steps
    resume = {"auto": "auto", "never": "disable"}.get(config.resume, "resume_path")
    out = {
        "trainer.project_name": config.project,
        "trainer.experiment_name": config.experiment,
        "trainer.logger": list(t.logger),
        "trainer.nnodes": v.nnodes,
        "trainer.n_gpus_per_node": v.n_gpus_per_node,
        "trainer.total_epochs": 1,                         # the task file holds every step's rows
        "trainer.total_training_steps": steps,
        "trainer.save_freq": t.save_freq or steps,         # verl also saves on the last step
        "trainer.test_freq": config.val.test_freq or -1,   # verl: -1 = never
        "trainer.val_before_train": config.val.before_train,
        "trainer.default_local_dir": str(config.run_dir / "checkpoints"),
        "trainer.max_actor_ckpt_to_keep": t.keep_last,
        "trainer.max_critic_ckpt_to_keep": t.keep_last,
        "trainer.resume_mode": resume,
        "+trainer.agentrl_log_episodes": t.log_episodes,  # read by agentrl.verl.episodes
        # verl's own dump of every validation episode (text, reward, reward_extra_info), one
        # <step>.jsonl per validation; training episodes are sampled by agentrl.verl.episodes
        "trainer.validation_data_dir": str(config.run_dir / VALIDATION_DUMPS),
    }
    if resume == "resume_path":
        out["trainer.resume_from_path"] = str(Path(config.resume).resolve())
    return out


def _optimizer(prefix: str, lr: float, warmup: int, weight_decay: float, grad_clip: float
               ) -> dict[str, Any]:
    return {
        f"{prefix}.optim.lr": lr,
        f"{prefix}.optim.lr_warmup_steps": warmup,
        f"{prefix}.optim.weight_decay": weight_decay,
        f"{prefix}.optim.clip_grad": grad_clip,  # verl 0.9.1's engine workers read this one
    }


def _fsdp(prefix: str, engine: str, strategy: str, param_offload: bool, optimizer_offload: bool
          ) -> dict[str, Any]:
    return {
        f"{prefix}.strategy": strategy,
        f"{prefix}.{engine}.strategy": strategy,
        f"{prefix}.{engine}.param_offload": param_offload,
        f"{prefix}.{engine}.optimizer_offload": optimizer_offload,
    }


EXTERNAL_MODULES = "VERL_USE_EXTERNAL_MODULES"
WORKER_ENV = ("PYTHONPATH", "WANDB_MODE", "WANDB_DIR", "AGENTRL_CACHE", EXTERNAL_MODULES,
              returns.VALUE_CLIP_ENV, *constrained.launch_env())
"""Variables every Ray worker needs; a Ray cluster started before the launch (always so on
several nodes) would not inherit them, so they travel in Ray's ``runtime_env``."""


def _worker_env(config: TrainConfig) -> dict[str, Any]:
    env = launch_env(config)
    names = [*WORKER_ENV, *(_cpu_env() if on_cpu(config) else ())]
    return {worker_env_key(name): env[name] for name in names if env.get(name)}


def worker_env_key(name: str) -> str:
    """The override that sets variable ``name`` in every Ray worker (Ray's ``runtime_env``)."""
    return f"++ray_kwargs.ray_init.runtime_env.env_vars.{name}"


def _cpu_env() -> dict[str, str]:
    from agentrl.verl import cpu_platform

    return cpu_platform.launch_env()


def _chat_template(template: str) -> str:
    """A named template (chatml, llama3) as its Jinja text; a Jinja string as it is."""
    from agentrl.models.templates import CHAT_TEMPLATES

    return CHAT_TEMPLATES[template].jinja if template in CHAT_TEMPLATES else template


PLAIN_VALUE = re.compile(r"[A-Za-z_/~][\w./~:@%+-]*")
"""Strings hydra reads back unchanged without quotes (and that no other type claims)."""
HYDRA_WORDS = {"null", "true", "false", "nan", "inf"}


def hydra_value(value: Any) -> str:
    """``value`` in hydra's override grammar (quoted where a plain string would be misread)."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(item) for item in value) + "]"
    text = str(value)
    if PLAIN_VALUE.fullmatch(text) and text.lower() not in HYDRA_WORDS:
        return text
    # hydra's quoted strings: escape the quote, the backslashes right before a quote or the
    # end, and "${" (interpolation); every other backslash stays as written
    text = re.sub(r"(\\+)(?='|$)", lambda m: m[1] * 2, text)
    return "'" + text.replace("'", "\\'").replace("${", "\\${") + "'"


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


def launch_env(config: TrainConfig, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: this checkout importable, WandB's mode and folder."""
    from agentrl.trainers.tracking import resolve_wandb_mode

    env = dict(os.environ if base is None else base)
    paths = [str(PROJECT_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env["WANDB_MODE"] = resolve_wandb_mode(config.trainer.wandb_mode)
    env["WANDB_DIR"] = str(config.run_dir)
    if on_cpu(config):
        env.update(_cpu_env())
    elif any("env_vars.AGENTRL_VERL_SDPA=" in item for item in config.verl.overrides):
        env.update(_sdpa_env())                      # without_flash_attn's
    masked = [constrained.ENGINE_MODULE] if config.constrained_actions else []
    if masked:  # constrained actions: verl's actor and reference run the masked engine
        env.update(constrained.launch_env())
    env[EXTERNAL_MODULES] = external_modules(*env.get(EXTERNAL_MODULES, "").split(","), *masked)
    env[returns.VALUE_CLIP_ENV] = config.critic.value_clip_scale
    env.update(restart.run_mark(config.run_dir))  # every process of the launch: see restart
    return env


def external_modules(*modules: str) -> str:
    """``VERL_USE_EXTERNAL_MODULES``: ``modules``, then :mod:`agentrl.verl.returns` (verl imports
    each in every process it starts)."""
    return ",".join(dict.fromkeys(filter(None, [*modules, returns.__name__])))


def launch(config: TrainConfig, dry_run: bool = False) -> int:
    """Validate, then run verl's ``main_ppo`` (``dry_run``: print the verl config and the command
    instead); returns the exit status."""
    config, notes = preflight.fit(config)
    paths = task_paths(config)
    overrides = verl_overrides(config, paths)
    verl_config = compose_verl_config(overrides)
    constrained.check_verl_config(verl_config)
    preflight.check_dispatch(verl_config)
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
    _write_tiny_model(config)
    print(f"starting verl: {shlex.join(command[:3])} ... ({len(overrides)} overrides)", flush=True)
    command, env = _same_wandb_run(config, command, env)
    returncode = subprocess.run(command, env=env, check=False,
                                preexec_fn=restart.die_with_parent).returncode
    metrics = config.run_dir / METRICS_FILE  # our metrics, written by the AgentLoop's manager
    if config.trainer.plot and metrics.exists():
        references = reference_success(config.run_dir, list(config.val.presets),
                                       config.val.group_num)
        plot = plot_learning_curves(metrics, config.run_dir / "learning_curves.png",
                                    references=references)
        print(f"metrics: {metrics}\nlearning curves: {plot}", flush=True)
    return returncode


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


def _write_tiny_model(config: TrainConfig) -> None:
    """A tiny test model named in the config, written where :func:`model_path` points."""
    from agentrl.models.loading import TINY_MODELS, save_tiny_model

    folder = Path(model_path(config))
    if config.model.name in TINY_MODELS and not (folder / "tokenizer_config.json").exists():
        print(f"writing the {config.model.name} model into {folder}", flush=True)
        save_tiny_model(config.model.name, folder)


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
                for key, value in _sdpa_env().items()]
    return dataclasses.replace(config, verl=dataclasses.replace(
        config.verl, overrides=(*overrides, *env_vars)))


def _sdpa_env() -> dict[str, str]:
    from agentrl.verl import cpu_platform

    return {EXTERNAL_MODULES: external_modules(cpu_platform.__name__), cpu_platform.SDPA_ENV: "1"}


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
