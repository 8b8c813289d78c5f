"""What the verl backend refuses: the rules of a :class:`~agentrl.config.schema.TrainConfig`
that hold with ``backend=verl`` only.

Why a module of its own: the schema says what each key may be; these rules say what verl's
trainer cannot run, or would reject later (after Ray and the models start), and they change with
verl, not with the keys. :meth:`TrainConfig.__post_init__` calls :func:`check_verl`, so a config
that verl cannot run still fails at start-up, naming the key and what is allowed.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

LOCAL_ONLY_MODELS = re.compile(r"tiny(?!-vllm$)(-.+)?")
"""Names ``agentrl.models.load_model`` builds in-process: verl's workers cannot load them
(``tiny-vllm`` is written to a folder at launch, for ``hardware=cpu-verl``, and ``embedded`` is
its converted folder)."""


def check_verl(config: Any) -> None:
    """``ValueError`` naming the first key whose value verl cannot run, and what is allowed.
    ``config`` is a :class:`~agentrl.config.schema.TrainConfig` (not imported here: the schema
    imports this module, and the rules read its sections only)."""
    check_verl_model(config.model.name, config.verl.nnodes)
    _check_local_only_features(config)
    _check_history_windows(config)
    _check_cluster(config)


def check_verl_model(name: str, nnodes: int = 1) -> None:
    """verl's workers load the model themselves: a name only ``load_model`` builds fails, and
    the embedded model's converted folder is in this node's cache only."""
    if LOCAL_ONLY_MODELS.fullmatch(name) and not Path(name).exists():
        raise ValueError(f"model.name={name!r} is not allowed with backend='verl' (verl's workers "
                         "load the model themselves); allowed: a Hugging Face hub id or a local "
                         "model folder, e.g. model=qwen_halfb (model=tiny_vllm on a CPU)")
    if name == "embedded" and nnodes > 1 and not Path(name).exists():
        raise ValueError(f"model.name='embedded' is not allowed with verl.nnodes={nnodes}: its "
                         "converted folder is in this node's cache, which the other nodes cannot "
                         "read; allowed: a model folder on shared storage (copy "
                         "$AGENTRL_CACHE/models/embedded there) or a hub id")


def divisors(number: int) -> list[int]:
    """The allowed values of a key that must divide ``number``, for the error message."""
    return [d for d in range(1, number + 1) if number % d == 0]


def _check_local_only_features(config: Any) -> None:
    unsupported = {  # local-engine features that verl's trainer has no counterpart for
        "rollout.filter_ratio": (config.rollout.filter_ratio, 1.0),
        "rollout.norm_method": (config.rollout.norm_method, "identity"),
        "rollout.drop_uniform_groups": (config.rollout.drop_uniform_groups, False),
        "rollout.turn_branches": (config.rollout.turn_branches, 0),
        "algorithm.step_advantage_weight": (config.algorithm.step_advantage_weight, 0.0),
        "algorithm.lost_group_advantage": (config.algorithm.lost_group_advantage, 0.0),
        "algorithm.distance_shaping": (config.algorithm.distance_shaping, 0.0),
        "algorithm.skip_after_missed_moves": (config.algorithm.skip_after_missed_moves, False),
        "critic.share_backbone": (config.critic.share_backbone, False),
        "lora.dropout": (config.lora.dropout if config.lora.rank else 0.0, 0.0),
        "train.sft_steps": (config.train.sft_steps, 0),  # verl: `agentrl sft backend=verl`
        "actor.warm_optimizer": (config.actor.warm_optimizer, False),
        "actor.target_kl": (config.actor.target_kl, None),
        "critic.ppo_mini_batch_size": (config.critic.ppo_mini_batch_size, None),
        "critic.head_hidden": (config.critic.head_hidden, 0),  # verl's critic: its own head
        "critic.standardize_features": (config.critic.standardize_features, False),
        "critic.head_fit": (config.critic.head_fit, "gradient"),
        "critic.sibling_pseudocount": (config.critic.sibling_pseudocount, None),
        "sft.save_optimizer": (config.sft.save_optimizer, False),
        "trainer.early_stop_patience": (config.trainer.early_stop_patience or None, None),
        "trainer.early_stop_entropy": (config.trainer.early_stop_entropy, None),
    }
    for key, (value, allowed) in unsupported.items():
        if value != allowed:
            raise ValueError(f"{key}={value!r} is not allowed with backend='verl' (the local "
                             f"engine only); allowed: {allowed!r}")
    if config.algorithm.gamma_unit == "turn" and config.algorithm.lam != 1.0:
        raise ValueError(f"algorithm.lam={config.algorithm.lam} is not allowed with "
                         "algorithm.gamma_unit='turn' on backend='verl': verl's GAE discounts "
                         "per token, so the turn discount is carried by reshaped turn rewards, "
                         "exact only with lam 1; allowed: 1.0")


def _check_history_windows(config: Any) -> None:
    """Context windows need verl's V1 trainer (one row per window, :mod:`agentrl.verl.windows`)
    and returns that per-row GAE reproduces: λ 1, and γ 1 per token (a turn discount is
    carried by the reshaped turn rewards)."""
    windowed = sorted(name for name in dict.fromkeys(config.train.presets + config.val.presets)
                      if config.agents[name].windowed)
    if not windowed:
        return
    agent = config.agents[windowed[0]]
    first = (f"agents.{windowed[0]}.history_window={agent.history_window}"
             if agent.history_window else f"agents.{windowed[0]}.context={agent.context!r}")
    if config.verl.trainer != "v1":
        raise ValueError(f"{first} is not allowed with verl.trainer={config.verl.trainer!r}: a "
                         "reply must be trained on the context it was sampled from, which takes "
                         "one training row per context window, and verl's legacy trainer takes "
                         "one row per episode; allowed: verl.trainer=v1 (one row per window), "
                         "or history_window 0 (all turns; on verl the response budget, not a "
                         "dropped turn, ends a long episode)")
    a = config.algorithm
    if a.lam != 1.0:
        raise ValueError(f"algorithm.lam={a.lam} is not allowed with {first} on verl: verl's "
                         "V1 trainer runs GAE on each window's row alone, so only lam 1 gives "
                         "the whole episode's returns; allowed: 1.0")
    if a.use_kl_in_reward:
        raise ValueError(f"algorithm.use_kl_in_reward=True is not allowed with {first} on "
                         "verl: the penalty is subtracted per token inside each window's row, "
                         "and per-row GAE never carries a later row's back; allowed: False "
                         "(actor.use_kl_loss keeps a KL term in the loss)")
    if a.gamma_unit != "turn" and a.gamma != 1.0:
        raise ValueError(f"algorithm.gamma={a.gamma} is not allowed with {first} on verl and "
                         f"algorithm.gamma_unit={a.gamma_unit!r}: a token discount cannot reach "
                         "across windows' rows; allowed: 1.0, or algorithm.gamma_unit=turn")


def _check_cluster(config: Any) -> None:
    v, groups, size = config.verl, config.train.group_num, config.train.group_size
    if v.n_gpus_per_node % v.tensor_model_parallel_size:
        raise ValueError(f"verl.tensor_model_parallel_size={v.tensor_model_parallel_size} is "
                         f"not allowed: it must divide verl.n_gpus_per_node="
                         f"{v.n_gpus_per_node}; allowed: {divisors(v.n_gpus_per_node)}")
    gpus, batch = v.nnodes * v.n_gpus_per_node, groups * size
    if batch % gpus:
        raise ValueError(f"train.group_num * train.group_size = {batch} trajectories per step "
                         f"is not allowed on verl.nnodes * verl.n_gpus_per_node = {gpus} GPUs: "
                         f"every GPU takes the same share; allowed: a multiple of {gpus}")
    if v.trainer == "legacy" and batch % v.agent_workers:
        raise ValueError(f"verl.agent_workers={v.agent_workers} is not allowed: the legacy "
                         f"trainer (verl.trainer=legacy) splits the {batch} trajectories of a "
                         f"step evenly among them; allowed: one of {divisors(batch)}")
    mini = config.actor.ppo_mini_batch_size or batch
    if mini % size or mini % gpus:
        raise ValueError(f"actor.ppo_mini_batch_size={mini} is not allowed with "
                         f"backend='verl': verl updates on whole groups (train.group_size="
                         f"{size}) split evenly over {gpus} GPUs; allowed: null or a "
                         f"multiple of {math.lcm(size, gpus)} dividing {batch}")
