"""The training configuration as frozen dataclasses, validated on construction.

    >>> from agentrl.config import build_config
    >>> config = build_config({"train": {"group_num": 2}, "actor": {"lr": 2e-5}})
    >>> config.train.group_num, config.actor.lr, config.rollout.filter_mode
    (2, 2e-05, 'std')
    >>> build_config(config.to_dict()) == config
    True

``configs/base.yaml`` documents every key next to its default; each field below repeats that
line as its docstring. Missing keys take the defaults written here, so a plain dict with a few
keys (as in tests) is a full config.

Why validate here and not in the trainer: a typo or a bad value must fail at start-up, naming
the key and what is allowed, before a model is loaded or a minute of rollouts is spent. Every
section checks its own fields in ``__post_init__`` (:class:`agentrl.config.fields.Section`:
types from the annotations, ranges from ``setting``), so ``dataclasses.replace`` cannot build
an invalid config either;
:class:`TrainConfig` then checks the rules that span sections (presets exist, GRPO needs groups
of two or more, mini-batches divide the batch, ...), and with ``backend=verl`` what verl cannot
run (:mod:`agentrl.config.verl_rules`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

from agentrl.agents.config import DEFAULT_PATH as DEFAULT_AGENTS_FILE
from agentrl.agents.config import AgentConfig, agent_presets_from_dict, check_env_kwargs
from agentrl.config.fields import (
    Section, at_least, build_section, non_empty, positive, setting, unit_interval,
)
from agentrl.config.rules import check_cross_keys
from agentrl.config.verl_rules import check_verl
from agentrl.envs.splits import SEED_RANGES

__all__ = [
    "ActorConfig", "AlgorithmConfig", "CriticConfig", "HardwareConfig", "LoraConfig",
    "ModelConfig", "RolloutConfig", "SftConfig", "TrainConfig", "TrainGroupsConfig",
    "TrainerConfig", "ValConfig", "VerlConfig", "build_config",
]

NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
"""``project`` and ``experiment`` become folder names under ``runs/``."""
MAX_LOG_EPISODES = 256
"""Cap of ``trainer.log_episodes``: episode records are a sample, never the whole batch."""
BUILTIN_POLICY_LOSS = "vanilla"
"""Known to be in verl's registry: the default config never pays for importing verl (~10 s)."""


# -- sections --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ModelConfig(Section):
    """Which model is trained (``configs/model/<name>.yaml`` presets set this section)."""

    KEY: ClassVar[str] = "model"
    name: str = setting("embedded", non_empty, "a name agentrl.models.load_model accepts: "
                        "embedded, tiny, tiny-<template>, a local folder or a hub id")
    """What ``agentrl.models.load_model`` loads: embedded|tiny|tiny-llama3|a folder|a hub id."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Compute dtype. The local trainer keeps float32 weights and runs its forward passes
    (sampling and training) under bfloat16 autocast; float16 is verl's only (it needs loss
    scaling). CPUs are fastest in float32."""
    chat_template: str | None = setting(
        None, lambda v: v in _chat_template_names() or "{{" in v or "{%" in v,
        "null (the tokenizer's own), a named template (chatml, llama3) or a Jinja string")
    """Replaces the tokenizer's chat template: null keeps it, a name or a Jinja string."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, more compute."""


def _chat_template_names() -> tuple[str, ...]:
    # Imported when a template is set: agentrl.models imports torch (seconds).
    from agentrl.models.templates import CHAT_TEMPLATES

    return tuple(CHAT_TEMPLATES)


@dataclasses.dataclass(frozen=True)
class LoraConfig(Section):
    """LoRA adapters (peft) in place of full fine-tuning."""

    KEY: ClassVar[str] = "lora"
    rank: int = setting(0, at_least(0), "an integer >= 0 (0 = LoRA off, full fine-tuning)")
    """Adapter rank; 0 turns LoRA off and trains every weight."""
    alpha: float = setting(32.0, positive, "a number > 0")
    """Scale of the adapters' update (``alpha / rank``)."""
    dropout: float = setting(0.0, lambda v: 0 <= v < 1, "a number in [0, 1)")
    """Dropout on the adapters' input."""
    target_modules: tuple[str, ...] = setting(("q_proj", "k_proj", "v_proj", "o_proj"),
                                              non_empty, "a non-empty list of module names")
    """Names of the linear layers that get adapters."""


@dataclasses.dataclass(frozen=True)
class TrainGroupsConfig(Section):
    """What one training step plays, and for how many steps."""

    KEY: ClassVar[str] = "train"
    presets: tuple[str, ...] = setting(("simpleSokobanAgent",), non_empty,
                                       "a non-empty list of agent presets")
    """Agent presets to train on; group ``g`` plays ``presets[g % len(presets)]``."""
    group_num: int = setting(4, at_least(1), "an integer >= 1")
    """Groups per step, each on a new training seed."""
    group_size: int = setting(4, at_least(1), "an integer >= 1")
    """Episodes per group: all play the same game (same preset and seed)."""
    total_steps: int = setting(10, at_least(1), "an integer >= 1")
    """Training steps (one rollout + one PPO update each; the warm start's steps count)."""
    pool: tuple[int, ...] = setting((), lambda v: all(s in SEED_RANGES["train"] for s in v),
                                    f"a list of training seeds (in {SEED_RANGES['train']})")
    """A fixed pool of training games (their seeds), played over and over: step ``s`` plays
    ``group_num`` of them in turn; empty = new games every step. A pool PPO must master is the
    test that it can learn at all (scripts/bench/pool.py)."""
    sft_steps: int = setting(0, at_least(0), "an integer >= 0")
    """The first N steps are supervised updates on oracle play (the ``sft`` section: one
    mini-batch of demonstrations each), a warm start inside the run; 0 = PPO from step 1."""

    def __post_init__(self):
        super().__post_init__()
        if self.sft_steps > self.total_steps:
            raise ValueError(f"train.sft_steps={self.sft_steps} is not allowed: it exceeds "
                             f"train.total_steps={self.total_steps}; allowed: an integer in "
                             f"[0, {self.total_steps}]")


@dataclasses.dataclass(frozen=True)
class ValConfig(Section):
    """Validation: greedy episodes on held-out seeds."""

    KEY: ClassVar[str] = "val"
    presets: tuple[str, ...] = setting(("simpleSokobanAgent",), non_empty,
                                       "a non-empty list of agent presets")
    """Agent presets to validate on (held-out twins such as largeSokobanAgent are welcome)."""
    group_num: int = setting(4, at_least(1), "an integer >= 1")
    """Held-out games per preset (the same validation seeds for every preset and run)."""
    group_size: int = setting(1, at_least(1), "an integer >= 1")
    """Episodes per validation seed (greedy decoding makes copies identical; keep 1)."""
    test_freq: int = setting(5, at_least(0), "an integer >= 0 (0 = never)")
    """Validate every this many steps (0 = never)."""
    before_train: bool = True
    """Validate once before the first step (the baseline of the learning curve)."""
    max_new_tokens: int | None = setting(None, at_least(1), "null or an integer >= 1")
    """Token limit of one validation reply; null = rollout.max_new_tokens."""


@dataclasses.dataclass(frozen=True)
class RolloutConfig(Section):
    """Sampling, batching and the post-processing of groups."""

    KEY: ClassVar[str] = "rollout"
    temperature: float = setting(1.0, at_least(0), "a number >= 0 (0 = greedy)")
    """Sampling temperature of training episodes (0 = greedy)."""
    top_p: float = setting(1.0, lambda v: 0 < v <= 1, "a number in (0, 1] (1 = off)")
    """Nucleus sampling mass (1 = off)."""
    top_k: int = setting(0, at_least(0), "an integer >= 0 (0 = off)")
    """Sample among the k most likely tokens (0 = off)."""
    max_new_tokens: int = setting(128, at_least(1), "an integer >= 1")
    """Token limit of one reply (a preset's max_response_tokens may lower it)."""
    max_context_tokens: int = setting(2048, at_least(2), "an integer >= 2")
    """Context budget of one generation: the oldest turns leave the prompt beyond it."""
    max_batch: int = setting(16, at_least(1), "an integer >= 1")
    """Most generation requests decoded together in one forward pass."""
    max_wait_ms: float = setting(5.0, at_least(0), "a number >= 0")
    """How long the batcher waits for more requests after the first arrives."""
    prefix_cache_tokens: int = setting(65536, at_least(0), "an integer >= 0")
    """Keys/values of finished replies kept so the next turn reads only its new tokens (0 = off)."""
    filter_ratio: float = setting(1.0, lambda v: 0 < v <= 1, "a number in (0, 1]")
    """Share of groups kept per step, ranked by return std (1 = keep all)."""
    filter_mode: Literal["std", "std_rev"] = "std"
    """Keep the highest-std groups (std) or the lowest (std_rev)."""
    drop_uniform_groups: bool = False
    """Then drop every group whose members all got the same return; a step with none left
    skips its update (local only)."""
    drop_uniform_outcome: Literal["any", "won", "lost"] = "any"
    """Which uniform groups ``drop_uniform_groups`` drops: any, only those that all won, or
    only those that all lost. Read only with ``drop_uniform_groups`` (local only), so verl,
    which refuses that key, accepts any value here and ignores it."""
    turn_branches: int = setting(0, at_least(0), "an integer >= 0")
    """Training episodes sample this many more replies at every turn, each played one action
    on a copy of the game, and PPO trains on every turn's replies as a group of their own (one-
    turn rows, compared with each other) instead of whole episodes; 0 = off (local only; a
    game whose state copies)."""
    grouping: Literal["state", "batch"] = "state"
    """Normalize returns within each group (state) or over the whole batch (batch)."""
    norm_method: Literal["identity", "mean_std", "asym_clip"] = "identity"
    """Return normalization: identity, mean_std, or mean_std clipped to [-1, 3] (asym_clip)."""
    reward_placement: Literal["turn", "last"] = "turn"
    """Each turn's reward on its last token (turn) or the episode's score at the end (last)."""
    constrained_actions: bool | None = None
    """Mask each reply to well-formed answers of the turn's valid actions (thinking stays
    free); null = on with backend=local, off with verl (true there: vLLM's sampler and verl's
    actor both masked, agentrl.verl.constrained; docs/TRAINING.md, "Constrained action
    decoding")."""


@dataclasses.dataclass(frozen=True)
class AlgorithmConfig(Section):
    """Advantages (verl's core_algos)."""

    KEY: ClassVar[str] = "algorithm"
    adv_estimator: Literal["gae", "grpo"] = "gae"
    """gae (with the critic) or grpo (group-relative, no critic; needs train.group_size >= 2)."""
    gamma: float = setting(1.0, unit_interval, "a number in [0, 1]")
    """Discount, in [0, 1], per gamma_unit."""
    gamma_unit: Literal["token", "turn"] = "token"
    """token (gamma per generated token, verl's GAE as is) | turn (gamma between turns, 1 within
    a reply; use it to discount; local engine only)."""
    lam: float = setting(1.0, unit_interval, "a number in [0, 1]")
    """GAE's lambda."""
    use_kl_in_reward: bool = False
    """Subtract ``kl_coef * KL(actor || reference)`` from the token rewards."""
    kl_coef: float = setting(0.001, at_least(0), "a number >= 0")
    """Weight of the in-reward KL penalty."""
    kl_penalty: Literal["kl", "abs", "mse", "low_var_kl", "k1", "k2", "k3"] = "low_var_kl"
    """KL estimator of the in-reward penalty (verl's names)."""
    norm_adv_by_std_in_grpo: bool = True
    """GRPO divides by the group's std (false: Dr. GRPO's mean-only centring)."""
    step_advantage_weight: float = setting(0.0, at_least(0), "a number >= 0")
    """GiGPO's step level: add this weight x each turn's advantage among the group's turns
    from the same board to the estimator's advantages (0 = off; local engine only)."""
    lost_group_advantage: float = setting(0.0, lambda v: math.isfinite(v) and v <= 0,
                                          "a finite number <= 0")
    """Added to the estimator's advantages (GAE's whitened) on every model token of a group no
    episode won: an explicit push away from what a failed game did (negative-sample
    reinforcement).
    A critic whose values know the game (``critic.sibling_pseudocount``) gives such a group
    no advantage, where a batch-wide baseline pushes it down; this keeps that push beside a
    critic that explains the returns (0 = off; local engine only)."""
    distance_shaping: float = setting(0.0, at_least(0), "a number >= 0")
    """Potential-based reward shaping by the game oracle's distance to the goal: each turn
    earns this weight x the actions it brought the goal nearer (0 = off; local engine only;
    a search per turn, for games whose oracle plans from any state)."""
    skip_after_missed_moves: bool = False
    """The actor's loss leaves out the replies of turns that follow a missed move (one that did
    not bring the game oracle's distance to the goal nearer): a context showing the previous
    move then never credits "move what you just moved" (agentrl.rollout.groups; the critic
    still learns them; local engine only; a search per turn, as distance_shaping)."""


@dataclasses.dataclass(frozen=True)
class ActorConfig(Section):
    """The policy's optimizer and PPO loss."""

    KEY: ClassVar[str] = "actor"
    lr: float = setting(1e-5, positive, "a number > 0")
    """AdamW learning rate (after warm-up)."""
    warmup_steps: int = setting(0, at_least(0), "an integer >= 0")
    """Steps of linear learning-rate warm-up."""
    weight_decay: float = setting(0.0, at_least(0), "a number >= 0")
    """AdamW weight decay."""
    grad_clip: float = setting(1.0, positive, "a number > 0")
    """Gradient-norm clip of each update."""
    ppo_epochs: int = setting(1, at_least(1), "an integer >= 1")
    """Passes over the batch per step."""
    ppo_mini_batch_size: int | None = setting(None, at_least(1), "null or an integer >= 1")
    """Trajectories per optimizer update, with all their rows (turns, context windows); must
    divide the kept batch (null = whole batch)."""
    micro_batch_size: int = setting(2, at_least(1), "an integer >= 1")
    """Rows per forward/backward pass (a trajectory is one row, or one a turn or context
    window; gradients accumulate over a mini-batch); the critic's too. On verl: per GPU, at
    most a GPU's share of a mini-batch (capped to it)."""
    shared_prefix_tokens: int = setting(32, at_least(0), "an integer >= 0 (0 = off)")
    """Local trainer: the leading tokens all rows of a micro-batch share (a group's first
    prompt) run once, when there are at least this many, and every row reads their keys and
    values; the same log-probs, values and gradients (agentrl.trainers.shared_prefix). Rows are
    ordered by prompt inside a mini-batch so a micro-batch holds a group. 0 = off. verl: unused."""
    clip_ratio_low: float = setting(0.2, lambda v: 0 < v < 1, "a number in (0, 1)")
    """PPO ratio clip below 1: ``1 - clip_ratio_low``."""
    clip_ratio_high: float = setting(0.28, positive, "a number > 0")
    """PPO ratio clip above 1: ``1 + clip_ratio_high`` (higher than low: DAPO's clip-higher)."""
    clip_ratio_c: float = setting(3.0, lambda v: v > 1, "a number > 1")
    """Dual-clip bound for negative advantages."""
    loss_agg_mode: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                           "seq-mean-token-sum-norm"] = "token-mean"
    """How token losses become one number (verl's names)."""
    policy_loss: str = setting(BUILTIN_POLICY_LOSS,
                               lambda v: v == BUILTIN_POLICY_LOSS or v in _policy_losses(),
                               "a name in verl's POLICY_LOSS_REGISTRY")
    """verl policy loss by registered name (vanilla = clipped PPO), or agentrl's
    ``self_imitation`` (:mod:`agentrl.trainers.losses`: the positive advantages alone)."""
    entropy_coeff: float = setting(0.0, at_least(0), "a number >= 0")
    """Weight of the entropy bonus."""
    use_kl_loss: bool = False
    """Add ``kl_loss_coef * KL(actor || reference)`` to the loss (GRPO style)."""
    kl_loss_coef: float = setting(0.001, at_least(0), "a number >= 0")
    """Weight of the KL loss."""
    kl_loss_type: Literal["kl", "abs", "mse", "low_var_kl", "k1", "k2", "k3"] = "low_var_kl"
    """KL estimator of the KL loss (verl's names)."""
    target_kl: float | None = setting(None, positive, "null or a number > 0")
    """Stop a step's passes at the first mini-batch whose approximate KL to the sampling policy
    (mean ``(r - 1) - log r`` over its choices) exceeds this, before that mini-batch's
    optimizer step (CleanRL's target_kl); ``actor/passes`` logs the passes that ran. null = off."""
    warm_optimizer: bool = False
    """Start AdamW from the warm start's moments (the run's own warm start, or the
    ``optimizer.pt`` of the ``agentrl sft`` checkpoint ``model.name`` names) instead of zeros:
    a fresh AdamW's first steps move every weight by about ``lr`` (agentrl.trainers.moments)."""


def _policy_losses() -> list[str]:
    # Imported for a name other than vanilla only: importing verl takes ~10 s.
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    import agentrl.trainers.losses  # noqa: F401  (registers agentrl's own)

    return sorted(POLICY_LOSS_REGISTRY)


@dataclasses.dataclass(frozen=True)
class CriticConfig(Section):
    """The value model (used by GAE only)."""

    KEY: ClassVar[str] = "critic"
    lr: float = setting(1e-5, positive, "a number > 0")
    """AdamW learning rate (after warm-up)."""
    warmup_steps: int = setting(0, at_least(0), "an integer >= 0")
    """Steps of linear learning-rate warm-up."""
    weight_decay: float = setting(0.0, at_least(0), "a number >= 0")
    """AdamW weight decay."""
    grad_clip: float = setting(1.0, positive, "a number > 0")
    """Gradient-norm clip of each update."""
    cliprange_value: float = setting(0.5, positive, "a number > 0")
    """Clip of the value update around the old values (in units of ``value_clip_scale``)."""
    value_clip_scale: Literal["returns", "absolute"] = "returns"
    """returns: the clip is ``cliprange_value * max(1, RMS of the step's returns)``, so returns
    of +-10 move the critic as fast as returns of +-1 (on verl too: agentrl.verl.returns);
    absolute: verl's own (return units)."""
    share_backbone: bool = False
    """Value head on the actor's backbone (saves a model's memory; the two losses interact)."""
    ppo_epochs: int | None = setting(None, at_least(1), "null or an integer >= 1")
    """Passes over the batch per step (null = actor.ppo_epochs)."""
    ppo_mini_batch_size: int | None = setting(None, at_least(1), "null or an integer >= 1")
    """Trajectories per critic optimizer update (null = actor.ppo_mini_batch_size); a head on
    the actor's backbone reads the rollout's features, so its passes cost next to nothing."""
    head_hidden: int = setting(0, at_least(0), "an integer >= 0 (0 = a linear head)")
    """Width of the value head's tanh hidden layer; 0 = a linear head."""
    standardize_features: bool = False
    """The value head reads each feature standardised by its running mean and variance over
    model tokens (agentrl.trainers.policy.FeatureStandardizer), not the raw hidden states."""
    head_fit: Literal["gradient", "ridge"] = "gradient"
    """How the value head learns. gradient: Adam steps on the value loss, with the backbone
    (``lr``, ``ppo_epochs``, the clip); ridge: each step refits a linear head on standardised
    features in closed form over the last ``fit_window`` steps' model tokens, its strength
    chosen by cross-validation over games (agentrl.trainers.value_fit); the backbone does not
    train, so pair it with ``share_backbone: true`` to hold no second copy (local engine)."""
    fit_window: int = setting(8, at_least(1), "an integer >= 1")
    """``head_fit: ridge``: PPO steps whose tokens the refit reads (a resumed run starts an
    empty window from the checkpoint's fit)."""
    sibling_pseudocount: float | None = setting(None, positive, "null or a number > 0")
    """Blend each turn's value with the mean return-to-go of its group's other episodes from the
    same board at the same turn: ``(n * their mean + k * critic) / (n + k)`` for ``n`` such
    turns, the critic counting as ``k`` = this many episodes (agentrl.trainers.sibling_values);
    null = the critic's values alone. The critic still learns from GAE's returns (at
    ``algorithm.lam: 1`` the episodes' own)."""
    pretrain_steps: int = setting(0, at_least(0), "an integer >= 0")
    """The first N PPO steps (after the warm start) update the critic only: the actor's first
    update then reads values fitted to its own returns, not a new value head's guesses (verl's
    ``trainer.critic_warmup``, which counts N + 1)."""


@dataclasses.dataclass(frozen=True)
class TrainerConfig(Section):
    """Checkpoints and logging."""

    KEY: ClassVar[str] = "trainer"
    save_freq: int = setting(5, at_least(0), "an integer >= 0 (0 = only at the end)")
    """Checkpoint every this many steps (0 = only at the end; the end always saves)."""
    keep_last: int = setting(2, at_least(1), "an integer >= 1")
    """Newest checkpoints kept; older ones are deleted."""
    logger: tuple[Literal["console", "wandb"], ...] = setting(
        ("console", "wandb"), lambda v: len(set(v)) == len(v),
        "a list of distinct names from ['console', 'wandb']")
    """Where metrics go besides the run's metrics.jsonl (always written)."""
    wandb_mode: Literal["offline", "online", "disabled"] | None = None
    """null = offline unless WANDB_API_KEY is set (then online)."""
    plot: bool = True
    """Write the learning-curve PNG at the end of the run."""
    log_episodes: int = setting(4, lambda v: 0 <= v <= MAX_LOG_EPISODES,
                                f"an integer from 0 to {MAX_LOG_EPISODES} (0 = none)")
    """Finished episodes recorded per step and split in <run_dir>/episodes/step_N.jsonl (and a
    WandB table): per turn the observation, the reply, the actions, the reward, the flags."""
    early_stop_patience: int | None = setting(None, at_least(0),
                                              "null or an integer >= 0 (null or 0 = off)")
    """Stop after this many validations of PPO steps without a gain in held-out success over
    the best so far (the run keeps its best checkpoint either way; null or 0 = off)."""
    early_stop_entropy: float | None = setting(None, lambda v: math.isfinite(v) and v >= 0,
                                               "null or a number >= 0 (nats)")
    """Stop after a PPO step whose ``actor/entropy`` (mean nats per trained token) is below
    this: a collapsed policy samples one reply and learns nothing more (null = off)."""


@dataclasses.dataclass(frozen=True)
class HardwareConfig(Section):
    """Which hardware preset (``configs/hardware/<name>.yaml``) the run was composed with."""

    KEY: ClassVar[str] = "hardware"
    name: str = setting("cpu", non_empty, "a non-empty string")
    """The preset's name, recorded for logs (the preset sets keys in the other sections)."""
    gpu_memory_gb: float | None = setting(None, lambda v: v is None or v > 0,
                                          "null or a number > 0")
    """Memory of one GPU in GB (10^9 bytes), which the verl preflight fits the run into; null =
    unknown (on the CPU: the machine's memory). The scripts set it from nvidia-smi."""


@dataclasses.dataclass(frozen=True)
class SftConfig(Section):
    """``agentrl sft``: the supervised warm start on oracle play (agentrl/trainers/sft.py)."""

    KEY: ClassVar[str] = "sft"
    presets: tuple[str, ...] = ()
    """Agent presets the oracle plays (empty = train.presets); episode i plays presets[i % n]."""
    episodes: int = setting(64, at_least(1), "an integer >= 1")
    """Demonstration episodes, each on its own training seed (a function of ``seed`` and the
    episode's index: another run seed plays other games)."""
    epochs: int = setting(3, at_least(1), "an integer >= 1")
    """Passes over the demonstrations."""
    lr: float = setting(1e-4, positive, "a number > 0")
    """AdamW learning rate (constant)."""
    weight_decay: float = setting(0.0, at_least(0), "a number >= 0")
    """AdamW weight decay."""
    grad_clip: float = setting(1.0, positive, "a number > 0")
    """Gradient-norm clip of each update."""
    mini_batch_size: int = setting(8, at_least(1), "an integer >= 1")
    """Demonstrations (episodes) per optimizer update, each with all its context-window rows;
    the loss is the token mean over all of them, and an epoch trains every row once."""
    micro_batch_size: int = setting(2, at_least(1), "an integer >= 1")
    """Rows per forward/backward pass (locally one row per context window, so an episode whose
    older turns left the context is several; verl: whole episodes per GPU); gradients add up
    over a mini-batch exactly."""
    random_action_share: float = setting(0.0, unit_interval, "a number in [0, 1]")
    """Share of turns answered with random legal actions (not learned) so the oracle's
    replanning shows recoveries; local backend only."""
    flawed_first_move: bool = False
    """A flawed teacher: every demonstration opens with a random legal move that is learned
    (not masked out), and the oracle plays on from the board it left
    (scripts/bench/flawed_teacher.py); local backend only."""
    evaluate: bool = True
    """Greedy held-out evaluation (val.presets, val.group_num games) before and after."""
    save_optimizer: bool = False
    """Save AdamW's moments with the checkpoint (``optimizer.pt``, twice the model's size), so
    PPO can start from them (``actor.warm_optimizer``)."""
    output_dir: Path | None = None
    """Where the checkpoint goes (null = <run_dir>/sft); `agentrl train model=<checkpoint>`."""


@dataclasses.dataclass(frozen=True)
class VerlConfig(Section):
    """The verl backend's cluster, memory and sequence settings (read with ``backend=verl`` only).

    The hardware presets set them (``configs/hardware/{a100,h100,l40,cpu-verl}.yaml``, loosened
    for smaller models by ``configs/sizing/``); docs/HARDWARE.md gives the memory arithmetic.
    Rows per forward/backward come from ``actor.micro_batch_size`` (per GPU here).
    """

    KEY: ClassVar[str] = "verl"
    nnodes: int = setting(1, at_least(1), "an integer >= 1")
    """Nodes of the Ray cluster (more than one: ``ray start`` on each node first)."""
    n_gpus_per_node: int = setting(8, at_least(1), "an integer >= 1")
    """GPUs used on each node."""
    trainer: Literal["legacy", "v1"] = "legacy"
    """verl's trainer: legacy (RayPPOTrainer) or v1 (needs the TransferQueue package)."""
    strategy: Literal["fsdp", "fsdp2"] = "fsdp"
    """FSDP version of the actor and critic workers."""
    tensor_model_parallel_size: int = setting(1, at_least(1), "an integer >= 1")
    """GPUs per vLLM replica (tensor parallel); divides n_gpus_per_node."""
    gpu_memory_utilization: float = setting(0.5, lambda v: 0 < v < 1, "a number in (0, 1)")
    """Share of each GPU's memory vLLM takes for its weights and KV cache during rollouts."""
    param_offload: bool = False
    """Keep the actor's and critic's FSDP parameters in CPU memory when not computing."""
    optimizer_offload: bool = False
    """Keep the Adam states in CPU memory between updates."""
    log_prob_micro_batch_size_per_gpu: int = setting(4, at_least(1), "an integer >= 1")
    """Trajectories per GPU in one no-grad forward (old log-probs, reference, values)."""
    max_prompt_length: int = setting(1024, at_least(1), "an integer >= 1")
    """Tokens of an episode's first prompt (verl cuts longer ones from the left)."""
    max_response_length: int = setting(4096, at_least(1), "an integer >= 1")
    """Tokens after the first prompt: every reply and observation of an episode."""
    agent_workers: int = setting(8, at_least(1), "an integer >= 1")
    """Ray actors that run episodes, each many at once (legacy: divides the batch)."""
    overrides: tuple[str, ...] = setting(
        (), lambda v: all(re.fullmatch(r"[+~]{0,2}[A-Za-z_][\w.@/-]*=.*", o) for o in v),
        "a list of hydra overrides of verl's ppo_trainer config, each 'key=value'")
    """Raw overrides of verl's ppo_trainer config, applied last (what the keys above lack)."""


# -- the whole config ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class TrainConfig(Section):
    """A training run. ``agents`` holds the validated presets; treat it as read-only."""

    backend: Literal["local", "verl"] = "local"
    """Trainer: local (one process, CPU or one GPU) or verl (Ray, FSDP, vLLM)."""
    project: str = setting("agentrl", NAME_PATTERN.fullmatch,
                           "letters, digits, '_', '.', '-' (a folder name)")
    """Project name: WandB project and the first folder under runs/."""
    experiment: str = setting("quick", NAME_PATTERN.fullmatch,
                              "letters, digits, '_', '.', '-' (a folder name)")
    """Experiment name: the run's folder and the prefix of its run id."""
    run_dir: Path | None = None
    """Where the run writes (null = runs/<project>/<experiment>, relative to the working dir);
    always an absolute Path after construction."""
    resume: str = setting("auto", lambda v: v in ("auto", "never") or Path(v).is_dir(),
                          "'auto', 'never' or an existing checkpoint folder")
    """auto: continue from the newest checkpoint in run_dir if any; never; or a checkpoint."""
    resume_config_changes: Literal["refuse", "allow"] = "refuse"
    """A resume whose config differs from the checkpoint's in a key that changes training:
    refuse (name the keys and stop) or allow (log them and go on)."""
    seed: int = setting(0, at_least(0), "an integer >= 0")
    """Seeds sampling, shuffling and the choice of training games."""
    agents_file: Path | None = None
    """Agent presets file read when the config has no ``agents`` section (null =
    configs/agents.yaml); ``compose_config`` reads it in place of the composed one."""
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    """cpu, cuda, or auto (cuda when available)."""
    threads: int = setting(0, at_least(0), "an integer >= 0 (0 = torch's default)")
    """torch intra-op threads (0 = torch's default, one per core)."""
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """Which model is trained (configs/model presets set it)."""
    lora: LoraConfig = dataclasses.field(default_factory=LoraConfig)
    """LoRA adapters instead of full fine-tuning."""
    train: TrainGroupsConfig = dataclasses.field(default_factory=TrainGroupsConfig)
    """What a training step plays, and how many steps."""
    val: ValConfig = dataclasses.field(default_factory=ValConfig)
    """Greedy validation on held-out seeds."""
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    """Sampling, batching and the post-processing of groups."""
    algorithm: AlgorithmConfig = dataclasses.field(default_factory=AlgorithmConfig)
    """Advantages (verl's core_algos)."""
    actor: ActorConfig = dataclasses.field(default_factory=ActorConfig)
    """The policy's optimizer and PPO loss."""
    critic: CriticConfig = dataclasses.field(default_factory=CriticConfig)
    """The value model (GAE only)."""
    trainer: TrainerConfig = dataclasses.field(default_factory=TrainerConfig)
    """Checkpoints and logging."""
    hardware: HardwareConfig = dataclasses.field(default_factory=HardwareConfig)
    """Which hardware preset composed the run."""
    verl: VerlConfig = dataclasses.field(default_factory=VerlConfig)
    """The verl backend's cluster, memory and sequence settings."""
    sft: SftConfig = dataclasses.field(default_factory=SftConfig)
    """``agentrl sft``: the supervised warm start on oracle play."""
    agents: Mapping[str, AgentConfig] | None = None
    """Agent presets by name (``configs/agents.yaml``, composed by base.yaml, so
    ``agents.<preset>.<key>=value`` overrides work); null reads ``agents_file``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "agents", self._load_agents())
        run_dir = self.run_dir or Path("runs") / self.project / self.experiment
        object.__setattr__(self, "run_dir", Path.cwd() / run_dir.expanduser())
        if self.agents_file is not None:
            object.__setattr__(self, "agents_file", Path.cwd() / self.agents_file.expanduser())
        self._check_presets()
        self._check_sft()
        self._check_early_stop()
        check_cross_keys(self)
        if self.backend == "verl":
            check_verl(self)
        elif self.model.dtype == "float16":
            raise ValueError("model.dtype='float16' is not allowed with backend='local' (float16 "
                             "training needs loss scaling, which the local trainer does not do); "
                             "allowed: 'float32' or 'bfloat16' (float32 weights, bf16 autocast)")

    @property
    def constrained_actions(self) -> bool:
        """``rollout.constrained_actions`` resolved: null means on for the local engine."""
        setting = self.rollout.constrained_actions
        return self.backend == "local" if setting is None else setting

    @property
    def kept_trajectories(self) -> int:
        """Trajectories per training step after filtering: the PPO batch."""
        kept_groups = max(1, math.ceil(self.rollout.filter_ratio * self.train.group_num))
        return kept_groups * self.train.group_size

    def playing_presets(self, names: Iterable[str], max_new_tokens: int
                        ) -> list[tuple[str, AgentConfig]]:
        """The presets ``names`` as episodes play them: the run's reply limit folded into
        ``max_response_tokens``, so the limit the prompt states is the one that cuts replies
        (the same on both backends)."""
        return [(name, dataclasses.replace(self.agents[name], max_response_tokens=min(
            self.agents[name].max_response_tokens, max_new_tokens))) for name in names]

    def _load_agents(self) -> dict[str, AgentConfig]:
        raw = self.agents
        if raw is None:
            from omegaconf import OmegaConf

            path = DEFAULT_AGENTS_FILE if self.agents_file is None else self.agents_file
            if not path.is_file():
                raise ValueError(f"agents_file={str(path)!r} is not allowed; allowed: null "
                                 "(configs/agents.yaml) or an existing agent presets file")
            return agent_presets_from_dict(OmegaConf.load(path), source=str(path),
                                           check_envs=False)
        if isinstance(raw, Mapping) and all(isinstance(v, AgentConfig) for v in raw.values()):
            return dict(raw)
        return agent_presets_from_dict(raw, source="agents", check_envs=False)

    @property
    def sft_presets(self) -> tuple[str, ...]:
        """The presets the oracle plays for ``agentrl sft`` (``sft.presets`` or train's)."""
        return self.sft.presets or self.train.presets

    def _check_presets(self) -> None:
        for section in (self.train, self.val, self.sft):
            unknown = [name for name in section.presets if name not in self.agents]
            if unknown:
                raise ValueError(f"{section.KEY}.presets: unknown agent preset(s) {unknown}; "
                                 f"allowed: {list(self.agents)}")
        for name in dict.fromkeys(self.train.presets + self.val.presets + self.sft.presets):
            check_env_kwargs(self.agents[name], f"agents.{name}")

    def _check_sft(self) -> None:
        sft = self.sft
        if sft.micro_batch_size > sft.mini_batch_size:
            raise ValueError(f"sft.micro_batch_size={sft.micro_batch_size} is not allowed: it "
                             f"exceeds sft.mini_batch_size={sft.mini_batch_size}; allowed: an "
                             f"integer in [1, {sft.mini_batch_size}]")
        if sft.flawed_first_move and self.backend == "verl":
            raise ValueError("sft.flawed_first_move=true is not allowed with backend=verl: "
                             "verl's SFT data plays the oracle alone; allowed: false, or "
                             "backend=local")
        if sft.output_dir is not None:
            object.__setattr__(sft, "output_dir", Path.cwd() / sft.output_dir.expanduser())
        if self.lora.rank and (sft.save_optimizer or self.actor.warm_optimizer):
            key = "sft.save_optimizer" if sft.save_optimizer else "actor.warm_optimizer"
            raise ValueError(f"{key}=true is not allowed with lora.rank={self.lora.rank}: the "
                             "warm start merges its adapter into the weights, so its moments "
                             "belong to no parameter PPO trains; allowed: false, or lora.rank=0")

    def _check_early_stop(self) -> None:
        patience = self.trainer.early_stop_patience
        if patience and not self.val.test_freq:
            raise ValueError(f"trainer.early_stop_patience={patience} is not allowed with "
                             "val.test_freq=0: it counts validations; allowed: null or 0, or "
                             "val.test_freq >= 1")


def build_config(data: Mapping[str, Any]) -> TrainConfig:
    """A validated :class:`TrainConfig` from a plain mapping (composed YAML, ``to_dict()``).

    Unknown keys fail with the allowed ones; missing keys take their defaults.
    """
    return build_section(TrainConfig, data, "")
