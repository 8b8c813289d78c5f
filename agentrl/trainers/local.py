"""PPO with a critic on one process (CPU or one CUDA GPU): the local engine's trainer.

    from agentrl.config import compose_config
    from agentrl.trainers.local import LocalTrainer
    LocalTrainer(compose_config(["train.total_steps=4"])).fit()

One training step is a short sequence of named stages (each timed as ``timing/<stage>_s``):

1. ``rollout``: ``group_num x group_size`` episodes of the training presets on new training
   seeds (the seeds depend only on the step, so a resumed run plays the same games), sampled
   by the actor through :class:`agentrl.engines.BatchingLLM`.
2. ``filter``: in-group std filtering and return normalization, then :func:`to_batch`.
3. The update (:class:`agentrl.trainers.ppo_update.PPOUpdate`), its stages timed the same way:
   ``old_logprobs`` / ``ref`` / ``values`` (scoring passes without gradients, where the
   update's own first passes do not give them), ``advantages`` (an optional KL penalty in the
   reward, then GAE or a critic-free estimator), then ``critic`` and ``actor``: ``ppo_epochs``
   passes over shuffled mini-batches, grad-norm clipping, AdamW; the schedulers' linear warm-up
   advances once per step.

Precision: the weights stay float32; ``model.dtype: bfloat16`` runs the sampler's and the
trainer's forward passes under autocast (:mod:`agentrl.models.precision`), so AdamW updates
float32 masters and the sampled and recomputed log-probs come from the same arithmetic.
``model.gradient_checkpointing`` recomputes each decoder layer's activations in the backward
pass of the update (:func:`agentrl.trainers.policy.checkpointing`), with dropout still off.

Validation (greedy, held-out seeds and presets) runs before training and every ``test_freq``
steps; a checkpoint is written every ``save_freq`` steps and at the end; ``resume=auto``
continues from the newest complete checkpoint with the same run id and metric history.
The best validated step is saved too and kept beside the last (``checkpoints/best.json``), and
the run stops early per ``trainer.early_stop_patience`` / ``early_stop_entropy``
(:mod:`agentrl.trainers.best`).
Every step also records ``trainer.log_episodes`` finished episodes per split, turn by turn, in
``<run_dir>/episodes/step_N.jsonl`` (:mod:`agentrl.trainers.episode_log`).

Guards (:mod:`agentrl.trainers.guards`): a non-finite reward, advantage or loss skips that
update (``guard/skipped_updates``) with a warning; collapse signs are measured every step and
warned about (echo-trap replies, entropy, reply length).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from agentrl.engines import BatchingLLM, SamplingParams
from agentrl.envs.splits import train_seeds
from agentrl.evaluation import evaluate
from agentrl.models import load_model
from agentrl.rollout import (branch_metrics, distance_shaping, drop_uniform_groups,
                             filter_groups, leave_out_after_missed_moves, lost_group_rows,
                             normalize_returns, rollout_metrics, run_groups, step_advantages,
                             to_batch, trajectory_groups, turn_samples, uniform_group_metrics)
from agentrl.rollout.episode_record import episode_record, sample_episodes
from agentrl.trainers.best import BestKeeper
from agentrl.trainers.checkpoint import (BestRecord, checkpoint_problem, clear_best,
                                         load_checkpoint, prune_checkpoints, restore_weights,
                                         save_checkpoint, write_best)
from agentrl.trainers.device import resolve_device
from agentrl.trainers.episode_log import EpisodeLog
from agentrl.trainers.guards import collapse_metrics
from agentrl.trainers.moments import carry_moments, saved_moments
from agentrl.trainers.plots import plot_learning_curves, reference_success
from agentrl.trainers.policy import ValueModel
from agentrl.trainers.ppo_update import PPOUpdate
from agentrl.trainers.reference import Reference, needs_reference
from agentrl.trainers.resume import resume_checkpoint
from agentrl.trainers.rng_state import capture_rng_state, restore_rng_state
from agentrl.trainers.timing import StageTimer
from agentrl.trainers.tracking import RunTracker
from agentrl.trainers.warm_start import WarmStart

__all__ = ["LocalTrainer", "RunResult"]

log = logging.getLogger("agentrl.train")

@dataclass(frozen=True)
class RunResult:
    """Where a finished run left its outputs."""

    run_dir: Path
    run_id: str
    step: int
    checkpoint: Path | None
    """The last checkpoint."""
    metrics: Path
    plot: Path | None
    best: BestRecord | None = None
    """The best validated step and its held-out success (None: nothing validated)."""
    best_checkpoint: Path | None = None
    last_val_success: float | None = None
    """Held-out success of the newest validation."""
    stopped: str | None = None
    """Why the run stopped early; None when it ran its steps (or met its deadline)."""


class LocalTrainer:
    """Actor, critic, reference, optimizers and the loop over steps; see the module docstring."""

    def __init__(self, config: Any):
        self.config = config
        self._seed_everything(config.seed)
        if config.threads > 0:
            torch.set_num_threads(config.threads)
        self.device = resolve_device(config.device)
        r = config.rollout
        self.train_presets = config.playing_presets(config.train.presets, r.max_new_tokens)
        self.val_presets = dict(config.playing_presets(
            config.val.presets, config.val.max_new_tokens or r.max_new_tokens))

        # float32 master weights; a half ``model.dtype`` is the autocast dtype of every forward
        self.compute_dtype = None if config.model.dtype == "float32" else config.model.dtype
        self.actor, self.tokenizer = load_model(config.model.name, device=self.device,
                                                dtype="float32",
                                                chat_template=config.model.chat_template)
        self.pad_token_id = self.tokenizer.pad_token_id
        if self.pad_token_id is None:
            self.pad_token_id = self.tokenizer.eos_token_id
        self._setup_actor()
        c = config.critic
        self.critic = (ValueModel.from_actor(self.actor, share_backbone=c.share_backbone,
                                             head_hidden=c.head_hidden,
                                             standardize=c.standardize_features
                                             or c.head_fit == "ridge")
                       if config.algorithm.adv_estimator == "gae" else None)
        self.actor_optim, self.actor_sched = self._optimizer(
            [p for p in self.actor.parameters() if p.requires_grad], config.actor)
        if config.actor.warm_optimizer and not config.train.sft_steps:  # an agentrl sft model
            carry_moments(saved_moments(config.model.name), self.actor_optim)
        self.critic_optim = self.critic_sched = None
        if self.critic is not None and c.head_fit == "gradient":  # ridge: refit, never stepped
            self.critic_optim, self.critic_sched = self._optimizer(
                self.critic.trainable_parameters(), config.critic)
        self.updater = PPOUpdate(
            config, device=self.device, actor=self.actor, critic=self.critic,
            reference=self.reference, actor_optim=self.actor_optim, actor_sched=self.actor_sched,
            critic_optim=self.critic_optim, critic_sched=self.critic_sched,
            compute_dtype=self.compute_dtype)
        self.llm = BatchingLLM(self.actor, self.tokenizer, max_batch=config.rollout.max_batch,
                               max_wait_ms=config.rollout.max_wait_ms, device=self.device,
                               seed=config.seed,
                               prefix_cache_tokens=config.rollout.prefix_cache_tokens,
                               compute_dtype=self.compute_dtype)
        self.loop = asyncio.new_event_loop()
        self.warm_start = (WarmStart(config, self.actor, self.tokenizer, self.loop,
                                     self.pad_token_id) if config.train.sft_steps else None)
        self.step = 0
        self.keeper = BestKeeper(config, list(self.val_presets))
        self._pointed_best: int | None = None
        """The step ``checkpoints/best.json`` names."""
        self.episode_samples: list[dict[str, Any]] = []
        """Episode records of the step being run (``trainer.log_episodes`` per split)."""
        r = config.rollout
        self.sampling = SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                                       max_new_tokens=r.max_new_tokens,
                                       constrained_actions=config.constrained_actions,
                                       return_features=self.updater.critic_on_backbone)
        val_tokens = config.val.max_new_tokens or r.max_new_tokens
        self.val_sampling = SamplingParams(greedy=True, max_new_tokens=val_tokens,
                                           constrained_actions=config.constrained_actions)

    # -- set-up ----------------------------------------------------------------------------------
    @staticmethod
    def _seed_everything(seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)

    def _setup_actor(self) -> None:
        config = self.config
        if config.model.gradient_checkpointing:  # active in the update only: see checkpointing()
            self.actor.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        if config.lora.rank > 0:
            from peft import LoraConfig, get_peft_model

            lora = LoraConfig(r=config.lora.rank, lora_alpha=config.lora.alpha,
                              lora_dropout=config.lora.dropout,
                              target_modules=list(config.lora.target_modules), task_type="CAUSAL_LM")
            self.actor = get_peft_model(self.actor, lora)
        # the KL anchor: the loaded model until the warm start's end (see _end_warm_start)
        self.reference = Reference(self.actor) if needs_reference(config) else None
        self.actor.eval()  # no dropout: sampled and recomputed log-probs must agree

    def _optimizer(self, params: list[torch.nn.Parameter], settings: Any):
        optim = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
        warmup = max(0, settings.warmup_steps)
        sched = torch.optim.lr_scheduler.LambdaLR(
            optim, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
        return optim, sched

    # -- the run -----------------------------------------------------------------------------------
    def fit(self, deadline: float | None = None) -> RunResult:
        """Train to ``train.total_steps`` (resuming per ``resume``); validate, save, log, plot.

        ``deadline`` (a ``time.monotonic()`` value) stops training early: the step that ends
        past it is the run's last (validated when ``val.test_freq`` is on, and saved), so a
        fixed wall budget ends like a finished run. A resumed run gets the deadline it is given.
        """
        config = self.config
        run_dir = Path(config.run_dir)
        checkpoint = resume_checkpoint(run_dir, config.resume, config.to_dict())
        if checkpoint is not None:
            self._restore(checkpoint)
            log.info("resumed from %s (step %d)", checkpoint, self.step)
            self._point_at_best(run_dir)
        else:
            clear_best(run_dir)  # a run that starts over has no best yet
        tracker = RunTracker(run_dir, project=config.project, experiment=config.experiment,
                             config=config.to_dict(), use_wandb="wandb" in config.trainer.logger,
                             wandb_mode=config.trainer.wandb_mode,
                             resume_step=self.step if checkpoint is not None else None,
                             total_steps=config.train.total_steps,
                             console="console" in config.trainer.logger)
        episode_log = EpisodeLog(run_dir)
        episode_log.drop_after(self.step if checkpoint is not None else None)
        total, freq = config.train.total_steps, config.val.test_freq
        last_saved = checkpoint
        with tracker:
            if self.step == 0 and config.val.before_train:
                self.episode_samples = []
                tracker.log(0, self.validate(), self.episode_samples)
                episode_log.write(0, self.episode_samples)
            if self.keeper.still_stopped():
                log.info("the run stopped early at step %d: nothing to train", self.step)
            while self.step < total and not self.keeper.stopped:
                step = self.step + 1
                self.episode_samples = []
                metrics = self.train_step(step)
                self.step = step
                stop = self.keeper.entropy_stop(step, metrics)
                last = step == total or (deadline is not None and time.monotonic() >= deadline)
                warm_start_done = step == config.train.sft_steps
                new_best = False
                if freq and (step % freq == 0 or last or stop or warm_start_done):
                    metrics.update(self.validate())
                    new_best = self.keeper.validated(step, metrics)
                    stop = stop or self.keeper.patience_stop()
                last = last or stop is not None
                # before the save: a saved step is always logged
                tracker.log(step, metrics, self.episode_samples)
                episode_log.write(step, self.episode_samples)
                if last or new_best or (config.trainer.save_freq
                                        and step % config.trainer.save_freq == 0):
                    last_saved = self.save(run_dir, new_best=new_best)
                if last:
                    break
        plot = None
        if config.trainer.plot and (run_dir / "metrics.jsonl").exists():
            references = reference_success(run_dir, list(self.val_presets),
                                           config.val.group_num)
            plot = plot_learning_curves(run_dir / "metrics.jsonl", run_dir / "learning_curves.png",
                                        references=references)
        best = self.keeper.best
        return RunResult(run_dir=run_dir, run_id=tracker.run_id, step=self.step,
                         checkpoint=last_saved, metrics=run_dir / "metrics.jsonl", plot=plot,
                         best=best, best_checkpoint=None if best is None else
                         run_dir / "checkpoints" / best.folder_name,
                         last_val_success=self.keeper.last_val_success,
                         stopped=self.keeper.stopped)

    def validate(self) -> dict[str, float]:
        """Greedy episodes of the validation presets on held-out seeds: ``val/<preset>/...``."""
        v = self.config.val
        self.llm.clear_prefix_cache()  # its keys/values are of the weights before the update
        result = self.loop.run_until_complete(evaluate(
            self.val_presets, self.llm, groups=v.group_num, group_size=v.group_size, split="val",
            tokenizer=self.tokenizer, sampling=self.val_sampling,
            max_context_tokens=self.config.rollout.max_context_tokens,
            progress="console" in self.config.trainer.logger))
        self._sample_episodes(result.trajectories, "val", self.step)
        return {k: v for k, v in result.metrics.items() if not k.startswith("timing/")}

    def _sample_episodes(self, trajectories, split: str, step: int) -> None:
        """Keep ``trainer.log_episodes`` of these episodes' records for this step's log."""
        self.episode_samples += [
            episode_record(t, split=split, step=step)
            for t in sample_episodes(trajectories, self.config.trainer.log_episodes)]

    def save(self, run_dir: Path, new_best: bool = False) -> Path:
        """A complete checkpoint of this step (see :mod:`agentrl.trainers.checkpoint`), the
        best kept beside the newest ``keep_last``. ``new_best``: this step is the best:
        ``best.json`` points at it once it is complete, and the previous best is pruned then
        (a crash in between leaves the old pointer and its checkpoint)."""
        best = self.keeper.best
        keep = tuple(s for s in (self._pointed_best, best and best.step) if s)
        state = {
            "step": self.step,
            "best": self.keeper.state_dict(),
            "actor_optim": self.actor_optim.state_dict(),
            "actor_sched": self.actor_sched.state_dict(),
            "rng": capture_rng_state({"llm": self.llm.generator}),
        }
        tensors = {"trainer_state": state}
        reference = self.reference.state_dict() if self.reference is not None else None
        if reference is not None:  # the warm-started policy (see _end_warm_start)
            tensors["reference"] = reference
        if self.critic is not None:
            tensors["critic"] = self.critic.state_dict()
        if self.critic_optim is not None:
            state["critic_optim"] = self.critic_optim.state_dict()
            state["critic_sched"] = self.critic_sched.state_dict()
        path = save_checkpoint(run_dir, self.step, models={"actor": (self.actor, self.tokenizer)},
                               tensors=tensors, config=self.config.to_dict(),
                               keep_last=self.config.trainer.keep_last, keep_steps=keep)
        if new_best:
            write_best(run_dir, best)
            self._pointed_best = best.step
            prune_checkpoints(run_dir, self.config.trainer.keep_last, keep_steps=(best.step,))
        return path

    def _point_at_best(self, run_dir: Path) -> None:
        """After a resume, ``best.json`` names the restored best (it may be missing after a
        crash, or name a checkpoint of an abandoned later step)."""
        best = self.keeper.best
        if best is not None and checkpoint_problem(
                run_dir / "checkpoints" / best.folder_name) is not None:
            log.warning("the best checkpoint (step %d) is gone or damaged: the run's best "
                        "starts over", best.step)
            self.keeper.best = None
            best = None
        if best is None:
            clear_best(run_dir)
        else:
            write_best(run_dir, best)
        self._pointed_best = None if best is None else best.step

    def _restore(self, path: Path) -> None:
        loaded = load_checkpoint(path, map_location=self.device)
        restore_weights(self.actor, loaded.model_dirs["actor"])
        state = loaded.tensors["trainer_state"]
        self.actor_optim.load_state_dict(state["actor_optim"])
        self.actor_sched.load_state_dict(state["actor_sched"])
        if self.critic is not None:
            self.critic.load_state_dict(loaded.tensors["critic"])
        if self.critic_optim is not None:
            self.critic_optim.load_state_dict(state["critic_optim"])
            self.critic_sched.load_state_dict(state["critic_sched"])
        restore_rng_state(state["rng"], {"llm": self.llm.generator})
        self.step = int(state["step"])
        self.keeper.load_state_dict(state.get("best"))
        self._restore_reference(loaded.tensors.get("reference"))

    def _restore_reference(self, saved: dict[str, torch.Tensor] | None) -> None:
        if self.reference is None:
            return
        if saved is not None:
            self.reference.load_state_dict(saved)
        elif 0 < self.config.train.sft_steps <= self.step:
            raise ValueError(
                f"the checkpoint of step {self.step} has no KL reference, but the run's reference "
                f"is the policy of step train.sft_steps={self.config.train.sft_steps}: resume "
                f"with algorithm.use_kl_in_reward=false and actor.use_kl_loss=false, or restart")

    def close(self) -> None:
        """Stop the generation worker, then the event loop."""
        if not self.loop.is_closed():
            self.loop.run_until_complete(self.llm.aclose())
            self.loop.close()

    # -- one step ----------------------------------------------------------------------------------
    def train_step(self, step: int) -> dict[str, float]:
        """Run the stages of one step and return its metrics: an SFT update for the first
        ``train.sft_steps`` steps (:mod:`agentrl.trainers.warm_start`), PPO after them."""
        config, timer = self.config, StageTimer()
        metrics: dict[str, float] = {}
        if step <= config.train.sft_steps:
            with timer("sft"):
                metrics.update(self.warm_start.step(step))
            if step == config.train.sft_steps:
                self._end_warm_start()
            metrics.update(timer.metrics())
            return metrics
        with timer("rollout"):
            trajectories = self.rollout(self.train_presets, train_seeds(
                step, config.train.group_num, config.seed, config.train.pool),
                config.train.group_size,
                self.sampling, desc=f"step {step} rollout", branches=config.rollout.turn_branches)
        metrics.update(rollout_metrics(trajectories, split="train"))
        self._sample_episodes(trajectories, "train", step)
        metrics.update(collapse_metrics(trajectories, self.sampling.max_new_tokens))
        with timer("filter"):
            r = config.rollout
            if r.turn_branches:  # each turn's replies, compared with each other
                trajectories = turn_samples(trajectories)
                metrics.update(branch_metrics(trajectories))
            algo = config.algorithm
            # the discount between turns: gamma under gamma_unit=turn; a per-token gamma has no
            # per-turn equivalent, so turns are then compared and shaped undiscounted
            turn_gamma = algo.gamma if algo.gamma_unit == "turn" else 1.0
            metrics.update(uniform_group_metrics(trajectory_groups(trajectories)))
            kept = filter_groups(trajectories, r.filter_ratio, r.filter_mode)
            if algo.distance_shaping:  # first: a group whose shaping differs still compares
                kept = distance_shaping(kept, algo.distance_shaping, turn_gamma)
            if algo.skip_after_missed_moves:
                kept = leave_out_after_missed_moves(kept)
                flags = [out for t in kept for out in t.turns_left_out]
                metrics["train/turns_left_out"] = sum(flags) / max(1, len(flags))
            if r.drop_uniform_groups:
                kept = drop_uniform_groups(kept, r.drop_uniform_outcome)
        metrics["train/kept_trajectories"] = float(len(kept))
        if not kept:  # every group played alike: nothing to compare, no update
            metrics.update(timer.metrics())
            return metrics
        with timer("filter"):
            if algo.step_advantage_weight:
                kept = step_advantages(kept, turn_gamma)
            kept = normalize_returns(kept, r.grouping, r.norm_method)
            batch = to_batch(kept, self.pad_token_id, r.reward_placement,
                             state_ids=self.needs_board_ids)
            if algo.lost_group_advantage:
                batch["lost_group"] = lost_group_rows(batch["group_index"], kept)
        metrics["train/training_samples"] = float(batch["responses"].shape[0])
        # critic.pretrain_steps: the first PPO steps fit the critic to the policy's returns
        actor_learns = step > config.train.sft_steps + config.critic.pretrain_steps
        metrics.update(self.updater.update(batch, timer, step, update_actor=actor_learns))
        metrics.update(timer.metrics())
        return metrics

    def _end_warm_start(self) -> None:
        """PPO starts from the warm-started policy: the KL reference becomes it, and a critic
        with its own backbone copies it (both were copied from the untrained model); with
        ``actor.warm_optimizer`` PPO's AdamW takes over the warm start's moments."""
        if self.config.actor.warm_optimizer:
            carry_moments(self.warm_start.optim.state_dict(), self.actor_optim)
        self.warm_start.close()
        if self.reference is not None:
            self.reference.reset_to(self.actor)
        if self.critic is not None:
            self.critic.start_from(self.actor)

    @property
    def needs_goal_distances(self) -> bool:
        """Whether the rollout asks the oracle its distance after every turn (a search each)."""
        algo = self.config.algorithm
        return bool(algo.distance_shaping) or algo.skip_after_missed_moves

    @property
    def needs_board_ids(self) -> bool:
        """Whether a batch carries each reply's board id (``state_ids``): sibling values read
        them, and only a critic's values are blended."""
        return self.critic is not None and self.config.critic.sibling_pseudocount is not None

    def rollout(self, presets, seeds, group_size, sampling, desc: str, branches: int = 0):
        """Play ``group_size`` episodes of every seed in ``seeds`` with the current weights (one
        group a seed), a progress bar titled ``desc``; ``branches`` > 0 samples that many replies
        at every turn (``rollout.turn_branches``). Returns the trajectories, group by group."""
        self.llm.clear_prefix_cache()  # its keys/values are of the weights before the update
        total = len(seeds) * group_size
        with tqdm(total=total, desc=desc, unit="ep", leave=False) as bar:
            return self.loop.run_until_complete(run_groups(
                presets, self.llm, self.tokenizer, sampling, group_num=len(seeds),
                group_size=group_size, seeds=seeds,
                max_context_tokens=self.config.rollout.max_context_tokens,
                on_episode_done=lambda _: bar.update(1),
                goal_distances=self.needs_goal_distances,
                branches=branches))
