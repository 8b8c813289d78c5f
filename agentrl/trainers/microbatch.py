"""Micro-batches of a verl-layout batch (:func:`agentrl.rollout.to_batch`), cut to their rows.

    micro = micro_rows(batch, torch.arange(0, 2))    # rows 0-1, shared padding removed
    values = pad_responses(critic(micro), batch["responses"].shape[1])
    rows = prefix_order(batch, rows)                  # a group's members side by side
"""

from __future__ import annotations

import torch

__all__ = ["micro_order", "micro_rows", "pad_responses", "prefix_order"]


def micro_rows(batch: dict[str, torch.Tensor], rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """Rows of ``batch``, without the columns that are padding in all of them (left padding of
    the prompts, right padding of the responses): a micro-batch of short episodes runs short."""
    sub = {key: value[rows] for key, value in batch.items()}
    prompt_len, response_len = sub["prompts"].shape[1], sub["responses"].shape[1]
    real = sub["attention_mask"].any(0).nonzero().squeeze(-1)
    first = min(int(real[0]), prompt_len - 1)
    end = max(int(real[-1]) + 1, prompt_len + 1)
    out = {}
    for key, value in sub.items():
        if key in ("input_ids", "attention_mask", "position_ids"):
            out[key] = value[:, first:end]
        elif key == "prompts":
            out[key] = value[:, first:]
        elif value.dim() >= 2 and value.shape[1] == response_len:
            out[key] = value[:, : end - prompt_len]
        else:
            out[key] = value
    return out


def pad_responses(values: torch.Tensor, length: int) -> torch.Tensor:
    """Right-pad a ``(b, r, ...)`` micro-batch result back to the batch's response length."""
    if values.shape[1] == length:
        return values
    widths = [0, 0] * (values.dim() - 2) + [0, length - values.shape[1]]
    return torch.nn.functional.pad(values, widths)


def prefix_order(batch: dict[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
    """``rows`` sorted by their prompts' real tokens (lexicographic; equal prompts keep their
    order): rows that start alike become neighbours, so micro-batches cut from them hold a
    group's members, whose shared first prompt then runs once
    (:mod:`agentrl.trainers.shared_prefix`). Summed micro-batch gradients do not depend on
    the order (exact accumulation, :mod:`agentrl.trainers.ppo`)."""
    prompts = batch["prompts"]
    real = batch["attention_mask"][:, :prompts.shape[1]].bool()
    listed = rows.tolist()
    keys = [prompts[row][real[row]].tolist() for row in listed]
    order = sorted(range(len(listed)), key=keys.__getitem__)
    return rows[torch.tensor(order, dtype=torch.long)]


def micro_order(batch: dict[str, torch.Tensor], rows: torch.Tensor,
                shared_prefix_tokens: int) -> torch.Tensor:
    """``rows`` in the order micro-batches are cut from: :func:`prefix_order` when a shared
    prompt prefix is run once (``shared_prefix_tokens > 0``), else as given."""
    return prefix_order(batch, rows) if shared_prefix_tokens else rows
