"""The rules between keys of a :class:`~agentrl.config.schema.TrainConfig` on every backend:
batch sizes that divide, the critic's head start, replies that fit the context.

Why a module of its own: the schema says what each key may be alone; these rules read several
sections at once (verl's own refusals are :mod:`agentrl.config.verl_rules`).
:meth:`TrainConfig.__post_init__` calls :func:`check_cross_keys`, so a config that breaks one
fails at start-up, naming the key and what is allowed.
"""

from __future__ import annotations

from typing import Any

from agentrl.config.verl_rules import divisors

__all__ = ["check_cross_keys"]


def check_cross_keys(config: Any) -> None:
    """``ValueError`` naming the first key that breaks a rule between sections, and what is
    allowed. ``config`` is a :class:`~agentrl.config.schema.TrainConfig` (not imported here:
    the schema imports this module)."""
    _check_batches(config)
    _check_critic(config)
    _check_token_budget(config)


def _check_critic(config: Any) -> None:
    if config.critic.head_fit == "ridge" and config.critic.head_hidden:
        raise ValueError(f"critic.head_hidden={config.critic.head_hidden} is not allowed with "
                         "critic.head_fit='ridge' (a closed-form fit is of a linear head); "
                         "allowed: 0, or head_fit='gradient'")
    # without GAE there is no critic: its keys, the CPU preset's sibling values included, are
    # unused, so the preset runs GRPO as it is
    algo = config.algorithm
    if (config.critic.sibling_pseudocount and algo.adv_estimator == "gae"
            and algo.gamma_unit == "token" and algo.gamma != 1.0):
        raise ValueError(f"critic.sibling_pseudocount={config.critic.sibling_pseudocount} is "
                         f"not allowed with algorithm.gamma={algo.gamma} per token (a sibling's "
                         "return is discounted by its own reply's length); allowed: null, "
                         "algorithm.gamma=1, or algorithm.gamma_unit='turn'")
    pretrain = config.critic.pretrain_steps
    if pretrain and config.algorithm.adv_estimator != "gae":
        raise ValueError(f"critic.pretrain_steps={pretrain} is not allowed with "
                         f"algorithm.adv_estimator={config.algorithm.adv_estimator!r} (no "
                         "critic to train); allowed: 0, or adv_estimator='gae'")
    most = config.train.total_steps - config.train.sft_steps - 1  # one actor update left
    if pretrain and pretrain > most:  # 0: nothing to leave room for (a warm start alone)
        raise ValueError(f"critic.pretrain_steps={pretrain} is not allowed: with "
                         f"train.sft_steps={config.train.sft_steps} it leaves no actor update "
                         f"in train.total_steps={config.train.total_steps}; allowed: an "
                         f"integer in [0, {max(0, most)}]")


def _check_batches(config: Any) -> None:
    if (config.algorithm.adv_estimator == "grpo" and config.train.group_size < 2
            and not config.rollout.turn_branches):
        raise ValueError(f"train.group_size={config.train.group_size} is not allowed with "
                         "algorithm.adv_estimator='grpo' (it compares the episodes of a "
                         "group); allowed: an integer >= 2, adv_estimator='gae', or "
                         "rollout.turn_branches >= 1 (it compares each turn's replies)")
    if config.algorithm.distance_shaping and config.rollout.reward_placement != "turn":
        raise ValueError(f"algorithm.distance_shaping={config.algorithm.distance_shaping} is "
                         "not allowed with rollout.reward_placement='last' (it shapes each "
                         "turn's reward); allowed: 0, or reward_placement='turn'")
    if config.algorithm.skip_after_missed_moves and config.rollout.turn_branches:
        raise ValueError("algorithm.skip_after_missed_moves=True is not allowed with "
                         f"rollout.turn_branches={config.rollout.turn_branches} (a turn's "
                         "reply group is one turn, with no move before it to judge); "
                         "allowed: false, or turn_branches=0")
    if config.algorithm.lost_group_advantage and config.rollout.turn_branches:
        raise ValueError(f"algorithm.lost_group_advantage={config.algorithm.lost_group_advantage} "
                         f"is not allowed with rollout.turn_branches="
                         f"{config.rollout.turn_branches} (a turn's reply group 'won' only "
                         "if a reply ended the game, so nearly every group would count as "
                         "lost); allowed: 0, or turn_branches=0")
    batch, mini = config.kept_trajectories, config.actor.ppo_mini_batch_size
    if mini is not None and batch % mini:
        raise ValueError(f"actor.ppo_mini_batch_size={mini} is not allowed: a step keeps "
                         f"{batch} trajectories (ceil(rollout.filter_ratio * "
                         f"train.group_num) * train.group_size); allowed: null or one of "
                         f"{divisors(batch)}")


def _check_token_budget(config: Any) -> None:
    budget = config.rollout.max_context_tokens
    for key, tokens in (("rollout.max_new_tokens", config.rollout.max_new_tokens),
                        ("val.max_new_tokens", config.val.max_new_tokens)):
        if tokens is not None and tokens >= budget:
            raise ValueError(f"rollout.max_context_tokens={budget} cannot hold a reply of "
                             f"{key}={tokens} with its prompt; allowed: "
                             f"rollout.max_context_tokens > {tokens} (with room for the first "
                             f"prompt), or {key} in [1, {budget - 1}]")
