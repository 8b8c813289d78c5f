"""Supervised warm start (SFT) on oracle play: cross-entropy on the replies of RL-layout episodes.

    agentrl sft model=embedded 'sft.presets=[quickSokobanAgent]' sft.episodes=64
    agentrl train model=runs/agentrl/quick/sft/checkpoints/step_000024   # PPO starts from it

    from agentrl.trainers.sft import SFTTrainer
    trainer = SFTTrainer(config)
    try:
        result = trainer.fit()     # evaluate, play demonstrations, train, evaluate, save
    finally:
        trainer.close()

Stages of :meth:`SFTTrainer.fit`:

1. ``evaluate`` (``sft.evaluate``): greedy episodes of ``val.presets`` on ``val.group_num``
   held-out seeds, through :func:`agentrl.evaluation.evaluate` (the numbers PPO's validation
   and ``agentrl eval`` report).
2. ``demonstrations``: ``sft.episodes`` oracle episodes of ``sft.presets`` (default
   ``train.presets``) on training seeds that depend on ``seed``
   (:func:`agentrl.rollout.demonstrations.demonstration_seeds`), played through the RL
   rollout (:mod:`agentrl.rollout.demonstrations`), so ids, chat template and masks are those
   PPO samples; ``sft.random_action_share`` mixes in random turns that show recoveries.
3. ``train``: ``sft.epochs`` passes over shuffled mini-batches of ``sft.mini_batch_size``
   episodes, each with all its context-window rows, so a pass trains every reply once
   (:func:`agentrl.trainers.imitation.update_rows`). The loss of a mini-batch is the mean
   negative log-likelihood over every reply token in it (:func:`loss_mask`:
   ``response_mask``, 1 on the model's own tokens, the closing end-of-turn token included);
   each micro-batch of ``sft.micro_batch_size`` rows adds its token sum divided by the
   mini-batch's token count, so accumulation is exact (the gradient does not depend on the
   micro-batch size). AdamW at a constant ``sft.lr``, grad-norm clip,
   a tqdm bar with the loss. Full fine-tuning, or LoRA adapters (the ``lora`` section, as PPO).
4. ``evaluate`` again, then ``save``: a checkpoint in :mod:`agentrl.trainers.checkpoint`'s
   format under ``sft.output_dir`` (default ``<run_dir>/sft``) whose ``actor/`` folder is a
   plain HF model and tokenizer (LoRA adapters are merged into the weights first), so
   ``agentrl train model=<checkpoint>`` and ``agentrl eval --model <checkpoint>`` start from
   it (:func:`agentrl.models.load_model` reads a checkpoint folder's ``actor/``). A
   ``sft_summary.json`` beside the checkpoints holds the counts, timings and both evaluations.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from agentrl.engines import BatchingLLM, SamplingParams
from agentrl.evaluation import EvalResult, evaluate
from agentrl.models import load_model
from agentrl.rollout import to_batch
from agentrl.rollout.demonstrations import DEMO_SEED_OFFSET
from agentrl.rollout.records import Trajectory
from agentrl.trainers.checkpoint import save_checkpoint
from agentrl.trainers.device import resolve_device
from agentrl.trainers.moments import OPTIMIZER_TENSORS
from agentrl.trainers.imitation import (
    oracle_demonstrations, sft_update, update_rows, updates_per_epoch,
)

__all__ = ["DEMO_SEED_OFFSET", "SFTTrainer", "SftResult"]

log = logging.getLogger("agentrl.sft")

SUMMARY_FILE = "sft_summary.json"


@dataclass(frozen=True)
class SftResult:
    """What a warm start did and where it left the model."""

    checkpoint: Path
    """The checkpoint folder: ``agentrl train model=<checkpoint>`` starts from it."""
    demonstrations: int
    """Episodes trained on (after dropping unsolved ones that had random turns)."""
    tokens: int
    """Reply tokens per epoch (the loss's tokens)."""
    updates: int
    seconds: dict[str, float]
    """Wall time per stage: evaluate_before, demonstrations, train, evaluate_after, save."""
    losses: list[float] = field(default_factory=list)
    """Mean loss of each update, in order."""
    before: EvalResult | None = None
    after: EvalResult | None = None

    def summary(self) -> dict[str, Any]:
        """JSON-able: counts, timings, the loss of every update, per-preset evaluations."""
        return {
            "checkpoint": str(self.checkpoint),
            "demonstrations": self.demonstrations,
            "tokens_per_epoch": self.tokens,
            "updates": self.updates,
            "seconds": self.seconds,
            "first_loss": self.losses[0] if self.losses else None,
            "last_loss": self.losses[-1] if self.losses else None,
            "losses": list(self.losses),  # one per update: the report draws the curve
            "before": self.before.to_dict() if self.before else None,
            "after": self.after.to_dict() if self.after else None,
        }


class SFTTrainer:
    """The model (optionally with LoRA), its optimizer and the stages of the module docstring."""

    def __init__(self, config: Any):
        self.config = config
        random.seed(config.seed)
        np.random.seed(config.seed % 2**32)
        torch.manual_seed(config.seed)
        if config.threads > 0:
            torch.set_num_threads(config.threads)
        self.device = resolve_device(config.device)
        self.model, self.tokenizer = load_model(config.model.name, device=self.device,
                                                dtype=config.model.dtype,
                                                chat_template=config.model.chat_template)
        if config.model.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        if config.lora.rank > 0:
            from peft import LoraConfig, get_peft_model

            self.model = get_peft_model(self.model, LoraConfig(
                r=config.lora.rank, lora_alpha=config.lora.alpha,
                lora_dropout=config.lora.dropout, target_modules=list(config.lora.target_modules),
                task_type="CAUSAL_LM"))
        self.model.eval()  # no dropout: the loss is that of the model PPO will sample from
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        # fused: one kernel for all parameters (~6x faster steps on CPU than the per-tensor loop)
        self.optim = torch.optim.AdamW(self.params, lr=config.sft.lr,
                                       weight_decay=config.sft.weight_decay, fused=True)
        self.pad_token_id = (self.tokenizer.pad_token_id if self.tokenizer.pad_token_id
                             is not None else self.tokenizer.eos_token_id)
        r = config.rollout
        self.llm = BatchingLLM(self.model, self.tokenizer, max_batch=r.max_batch,
                               max_wait_ms=r.max_wait_ms, device=self.device, seed=config.seed,
                               prefix_cache_tokens=r.prefix_cache_tokens)
        self.loop = asyncio.new_event_loop()
        val_tokens = config.val.max_new_tokens or r.max_new_tokens
        self.val_presets = dict(config.playing_presets(config.val.presets, val_tokens))
        # as PPO's validation decodes (rollout.constrained_actions), so the numbers compare
        self.val_sampling = SamplingParams(greedy=True, max_new_tokens=val_tokens,
                                           constrained_actions=config.constrained_actions)
        self.output_dir = Path(config.sft.output_dir or Path(config.run_dir) / "sft")

    # -- stages ------------------------------------------------------------------------------------
    def evaluate(self, label: str) -> EvalResult:
        """Greedy held-out episodes of ``val.presets`` (see :func:`agentrl.evaluation.evaluate`)."""
        self.llm.clear_prefix_cache()  # stored keys/values are of the weights before training
        v = self.config.val
        return self.loop.run_until_complete(evaluate(
            self.val_presets, self.llm, groups=v.group_num, group_size=v.group_size,
            split="val", tokenizer=self.tokenizer, sampling=self.val_sampling,
            max_context_tokens=self.config.rollout.max_context_tokens, label=label))

    def demonstrations(self) -> list[Trajectory]:
        """The oracle's episodes of the SFT presets, in the RL token layout."""
        with tqdm(total=self.config.sft.episodes, desc="oracle demonstrations", unit="ep") as bar:
            return oracle_demonstrations(self.config, self.tokenizer, self.loop,
                                         on_episode_done=lambda _: bar.update(1))

    def train(self, trajectories: list[Trajectory], deadline: float | None = None
              ) -> list[float]:
        """``sft.epochs`` passes of shuffled mini-batches; returns each update's loss. The update
        that ends past ``deadline`` (a ``time.monotonic()`` value) is the last."""
        sft = self.config.sft
        batch = to_batch(trajectories, self.pad_token_id)
        losses: list[float] = []
        total = sft.epochs * updates_per_epoch(len(trajectories), sft.mini_batch_size)
        with tqdm(total=total, desc="sft", unit="update") as bar:
            for update in range(total):
                rows = update_rows(batch["episode_index"], sft.mini_batch_size, self.config.seed,
                                   update)
                loss, _ = sft_update(self.model, self.params, self.optim, batch, rows, self.config)
                losses.append(loss)
                bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
                bar.update(1)
                if deadline is not None and time.monotonic() >= deadline:
                    log.info("SFT stopped at its deadline after %d updates", len(losses))
                    self.llm.clear_prefix_cache()
                    return losses
        self.llm.clear_prefix_cache()
        return losses

    def save(self, updates: int) -> Path:
        """The checkpoint (LoRA merged into the weights: a plain HF model in ``actor/``), with
        AdamW's moments in ``optimizer.pt`` when ``sft.save_optimizer``."""
        model = self.model
        if hasattr(model, "merge_and_unload"):
            model = model.merge_and_unload()
        tensors = ({OPTIMIZER_TENSORS: self.optim.state_dict()}
                   if self.config.sft.save_optimizer else {})  # for actor.warm_optimizer
        return save_checkpoint(self.output_dir, updates, models={"actor": (model, self.tokenizer)},
                               tensors=tensors, config=self.config.to_dict(), keep_last=1)

    # -- the run -----------------------------------------------------------------------------------
    def fit(self, deadline: float | None = None) -> SftResult:
        """Evaluate, play, train, evaluate, save (see the module docstring). ``deadline`` (a
        ``time.monotonic()`` value) ends training after the update that passes it."""
        seconds: dict[str, float] = {}
        clock = time.perf_counter()

        def lap(name: str) -> None:
            nonlocal clock
            now = time.perf_counter()
            seconds[name] = now - clock
            clock = now

        evaluating = self.config.sft.evaluate
        before = self.evaluate("before SFT") if evaluating else None
        lap("evaluate_before")
        demos = self.demonstrations()
        lap("demonstrations")
        losses = self.train(demos, deadline)
        lap("train")
        after = self.evaluate("after SFT") if evaluating else None
        lap("evaluate_after")
        checkpoint = self.save(len(losses))
        lap("save")
        result = SftResult(checkpoint=checkpoint, demonstrations=len(demos),
                           tokens=int(sum(sum(t.response_mask) for t in demos)),
                           updates=len(losses), seconds=seconds, losses=losses,
                           before=before, after=after)
        (self.output_dir / SUMMARY_FILE).write_text(json.dumps(result.summary(), indent=1))
        return result

    def close(self) -> None:
        """Stop the generation worker, then the event loop."""
        if not self.loop.is_closed():
            self.loop.run_until_complete(self.llm.aclose())
            self.loop.close()
