"""Before Ray starts: will verl's dispatch accept this run, and does it fit the GPUs?

    from agentrl.verl.preflight import fit, check_dispatch
    config, notes = fit(config)                  # micro-batches made divisors, memory fitted
    check_dispatch(verl_config)                  # verl's own arithmetic on the composed config

``verl.utils.config.validate_config`` (what ``--dry-run`` ran) leaves out the divisions verl 0.9.1
asserts only when a batch reaches the workers, after minutes of start-up and the first
rollout. :func:`check_dispatch` repeats them, each with the line of verl it mirrors:

- the step's ``train_batch_size * rollout.n`` trajectories split evenly over the data-parallel
  ranks (``DataProto.chunk``) and over the agent-loop workers (``AgentLoopManager``, legacy);
- each rank's share in whole no-grad micro-batches (``rollout.log_prob_micro_batch_size_per_gpu``,
  and the reference's: ``workers/engine/utils.prepare_micro_batches``). On the V1 trainer with a
  windowed training preset a step's row count is known only after its rollout (one row per
  context window): V1 pads the rows to a multiple of lcm(dp, the critic's and the actor's
  mini-batch rows) (``v1/trainer_base._get_required_batch_multiple``) and gives every rank an
  equal part, so a rank's share is some multiple of that lcm ÷ dp (:func:`v1_rank_rows`), and a
  no-grad micro-batch must divide the unit itself;
- the mini-batch (``ppo_mini_batch_size * rollout.n``) over the ranks
  (``engine_workers.train_mini_batch``), a rank's share of the batch in whole mini-batches
  (``tensordict_utils.make_iterator``) and a rank's mini-batch in whole micro-batches;
- the critic, which batches by tokens: ``critic.ppo_max_token_len_per_gpu`` and
  ``ppo_infer_max_token_len_per_gpu`` (the no-grad forward's; ``forward_max_token_len_per_gpu``
  is read by nobody in 0.9.1) at least one whole trajectory
  (``seqlen_balancing.rearrange_micro_batches``); vLLM replicas of ``tensor_model_parallel_size``
  GPUs tile a node.

:func:`fit` adapts what is safe to adapt (a smaller micro-batch only costs speed): micro-batches
become the largest divisor of a GPU's share not above the asked size; then, against the card's
memory (:func:`estimate_memory`, docs/HARDWARE.md's arithmetic), micro-batches shrink and the
Adam states move to CPU memory until the estimate fits. What cannot be adapted is refused with
the key and the fix.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

from agentrl.config import TrainConfig

__all__ = ["CUDA_GRAPH_GB", "GB", "MODEL_SIZES", "ModelSize", "MemoryEstimate",
           "card_memory_gb", "check_dispatch", "critic_update_tokens", "describe",
           "estimate_memory", "fit", "largest_divisor", "rows_vary", "v1_rank_rows"]

GB = 1e9
MARGIN_GB = 4.0
"""Per GPU: CUDA context, NCCL buffers, allocator fragmentation (docs/HARDWARE.md)."""
VLLM_OVERHEAD_GB = 3.0
"""vLLM's activations and CUDA graphs beside its weights and KV cache."""
CUDA_GRAPH_GB = 2.0
"""Per GPU: vLLM's captured CUDA graphs, which stay resident while vLLM sleeps through the
no-grad forwards and the updates (verl's ``rollout.yaml``: they "can not be offloaded during
update policy"; vLLM's sleep frees only its weights and KV cache). vLLM logs the real size at
start-up ("Graph capturing finished ... took N GiB"): 0.5-3.5 GiB reported across models and
capture sizes; ``rollout.enforce_eager=true`` captures none."""


@dataclasses.dataclass(frozen=True)
class ModelSize:
    """What the memory estimate needs of a model (docs/HARDWARE.md)."""

    actor_params: float
    critic_params: float
    """The critic: the actor's backbone with a one-output head instead of the LM head."""
    vocab: int
    layers: int
    hidden: int
    intermediate: int

    def activation_bytes_per_token(self) -> float:
        """With gradient checkpointing: one bf16 hidden state per layer, plus one layer's
        working set."""
        return self.layers * self.hidden * 2 + 16 * self.hidden + 6 * self.intermediate

    def train_bytes_per_token(self) -> float:
        """The actor's update: logits in fp32 and bf16 with their gradients, and the
        activations."""
        return self.vocab * 16 + self.activation_bytes_per_token()

    def critic_train_bytes_per_token(self) -> float:
        """The critic's update: the activations (its head has one output, no logits)."""
        return self.activation_bytes_per_token()

    def infer_bytes_per_token(self) -> float:
        """A no-grad forward: the logits and their log-softmax."""
        return self.vocab * 10


MODEL_SIZES = {
    "Qwen/Qwen2.5-0.5B-Instruct": ModelSize(0.494e9, 0.494e9, 151_936, 24, 896, 4_864),
    "Qwen/Qwen2.5-3B-Instruct": ModelSize(3.09e9, 3.09e9, 151_936, 36, 2_048, 11_008),
    "Qwen/Qwen2.5-7B-Instruct": ModelSize(7.62e9, 7.07e9, 152_064, 28, 3_584, 18_944),
}
"""The model presets' models; others get no memory estimate (the preflight says so)."""


def largest_divisor(number: int, at_most: int) -> int:
    """The largest divisor of ``number`` that is at most ``at_most`` (at least 1)."""
    return max(d for d in range(1, max(1, min(number, at_most)) + 1) if number % d == 0)


def card_memory_gb(config: TrainConfig) -> float | None:
    """Memory of one GPU: the preset's ``hardware.gpu_memory_gb``; on the CPU, the machine's."""
    if config.hardware.gpu_memory_gb:
        return config.hardware.gpu_memory_gb
    if config.device == "cpu":
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / GB
    return None


# -- memory ----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Peak GB per GPU in each phase of a step."""

    update: float
    """The actor's update."""
    no_grad: float
    """The no-grad forwards: old log-probs, reference, values."""
    rollout: float
    critic: float = 0.0
    """The critic's update."""

    @property
    def peak(self) -> float:
        return max(self.update, self.critic, self.no_grad, self.rollout)

    def describe(self) -> str:
        return (f"{self.peak:.1f} GB per GPU at the peak (actor update {self.update:.1f}, "
                f"critic update {self.critic:.1f}, no-grad forwards {self.no_grad:.1f}, "
                f"rollout {self.rollout:.1f})")


def critic_update_tokens(config: TrainConfig) -> int:
    """The tokens of one critic update micro-batch per GPU, as the trainer reads its budget:
    the legacy trainer ``critic.ppo_max_token_len_per_gpu``, V1
    ``critic.ppo_infer_max_token_len_per_gpu``
    (:func:`agentrl.verl.overrides.critic_token_budgets`)."""
    from agentrl.verl.overrides import critic_token_budgets

    update, no_grad = critic_token_budgets(config)
    return no_grad if config.verl.trainer == "v1" else update


def estimate_memory(config: TrainConfig, card_gb: float) -> MemoryEstimate | None:
    """docs/HARDWARE.md's per-GPU arithmetic for ``config`` (None: a model it has no sizes of).
    Outside the rollout vLLM sleeps, but its CUDA graphs stay (:data:`CUDA_GRAPH_GB`)."""
    size = MODEL_SIZES.get(config.model.name)
    if size is None:
        return None
    v = config.verl
    gpus = v.nnodes * v.n_gpus_per_node
    both = size.actor_params + size.critic_params
    resident = (4 if v.optimizer_offload else 16) * both / gpus / GB
    # offloaded: fp32 weights stay; a model's gradients and Adam states come back for its update
    actor_state, critic_state = ((resident + 12 * params / gpus / GB if v.optimizer_offload
                                  else resident)
                                 for params in (size.actor_params, size.critic_params))
    beside = MARGIN_GB + CUDA_GRAPH_GB
    tokens = v.max_prompt_length + v.max_response_length
    update = actor_state + _train_micro(config) * tokens * size.train_bytes_per_token() / GB
    critic = critic_state + critic_update_tokens(config) * size.critic_train_bytes_per_token() / GB
    no_grad = (resident + v.log_prob_micro_batch_size_per_gpu * tokens
               * size.infer_bytes_per_token() / GB)
    rollout = resident + v.gpu_memory_utilization * card_gb + MARGIN_GB
    return MemoryEstimate(update + beside, no_grad + beside, rollout, critic + beside)


# -- fit: adapt what is safe -----------------------------------------------------------------------
def _shares(config: TrainConfig) -> tuple[int, int, int]:
    """(GPUs, trajectories per GPU per step, trajectories per GPU per mini-batch)."""
    gpus = config.verl.nnodes * config.verl.n_gpus_per_node
    batch = config.train.group_num * config.train.group_size
    mini = config.actor.ppo_mini_batch_size or batch
    return gpus, max(1, batch // gpus), max(1, mini // gpus)


def rows_vary(config: TrainConfig) -> bool:
    """A step's row count is known only after its rollout: verl's V1 trainer with a windowed
    training preset (one row per context window, :mod:`agentrl.verl.windows`)."""
    return config.verl.trainer == "v1" and any(config.agents[name].windowed
                                               for name in config.train.presets)


def v1_rank_rows(dp: int, n: int, actor_mini: int, critic_mini: int, use_critic: bool,
                 critic_warmup: int) -> int:
    """The rows of which every rank's share of a V1 step is a whole multiple, whatever the
    step's row count. verl 0.9.1's V1 pads a step's rows to a multiple of
    ``_get_required_batch_multiple(dp)``: lcm(dp, the critic's mini-batch rows), and the
    actor's too from step ``trainer.critic_warmup`` on (its steps count from 1), then splits
    them equally over the ``dp`` ranks (``_balance_batch``). Mini-batches count groups of
    ``n`` rows (``ppo_mini_batch_size * rollout.n``)."""
    warm = math.lcm(dp, critic_mini * n) if use_critic else dp
    full = math.lcm(warm, actor_mini * n)
    return (warm if critic_warmup > 1 else full) // dp   # warm divides full


def _no_grad_rows(config: TrainConfig) -> int:
    """The rows a GPU's no-grad micro-batches must split: its share of a step, or, where a
    step's row count varies (:func:`rows_vary`), V1's unit of a rank's share."""
    gpus, share, _ = _shares(config)
    if not rows_vary(config):
        return share
    groups = (config.actor.ppo_mini_batch_size
              or config.train.group_num * config.train.group_size) // config.train.group_size
    warmup = config.critic.pretrain_steps + 1 if config.critic.pretrain_steps else 0
    return v1_rank_rows(gpus, config.train.group_size, groups, groups,
                        config.algorithm.adv_estimator == "gae", warmup)


def _train_micro(config: TrainConfig) -> int:
    """The actor's micro-batch per GPU as launched: a divisor of a GPU's mini-batch share."""
    _, _, mini_share = _shares(config)
    return largest_divisor(mini_share, config.actor.micro_batch_size)


def fit(config: TrainConfig) -> tuple[TrainConfig, list[str]]:
    """``config`` with its micro-batches made to divide a GPU's share and its memory fitted to the
    card; the notes say what changed. ValueError (key and fix) where nothing safe fits."""
    notes: list[str] = []
    gpus, share, mini_share = _shares(config)
    actor, verl = config.actor, config.verl
    micro = largest_divisor(mini_share, actor.micro_batch_size)
    if micro != actor.micro_batch_size:
        notes.append(f"actor.micro_batch_size {actor.micro_batch_size} -> {micro}: a GPU's "
                     f"mini-batch share is {mini_share} trajectories and verl splits it into "
                     "whole micro-batches")
        actor = dataclasses.replace(actor, micro_batch_size=micro)
    rows = _no_grad_rows(config)
    log_prob = largest_divisor(rows, verl.log_prob_micro_batch_size_per_gpu)
    if log_prob != verl.log_prob_micro_batch_size_per_gpu:
        why = (f"a GPU gets {share} trajectories per step" if not rows_vary(config) else
               f"with context windows on verl.trainer=v1 a GPU gets a multiple of {rows} rows "
               "per step (verl pads a step's rows to whole mini-batches over the GPUs)")
        notes.append(f"verl.log_prob_micro_batch_size_per_gpu "
                     f"{verl.log_prob_micro_batch_size_per_gpu} -> {log_prob}: {why}, split "
                     "into whole no-grad micro-batches")
        verl = dataclasses.replace(verl, log_prob_micro_batch_size_per_gpu=log_prob)
    config = dataclasses.replace(config, actor=actor, verl=verl)
    return _fit_memory(config, notes)


def _fit_memory(config: TrainConfig, notes: list[str]) -> tuple[TrainConfig, list[str]]:
    card = card_memory_gb(config)
    if card is None or estimate_memory(config, card) is None:
        notes.append(f"no memory estimate for model.name={config.model.name!r} "
                     f"(docs/HARDWARE.md covers the model presets)")
        return config, notes
    for _ in range(64):
        estimate = estimate_memory(config, card)
        if estimate.peak <= card:
            return config, notes
        config, change = _shrink(config, estimate)
        if change is None:
            break
        notes.append(change + f" to fit {card:.0f} GB per GPU")
    v = config.verl
    raise ValueError(
        f"model.name={config.model.name!r} does not fit verl.nnodes * verl.n_gpus_per_node = "
        f"{v.nnodes * v.n_gpus_per_node} GPUs of {card:.0f} GB even at micro-batches of 1 with "
        f"verl.optimizer_offload=true: {estimate.describe()}. Fix: more GPUs "
        f"(verl.nnodes / verl.n_gpus_per_node), a smaller model, shorter "
        f"verl.max_response_length, or a lower verl.gpu_memory_utilization (docs/HARDWARE.md)")


def _shrink(config: TrainConfig, estimate: MemoryEstimate) -> tuple[TrainConfig, str | None]:
    """One safe step down in memory for the phase at the peak, or (config, None) when none is
    left. Halving keeps a micro-batch a divisor of the share it divides."""
    actor, v = config.actor, config.verl
    if max(estimate.update, estimate.critic) >= estimate.no_grad and actor.micro_batch_size > 1:
        # the critic's update budget is the actor's micro-batch of trajectories too
        micro = largest_divisor(_shares(config)[2], actor.micro_batch_size // 2)
        return (dataclasses.replace(config, actor=dataclasses.replace(actor,
                micro_batch_size=micro)),
                f"actor.micro_batch_size {actor.micro_batch_size} -> {micro}")
    if estimate.no_grad > estimate.update and v.log_prob_micro_batch_size_per_gpu > 1:
        micro = largest_divisor(_no_grad_rows(config), v.log_prob_micro_batch_size_per_gpu // 2)
        return (dataclasses.replace(config, verl=dataclasses.replace(v,
                log_prob_micro_batch_size_per_gpu=micro)),
                f"verl.log_prob_micro_batch_size_per_gpu {v.log_prob_micro_batch_size_per_gpu}"
                f" -> {micro}")
    if not v.optimizer_offload:
        return (dataclasses.replace(config, verl=dataclasses.replace(v, optimizer_offload=True)),
                "verl.optimizer_offload false -> true (Adam states in CPU memory)")
    return config, None


# -- verl's dispatch arithmetic --------------------------------------------------------------------
def check_dispatch(verl_config: Any, varying_rows: bool = False) -> None:
    """verl 0.9.1's dispatch-time divisions on the composed ``ppo_trainer`` config (see the
    module docstring); ValueError naming the key and the fix for the first that fails.
    ``varying_rows``: a step's row count is known only after its rollout (:func:`rows_vary`)."""
    from omegaconf import OmegaConf

    def get(key: str) -> Any:
        return OmegaConf.select(verl_config, key)

    n = get("actor_rollout_ref.rollout.n")
    batch = get("data.train_batch_size") * n
    nodes, per_node = get("trainer.nnodes"), get("trainer.n_gpus_per_node")
    ranks = nodes * per_node
    sp = get("actor_rollout_ref.actor.ulysses_sequence_parallel_size") or 1
    dp = ranks // sp
    tokens = get("data.max_prompt_length") + get("data.max_response_length")
    fix_batch = "train.group_num * train.group_size"

    def need(ok: bool, key: str, message: str, fix: str) -> None:
        if not ok:
            raise ValueError(f"{key}: {message} (verl 0.9.1 asserts this when the first batch "
                             f"reaches the workers); fix: {fix}")

    need(batch % dp == 0, "data.train_batch_size * actor_rollout_ref.rollout.n",
         f"{batch} trajectories do not split over {dp} data-parallel ranks",
         f"{fix_batch} a multiple of {dp}")
    tp = get("actor_rollout_ref.rollout.tensor_model_parallel_size")
    need(per_node % tp == 0, "actor_rollout_ref.rollout.tensor_model_parallel_size",
         f"vLLM replicas of {tp} GPUs do not tile a node of {per_node}",
         "verl.tensor_model_parallel_size a divisor of verl.n_gpus_per_node")
    if not get("trainer.use_v1"):
        workers = get("actor_rollout_ref.rollout.agent.num_workers")
        need(batch % workers == 0, "actor_rollout_ref.rollout.agent.num_workers",
             f"{batch} trajectories do not split over {workers} agent-loop workers",
             f"verl.agent_workers a divisor of {batch}")
    share = batch // dp
    if not get("actor_rollout_ref.actor.use_dynamic_bsz"):
        rows, what = share, f"a rank's {share} trajectories"
        if varying_rows and get("trainer.use_v1"):
            rows = v1_rank_rows(dp, n, get("actor_rollout_ref.actor.ppo_mini_batch_size"),
                                get("critic.ppo_mini_batch_size"), _uses_critic(verl_config),
                                get("trainer.critic_warmup"))
            what = (f"with context windows a step's rows vary, and V1 pads them so that a "
                    f"rank holds a multiple of {rows}; those rows")
        for key in ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                    *(("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",)
                      if _uses_reference(verl_config) else ())):
            micro = get(key)
            need(rows % micro == 0, key, f"{what} do not split into micro-batches of {micro}",
                 f"verl.log_prob_micro_batch_size_per_gpu a divisor of {rows}")
        mini = get("actor_rollout_ref.actor.ppo_mini_batch_size") * n
        need(mini % dp == 0, "actor_rollout_ref.actor.ppo_mini_batch_size",
             f"a mini-batch of {mini} trajectories does not split over {dp} ranks",
             f"actor.ppo_mini_batch_size a multiple of {math.lcm(dp, n)}")
        mini_share = mini // dp
        need(share % mini_share == 0, "actor_rollout_ref.actor.ppo_mini_batch_size",
             f"a rank's {share} trajectories are not whole mini-batches of {mini_share}",
             f"actor.ppo_mini_batch_size a divisor of {fix_batch}")
        micro = get("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu")
        need(mini_share % micro == 0, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
             f"a rank's mini-batch of {mini_share} does not split into micro-batches of {micro}",
             f"actor.micro_batch_size a divisor of {mini_share}")
    if _uses_critic(verl_config):
        for key in ("critic.ppo_max_token_len_per_gpu", "critic.ppo_infer_max_token_len_per_gpu"):
            need(get(key) >= tokens, key,
                 f"{get(key)} tokens cannot hold one trajectory of up to {tokens}",
                 "at least verl.max_prompt_length + verl.max_response_length")
        critic_mini = get("critic.ppo_mini_batch_size") * n
        need(critic_mini % dp == 0, "critic.ppo_mini_batch_size",
             f"a mini-batch of {critic_mini} trajectories does not split over {dp} ranks",
             f"actor.ppo_mini_batch_size a multiple of {dp}")


def _uses_critic(verl_config: Any) -> bool:
    from verl.trainer.ppo.utils import need_critic

    return need_critic(verl_config)


def _uses_reference(verl_config: Any) -> bool:
    from verl.trainer.ppo.utils import need_reference_policy

    return need_reference_policy(verl_config)


def describe(config: TrainConfig) -> str:
    """One line: the GPUs the run uses and its memory estimate against the card."""
    v, card = config.verl, card_memory_gb(config)
    gpus = v.nnodes * v.n_gpus_per_node
    where = "the CPU as 1 GPU" if config.device == "cpu" else f"{gpus} GPUs ({v.nnodes} x " \
        f"{v.n_gpus_per_node})"
    estimate = estimate_memory(config, card) if card else None
    memory = (f"; {estimate.describe()} of {card:.0f} GB" if estimate else
              f"; card {card:.0f} GB, no estimate for this model" if card else "")
    return f"preflight: {where}{memory}"
