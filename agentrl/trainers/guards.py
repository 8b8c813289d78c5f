"""Signs that training went wrong, measured every step: non-finite numbers and collapse.

    metrics.update(collapse_metrics(trajectories, max_new_tokens=96))  # guard/echo_rate, ...
    if not all_finite(rewards, advantages): ...                         # skip the update

Collapse is reported, not acted on: ``guard/echo_rate`` (replies that are mostly one repeated
pattern, the "echo trap" of RL on small LMs), ``guard/reply_tokens`` (mean tokens per reply)
and the policy's entropy; each logs a warning past its threshold.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Sequence

import torch

from agentrl.rollout.records import Trajectory

__all__ = ["all_finite", "collapse_metrics", "is_echo", "warn_if_entropy_collapsed"]

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


def all_finite(*tensors: torch.Tensor) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors)
