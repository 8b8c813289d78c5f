"""Supervised steps at the start of a PPO run (``train.sft_steps``): the warm start in the loop.

    warm = WarmStart(config, model, tokenizer, loop)
    metrics = warm.step(step)      # steps 1..train.sft_steps: one SFT update each
    warm.close()                   # frees its optimizer before PPO begins

``agentrl sft`` is the warm start as its own command, with a checkpoint that a later ``agentrl
train`` starts from. Here the same updates are the first steps of one run: validation before
the first step measures the untouched model, every step after is logged, saved and resumed
like a PPO step, and the curve shows the whole rise.

Step ``k`` is mini-batch ``k`` of the oracle's demonstrations (``sft.episodes`` of
``sft.presets``, played once on first use): ``sft.mini_batch_size`` episodes with all their
context-window rows (:func:`agentrl.trainers.imitation.update_rows`). Epoch ``e`` visits the
episodes in the order ``randperm(n)`` seeded by ``seed + e``, so each epoch trains every reply
once and a resumed run takes the same mini-batches it would have taken (``sft.epochs`` is not
read: ``train.sft_steps`` sets how many passes there are; ``sft/epoch`` logs it). The loss and
its exact accumulation are :func:`agentrl.trainers.imitation.accumulate_gradients`. The AdamW of
these steps (``sft.lr``) is its own and is not checkpointed: a run resumed inside the warm
start restarts its moments, never its weights.
"""

from __future__ import annotations

from typing import Any

import torch

from agentrl.rollout import to_batch
from agentrl.trainers.imitation import (
    oracle_demonstrations, sft_update, update_rows, updates_per_epoch,
)

__all__ = ["WarmStart"]


class WarmStart:
    """The SFT updates of a run's first ``train.sft_steps`` steps, on ``model`` in place."""

    def __init__(self, config: Any, model: Any, tokenizer: Any, loop: Any, pad_token_id: int):
        self.config, self.model, self.tokenizer, self.loop = config, model, tokenizer, loop
        self.pad_token_id = pad_token_id
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optim = torch.optim.AdamW(self.params, lr=config.sft.lr,
                                       weight_decay=config.sft.weight_decay, fused=True)
        self._batch: dict[str, torch.Tensor] | None = None

    def demonstrations(self) -> dict[str, torch.Tensor]:
        """The oracle's episodes as one batch, played on first use."""
        if self._batch is None:
            self._batch = to_batch(oracle_demonstrations(self.config, self.tokenizer, self.loop),
                                   self.pad_token_id)
        return self._batch

    def step(self, step: int) -> dict[str, float]:
        """SFT update ``step`` (from 1); returns its ``sft/*`` metrics."""
        sft = self.config.sft
        batch = self.demonstrations()
        episodes = len(batch["episode_index"].unique())
        rows = update_rows(batch["episode_index"], sft.mini_batch_size, self.config.seed, step - 1)
        loss, norm = sft_update(self.model, self.params, self.optim, batch, rows, self.config)
        return {"sft/loss": loss, "sft/grad_norm": norm, "sft/lr": sft.lr, "sft/rows": len(rows),
                "sft/epoch": step / updates_per_epoch(episodes, sft.mini_batch_size)}

    def close(self) -> None:
        """Free the optimizer's moments and the demonstrations (PPO needs the memory)."""
        self.optim = None
        self._batch = None
