"""Our config -> what verl's ``main_ppo`` is given: hydra overrides of its ``ppo_trainer``
config, and the environment of its processes.

    from agentrl.verl.overrides import task_paths, verl_overrides
    overrides = verl_overrides(config, task_paths(config))   # ["data.train_files=...", ...]

Why apart from :mod:`agentrl.verl.launch`: this is the mapping of our keys onto verl's, one
function per section of verl's config (the place to read when a key's meaning on verl is in
question); the launch composes it with verl's config, checks it and runs verl. ``verl.overrides``
(raw verl overrides) come last and win. Variables every Ray worker needs travel in Ray's
``runtime_env`` (:data:`WORKER_ENV`), since a cluster started before the launch does not
inherit the launcher's environment.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import agentrl
from agentrl.config import TrainConfig
from agentrl.verl import constrained, metrics, restart, returns
from agentrl.verl.data import TRAIN_FILE, VAL_FILE

__all__ = ["EXTERNAL_MODULES", "WORKER_ENV", "chat_template", "critic_token_budgets",
           "external_modules", "hydra_value", "launch_env", "micro_batch_per_gpu", "model_path",
           "on_cpu", "sdpa_env", "task_paths",
           "verl_overrides", "worker_env_key"]

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
    the folder ``tiny-vllm`` is written to at launch, the embedded model's converted folder
    (made at launch if missing), or a hub id."""
    from agentrl.models.common import cache_root
    from agentrl.models.loading import checkpoint_model_folder
    from agentrl.models.tiny import TINY_MODELS

    name = config.model.name
    folder = checkpoint_model_folder(Path(name).expanduser())  # an SFT checkpoint: its actor/
    if folder.is_dir():
        return str(folder.resolve())
    if name in TINY_MODELS:
        return str(cache_root() / f"{name}-hf")
    if name == "embedded":
        return str(cache_root() / "embedded")
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
        out["actor_rollout_ref.model.custom_chat_template"] = chat_template(model.chat_template)
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
        # + the whole model as a Hugging Face folder (global_step_N/actor/huggingface): what
        # `agentrl eval <run>` and `play --model <run>` load (agentrl.trainers.verl_checkpoints);
        # not with LoRA (verl would write the adapter-wrapped keys into a plain model's folder)
        f"{prefix}.checkpoint.save_contents": ["model", "optimizer", "extra",
                                               *([] if config.lora.rank else ["hf_model"])],
        # the reference model (built only with a KL term): forward passes only
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu":
            v.log_prob_micro_batch_size_per_gpu,
        "actor_rollout_ref.ref.fsdp_config.param_offload": v.param_offload,
    }


def critic_token_budgets(config: TrainConfig) -> tuple[int, int]:
    """The critic's token budgets per GPU: (``critic.ppo_max_token_len_per_gpu``,
    ``critic.ppo_infer_max_token_len_per_gpu``).

    verl 0.9.1's critic (an engine ``TrainingWorker``) always batches by tokens: its
    ``*micro_batch_size*`` keys are read by nobody. The legacy trainer bounds an update's
    micro-batch by ``ppo_max_token_len_per_gpu`` and the no-grad value forward by
    ``ppo_infer_max_token_len_per_gpu`` (``ray_trainer``: the engine's ``max_token_len_per_gpu``
    and ``infer_max_token_len_per_gpu``); the V1 trainer gives the engine
    ``ppo_infer_max_token_len_per_gpu`` for both (``v1/trainer_base``). An update's budget is
    the actor's micro-batch of whole-length trajectories, what the memory estimate counts
    (:mod:`agentrl.verl.preflight`); the no-grad one is the no-grad micro-batch's on the legacy
    trainer, and the update's on V1, where it bounds the updates too."""
    v = config.verl
    tokens = v.max_prompt_length + v.max_response_length
    update = micro_batch_per_gpu(config) * tokens
    return update, update if v.trainer == "v1" else v.log_prob_micro_batch_size_per_gpu * tokens


def _critic(config: TrainConfig) -> dict[str, Any]:
    """The critic's settings; its token budgets: :func:`critic_token_budgets`
    (``critic.yaml`` lacks ``ppo_infer_max_token_len_per_gpu``, hence ``++``; its
    ``forward_max_token_len_per_gpu`` is read by nobody)."""
    c, v = config.critic, config.verl
    update, no_grad = critic_token_budgets(config)
    out = {
        **_optimizer("critic", c.lr, c.warmup_steps, c.weight_decay, c.grad_clip),
        **_fsdp("critic", "fsdp", v.strategy, v.param_offload, v.optimizer_offload),
        "critic.cliprange_value": c.cliprange_value,
        "critic.use_dynamic_bsz": True,
        "critic.ppo_max_token_len_per_gpu": update,
        f"++{CRITIC_INFER_TOKENS}": no_grad,
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
        # + verl's file logger: its metrics reach metrics.jsonl (agentrl.verl.metrics)
        "trainer.logger": [*t.logger, "file"],
        "trainer.nnodes": v.nnodes,
        "trainer.n_gpus_per_node": v.n_gpus_per_node,
        "trainer.total_epochs": 1,                         # the task file holds every step's rows
        "trainer.total_training_steps": steps,
        "trainer.save_freq": t.save_freq or steps,         # verl also saves on the last step
        "trainer.test_freq": config.val.test_freq or -1,   # verl: -1 = never
        "trainer.val_before_train": config.val.before_train,
        # verl updates the actor from step critic_warmup on (its steps count from 1)
        "trainer.critic_warmup": (config.critic.pretrain_steps + 1
                                  if config.critic.pretrain_steps else 0),
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
              returns.VALUE_CLIP_ENV, metrics.VERL_LOG_ENV, *constrained.launch_env())
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


def chat_template(template: str) -> str:
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


# -- the environment of verl's processes ----------------------------------------------------------
def launch_env(config: TrainConfig, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: this checkout importable, WandB's mode, folder and service."""
    from agentrl.trainers.tracking import resolve_wandb_mode

    env = dict(os.environ if base is None else base)
    # the run owns its WandB service: a parent's (any wandb.init there sets WANDB_SERVICE) would
    # outlive a killed run and keep its run id "in use", refusing the resume
    env.pop("WANDB_SERVICE", None)
    paths = [str(PROJECT_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env["WANDB_MODE"] = resolve_wandb_mode(config.trainer.wandb_mode)
    env["WANDB_DIR"] = str(config.run_dir)
    env[metrics.VERL_LOG_ENV] = str(metrics.verl_log_path(config.run_dir))  # verl's file logger
    if on_cpu(config):
        env.update(_cpu_env())
    elif any("env_vars.AGENTRL_VERL_SDPA=" in item for item in config.verl.overrides):
        env.update(sdpa_env())                      # without_flash_attn's
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


def sdpa_env() -> dict[str, str]:
    from agentrl.verl import cpu_platform

    return {EXTERNAL_MODULES: external_modules(cpu_platform.__name__), cpu_platform.SDPA_ENV: "1"}
