"""Signs that training went wrong, measured every step: non-finite numbers and collapse.

    metrics.update(collapse_metrics(trajectories, max_new_tokens=96))  # guard/echo_rate, ...
    if not all_finite(rewards, advantages): ...                         # skip the update

Collapse is reported, not acted on: ``guard/echo_rate`` (replies that are mostly one repeated
pattern, the "echo trap" of RL on small LMs), ``guard/reply_tokens`` (mean tokens per reply)
and the policy's entropy; each logs a warning past its threshold. ``rollout/logprob_gap_mean``
and ``_max`` compare the sampler's log-probs with the trainer's old log-probs of the same
tokens (verl logs the same as ``training/rollout_probs_diff_*``): a large gap means the PPO
ratio no longer measures the update (a reply trained on another context than it was sampled
from, a dtype or sampling mismatch).
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Sequence

import torch

from agentrl.rollout.records import Trajectory

__all__ = ["all_finite", "collapse_metrics", "is_echo", "logprob_gap", "warn_if_entropy_collapsed"]

log = logging.getLogger("agentrl.train")

ENTROPY_FLOOR = 0.01
"""Mean token entropy (nats) below which the policy is reported as collapsed."""
MIN_REPLY_TOKENS = 2.0
"""Mean model tokens per reply below which replies are reported as collapsed."""
ECHO_MIN_CHARS = 48
ECHO_COMPRESSION = 0.12
"""A reply of at least ECHO_MIN_CHARS whose zlib size is under this share of its length is
mostly one repeated pattern: an echo-trap reply."""
ECHO_WARN_RATE = 0.5
LOGPROB_GAP_WARN = 0.5
"""Largest per-token |sampler log-prob - trainer's old log-prob| (nats) tolerated without a
warning: a token whose probability the two disagree on by more than a factor e^0.5 ~ 1.65.
The local engine and trainer agree within ~1e-5 in float32; bf16 sampling on a GPU stays
well under this."""
_ZLIB_OVERHEAD = len(zlib.compress(b""))


def is_echo(text: str) -> bool:
    """Repetitive degenerate text ("aaaa...", "Up Up Up Up ...") compresses far below prose."""
    data = text.encode("utf-8", "replace")
    packed = len(zlib.compress(data)) - _ZLIB_OVERHEAD  # zlib's fixed header and trailer
    return len(data) >= ECHO_MIN_CHARS and packed < ECHO_COMPRESSION * len(data)


def collapse_metrics(trajectories: Sequence[Trajectory], max_new_tokens: int) -> dict[str, float]:
    """``guard/echo_rate`` and ``guard/reply_tokens`` over every reply; warns past thresholds
    (short replies only when the limit allows longer ones)."""
    turns = [turn for t in trajectories for turn in t.turns]
    echo = sum(is_echo(turn.text) for turn in turns) / max(1, len(turns))
    tokens = sum(len(turn.response_ids) for turn in turns) / max(1, len(turns))
    if echo > ECHO_WARN_RATE:
        log.warning("%.0f%% of replies are one repeated pattern (echo trap)", 100 * echo)
    if tokens < MIN_REPLY_TOKENS < max_new_tokens:
        log.warning("replies collapsed to %.1f tokens on average", tokens)
    return {"guard/echo_rate": echo, "guard/reply_tokens": tokens}


def warn_if_entropy_collapsed(entropy: float | None) -> None:
    if entropy is not None and entropy < ENTROPY_FLOOR:
        log.warning("policy entropy collapsed to %.4f nats", entropy)


def logprob_gap(sampler: torch.Tensor, trainer: torch.Tensor, response_mask: torch.Tensor
                ) -> dict[str, float]:
    """``rollout/logprob_gap_mean`` and ``_max`` over model tokens; one warning past
    :data:`LOGPROB_GAP_WARN`."""
    mask = response_mask.bool()
    gap = (sampler.float() - trainer.float()).abs()[mask]
    if gap.numel() == 0:
        return {}
    largest = float(gap.max())
    if largest > LOGPROB_GAP_WARN:
        log.warning("sampler and trainer log-probs differ by up to %.3f nats on a token "
                    "(mean %.4f): the PPO ratio is off", largest, float(gap.mean()))
    return {"rollout/logprob_gap_mean": float(gap.mean()), "rollout/logprob_gap_max": largest}


def all_finite(*tensors: torch.Tensor) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors)
