"""A run never ends worse than its best: the best validation so far, and when to stop early.

    keeper = BestKeeper(config, val_presets=["simpleSokobanAgent"])
    stop = keeper.entropy_stop(step, metrics)          # after the step's update
    if keeper.validated(step, val_metrics): ...        # a new best: save it, point best.json at it
    stop = stop or keeper.patience_stop()
    state["best"] = keeper.state_dict()                # in the checkpoint; load_state_dict on resume

**The best.** A validation's score is its held-out success, the mean of
``val/<preset>/success`` over the validation presets. A score above the best so far (a tie is
no gain) makes that step the best; the trainer saves it as a checkpoint and points
``checkpoints/best.json`` at it (:func:`agentrl.trainers.checkpoint.write_best`), and pruning
spares it. The validation before training is the curve's baseline, not a candidate: the best is
a model the run trained.

**Stopping early** (``trainer.early_stop_patience``, ``trainer.early_stop_entropy``). The run
stops after ``early_stop_patience`` validations of PPO steps without a gain (those of the warm
start, ``train.sft_steps``, never count: supervised steps are not what PPO is judged on), or
after a PPO step whose ``actor/entropy`` is below ``early_stop_entropy`` (a collapsed policy
samples one reply and has nothing left to compare). The step that stops is the run's last:
validated and saved, like the end of a deadline. The stop is part of the checkpoint, so
launching the same run again does not train it further while its criterion still holds; a
looser setting (resumes may change ``trainer.*``) lets it go on.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.trainers.checkpoint import BestRecord

__all__ = ["BestKeeper"]

log = logging.getLogger("agentrl.train")


class BestKeeper:
    """The best validation so far, the validations since it, and the early-stop decisions."""

    def __init__(self, config: Any, val_presets: Sequence[str]):
        self.patience = config.trainer.early_stop_patience or 0
        self.min_entropy = config.trainer.early_stop_entropy
        self.sft_steps = config.train.sft_steps
        self.val_presets = list(val_presets)
        self.best: BestRecord | None = None
        self.since_best = 0
        """Validations of PPO steps since the best without a gain over it."""
        self.last_val_success: float | None = None
        self.stopped: str | None = None
        """Why the run stopped early, in words; None while it goes on."""
        self.stop_entropy: float | None = None
        """The ``actor/entropy`` of the step that stopped for it."""

    def score(self, metrics: Mapping[str, float]) -> tuple[float, dict[str, float]] | None:
        """Held-out success (the presets' mean) and each preset's; None without them."""
        per_preset = {p: float(metrics[f"val/{p}/success"]) for p in self.val_presets
                      if f"val/{p}/success" in metrics}
        if not per_preset:
            return None
        return sum(per_preset.values()) / len(per_preset), per_preset

    def validated(self, step: int, metrics: Mapping[str, float]) -> bool:
        """Record step ``step``'s validation; True when it is the new best."""
        scored = self.score(metrics)
        if scored is None:
            return False
        success, per_preset = scored
        self.last_val_success = success
        if step == 0:  # the baseline before training
            return False
        if self.best is None or success > self.best.val_success:
            self.best = BestRecord(step=step, val_success=success, val=per_preset)
            self.since_best = 0
            return True
        if step > self.sft_steps:
            self.since_best += 1
        return False

    def entropy_stop(self, step: int, metrics: Mapping[str, float]) -> str | None:
        """Why step ``step`` ends the run for its entropy; None when it does not."""
        entropy = metrics.get("actor/entropy")
        if self.min_entropy is None or entropy is None or step <= self.sft_steps \
                or not entropy < self.min_entropy:
            return None
        self.stop_entropy = float(entropy)
        return self._stop(f"actor/entropy {entropy:.4g} below trainer.early_stop_entropy="
                          f"{self.min_entropy:g} at step {step}: the policy collapsed")

    def patience_stop(self) -> str | None:
        """Why the run stops for lack of gain; None when it goes on."""
        if not self.patience or self.since_best < self.patience or self.best is None:
            return None
        return self._stop(f"{self.since_best} validations without a gain over step "
                          f"{self.best.step}'s held-out success {self.best.val_success:.4g} "
                          f"(trainer.early_stop_patience={self.patience})")

    def _stop(self, reason: str) -> str:
        self.stopped = reason
        log.warning("stopping early: %s", reason)
        return reason

    def still_stopped(self) -> str | None:
        """A resumed run's early stop, if its criterion still holds under this config."""
        if self.stopped is None:
            return None
        if self.stop_entropy is not None:
            holds = self.min_entropy is not None and self.stop_entropy < self.min_entropy
        else:
            holds = bool(self.patience) and self.since_best >= self.patience
        if not holds:
            log.info("the run had stopped early (%s); the config now lets it go on",
                     self.stopped)
            self.stopped = self.stop_entropy = None
        return self.stopped

    def state_dict(self) -> dict[str, Any]:
        """Plain values (``torch.load(weights_only=True)`` reads them back)."""
        best = self.best
        return {"best": None if best is None else {"step": best.step,
                                                   "val_success": best.val_success,
                                                   "val": dict(best.val)},
                "since_best": self.since_best, "last_val_success": self.last_val_success,
                "stopped": self.stopped, "stop_entropy": self.stop_entropy}

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        """Restore :meth:`state_dict`; ``None`` (a checkpoint from before best-keeping) keeps
        the fresh state."""
        if not state:
            return
        best = state.get("best")
        self.best = None if best is None else BestRecord(
            step=int(best["step"]), val_success=float(best["val_success"]),
            val={k: float(v) for k, v in best.get("val", {}).items()})
        self.since_best = int(state.get("since_best", 0))
        self.last_val_success = state.get("last_val_success")
        self.stopped = state.get("stopped")
        self.stop_entropy = state.get("stop_entropy")
