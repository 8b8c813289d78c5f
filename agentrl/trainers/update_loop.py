"""PPO's generic update loop: epochs of shuffled mini-batches of trajectories, each one
optimizer step over gradients accumulated micro-batch by micro-batch.

    metrics, skipped = run_epochs(batch, micro_loss, optimizer, params, UpdateShape(...),
                                  loss_mask=mask, generator=generator, role="actor")

A mini-batch is whole trajectories (``batch["episode_index"]``: all the rows of an episode that
became one row per turn or per context window), so ``mini_batch_size`` counts what the config
says it counts and a step takes the same number of optimizer steps however its episodes were
cut into rows. The loop knows nothing of actors or critics: ``micro_loss(micro, size,
prefix)`` is the role's loss on one micro-batch. What it owns is the bookkeeping every role
shares: the shared prompt prefix of a run of micro-batches
(:func:`agentrl.trainers.shared_prefix.plan_prefix_runs`), whose gradients reach the weights once
after the run's last micro-batch; the gradient-norm clip; and an update whose loss or gradient is
not finite, which is skipped rather than applied.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable

import torch
from tqdm.auto import tqdm

from agentrl.trainers import ppo
from agentrl.trainers.microbatch import micro_order, micro_rows
from agentrl.trainers.shared_prefix import SharedPrefix, plan_prefix_runs

__all__ = ["KL_TERM", "MicroLoss", "UpdateShape", "rows_of", "run_epochs", "trajectory_count",
           "trajectory_index"]

log = logging.getLogger(__name__)

MicroLoss = Callable[[dict[str, torch.Tensor], ppo.MiniBatchSize, SharedPrefix | None],
                     tuple[torch.Tensor, dict[str, float], dict[str, float]]]
"""``(micro, size, prefix) -> (loss, terms, stats)``: ``terms`` are the micro-batch's parts of
its mini-batch's loss terms (summed over the micro-batches they are the mini-batch's, as
accumulation is exact), ``stats`` per-micro-batch statistics (averaged)."""


@dataclass(frozen=True)
class UpdateShape:
    """How a step's batch is cut: passes, rows per optimizer step and per forward pass."""

    epochs: int
    mini_batch_size: int | None
    """Trajectories per optimizer step, with all their rows (None: the whole batch, one step
    a pass)."""
    micro_batch_size: int
    """Rows per forward/backward pass."""
    shared_prefix_tokens: int
    """A micro-batch's shared prompt runs once when at least this long (0: never shared);
    rows are then ordered by prompt, so that a micro-batch holds a group."""
    grad_clip: float
    target_kl: float | None = None
    """Stop the step's passes at the first mini-batch whose approximate KL to the old policy
    (the ``KL_TERM`` its loss reports) exceeds this, before its optimizer step (None: never)."""


KL_TERM = "actor/approx_kl"
"""The term of an actor micro-batch loss that ``UpdateShape.target_kl`` reads: its part of the
mini-batch's mean ``(r - 1) - log r`` (CleanRL's approx_kl, never negative)."""


def trajectory_index(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each row's trajectory (``episode_index``); a batch without it has a trajectory a row."""
    episodes = batch.get("episode_index")
    return torch.arange(batch["responses"].shape[0]) if episodes is None else episodes


def trajectory_count(batch: dict[str, torch.Tensor]) -> int:
    """The trajectories in ``batch``: what ``ppo_mini_batch_size`` is compared with."""
    return len(torch.unique(trajectory_index(batch)))


def rows_of(episodes: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """The rows of the ``chosen`` trajectories, in batch order (summed micro-batch gradients
    do not depend on the order)."""
    return torch.isin(episodes, chosen).nonzero().squeeze(-1)


def run_epochs(batch: dict[str, torch.Tensor], micro_loss: MicroLoss,
               optimizer: torch.optim.Optimizer, params: Any, shape: UpdateShape, *,
               loss_mask: torch.Tensor, generator: torch.Generator,
               role: str) -> tuple[dict[str, float], int]:
    """``shape.epochs`` passes of shuffled mini-batches; returns mean metrics (terms averaged
    over the applied updates, statistics over the micro-batches, ``<role>/grad_norm``,
    ``<role>/passes``: the optimizer steps taken or skipped over the steps a pass takes, below
    ``epochs`` when ``shape.target_kl`` stopped them, and ``<role>/kl_stopped``: 1 then) and
    the number of updates skipped for a non-finite loss or gradient."""
    episodes = trajectory_index(batch)
    trajectories = torch.unique(episodes)
    mini = shape.mini_batch_size or len(trajectories)
    per_pass = math.ceil(len(trajectories) / mini)
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    skipped = done = 0
    stopped = False
    with tqdm(total=shape.epochs * per_pass, desc=f"{role} update", unit="mb",
              leave=False) as bar:
        for _ in range(shape.epochs):
            if stopped:
                break
            order = trajectories[torch.randperm(len(trajectories), generator=generator)]
            for start in range(0, len(order), mini):
                rows = micro_order(batch, rows_of(episodes, order[start:start + mini]),
                                   shape.shared_prefix_tokens)
                size = ppo.MiniBatchSize.of(loss_mask[rows])
                optimizer.zero_grad(set_to_none=True)
                finite = True
                terms: dict[str, float] = defaultdict(float)
                runs = plan_prefix_runs(batch, rows, shape.micro_batch_size,
                                        shape.shared_prefix_tokens)
                for run, part in ((run, p) for run in runs for p in run.micro_batches):
                    loss, micro_terms, stats = micro_loss(micro_rows(batch, part), size,
                                                          run.prefix(role))
                    if not torch.isfinite(loss):
                        finite = False
                        break
                    loss.backward()
                    if part is run.micro_batches[-1]:
                        run.backward()  # the run's shared prefix: its gradients, once
                    for key, value in micro_terms.items():
                        terms[key] += value
                    for key, value in stats.items():
                        sums[key] += value
                        counts[key] += 1
                if finite and shape.target_kl is not None and terms[KL_TERM] > shape.target_kl:
                    optimizer.zero_grad(set_to_none=True)  # this mini-batch went too far
                    sums[KL_TERM] += terms[KL_TERM]
                    counts[KL_TERM] += 1
                    stopped = True
                    break
                if finite:
                    norm = torch.nn.utils.clip_grad_norm_(params, shape.grad_clip)
                    finite = bool(torch.isfinite(norm))
                    sums[f"{role}/grad_norm"] += float(norm)
                    counts[f"{role}/grad_norm"] += 1
                if finite:
                    optimizer.step()
                    for key, value in terms.items():
                        sums[key] += value
                        counts[key] += 1
                else:
                    log.warning("non-finite %s loss or gradient: update skipped", role)
                    optimizer.zero_grad(set_to_none=True)
                    skipped += 1
                done += 1
                bar.update(1)
    metrics = {k: sums[k] / counts[k] for k in sums}
    metrics[f"{role}/passes"] = done / per_pass
    if shape.target_kl is not None:
        metrics[f"{role}/kl_stopped"] = float(stopped)
    return metrics, skipped
