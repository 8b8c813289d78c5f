"""PPO with a critic on one process (CPU or one CUDA GPU): the local engine's trainer.

    from agentrl.config import compose_config
    from agentrl.trainers.local import LocalTrainer
    LocalTrainer(compose_config(["train.total_steps=4"])).fit()

One training step is a short sequence of named stages (each timed as ``timing/<stage>_s``):

1. ``rollout``: ``group_num x group_size`` episodes of the training presets on new training
   seeds (the seeds depend only on the step, so a resumed run plays the same games), sampled
   by the actor through :class:`agentrl.engines.BatchingLLM`.
2. ``filter``: in-group std filtering and return normalization, then :func:`to_batch`.
3. ``old_logprobs`` / ``ref`` / ``values``: the actor's log-probs of the sampled tokens (the PPO
   ratio's denominator), the frozen reference's (only when a KL term is on; the policy PPO
   starts from, :mod:`agentrl.trainers.reference`) and the critic's
   values, without gradients. With one epoch over one mini-batch the old log-probs, and a
   separate critic's values, are not computed here: the updates' own first passes are at the
   old weights, and their detached outputs are the old ones (see
   :meth:`LocalTrainer._first_pass_is_old` and :meth:`LocalTrainer._critic_pass_gives_values`).
4. ``advantages``: optional KL penalty in the reward, then GAE (or a critic-free estimator).
5. ``critic`` then ``actor``: ``ppo_epochs`` passes over shuffled mini-batches, each the sum of
   micro-batch gradients (exact accumulation, see :mod:`agentrl.trainers.ppo`), grad-norm
   clipping, AdamW; the schedulers' linear warm-up advances once per step. Inside a
   mini-batch the rows are ordered by prompt, so a micro-batch holds a group's members, and the
   prompt tokens its rows share run once (``actor.shared_prefix_tokens``,
   :mod:`agentrl.trainers.shared_prefix`; the same gradients, in every pass). A loss metric
   (``actor/pg_loss``, ``actor/entropy``, ``actor/kl_loss``, ``critic/vf_loss``) is the
   mini-batch's aggregated term under ``loss_agg_mode``, averaged over the step's mini-batches.
   The actor's terms leave out the tokens a constraint forced (one allowed id: no choice, log-prob
   0 under every policy), which would shrink the step and the entropy by their share
   (:func:`agentrl.trainers.policy.choice_mask`).

Precision: the weights stay float32; ``model.dtype: bfloat16`` runs the sampler's and the
trainer's forward passes under autocast (:mod:`agentrl.models.precision`), so AdamW updates
float32 masters and the sampled and recomputed log-probs come from the same arithmetic.
``model.gradient_checkpointing`` recomputes each decoder layer's activations in the backward
pass of the update (:func:`agentrl.trainers.policy.checkpointing`), with dropout still off.

Validation (greedy, held-out seeds and presets) runs before training and every ``test_freq``
steps; a checkpoint is written every ``save_freq`` steps and at the end; ``resume=auto``
continues from the newest complete checkpoint with the same run id and metric history.
Every step also records ``trainer.log_episodes`` finished episodes per split, turn by turn, in
``<run_dir>/episodes/step_N.jsonl`` (:mod:`agentrl.trainers.episode_log`).

Guards (:mod:`agentrl.trainers.guards`): a non-finite reward, advantage or loss skips that
update (``guard/skipped_updates``) with a warning; collapse signs are measured every step and
warned about (echo-trap replies, entropy, reply length).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from tqdm.auto import tqdm

from agentrl.engines import BatchingLLM, SamplingParams
from agentrl.envs.splits import train_seeds
from agentrl.evaluation import evaluate
from agentrl.models import load_model
from agentrl.models.precision import compute_precision
from agentrl.rollout import (branch_metrics, distance_shaping, drop_uniform_groups,
                             filter_groups, normalize_returns, rollout_metrics, run_groups,
                             step_advantages, to_batch, turn_samples)
from agentrl.rollout.episode_record import episode_record, sample_episodes
from agentrl.trainers import ppo
from agentrl.trainers.checkpoint import (
    capture_rng_state, load_checkpoint, restore_rng_state, restore_weights, resume_checkpoint,
    save_checkpoint,
)
from agentrl.trainers.device import resolve_device
from agentrl.trainers.episode_log import EpisodeLog
from agentrl.trainers.guards import (
    all_finite, collapse_metrics, logprob_gap, warn_if_entropy_collapsed,
)
from agentrl.trainers.microbatch import micro_order, micro_rows, pad_responses
from agentrl.trainers.moments import carry_moments, saved_moments
from agentrl.trainers.plots import plot_learning_curves, reference_success
from agentrl.trainers.reference import Reference
from agentrl.trainers.policy import ValueModel, checkpointing, choice_mask, response_logprobs
from agentrl.trainers.shared_prefix import SharedPrefix, plan_prefix_runs
from agentrl.trainers.tracking import RunTracker
from agentrl.trainers.update_loop import UpdateShape, run_epochs
from agentrl.trainers.warm_start import WarmStart

__all__ = ["LocalTrainer", "RunResult", "StageTimer"]

log = logging.getLogger("agentrl.train")

class StageTimer:
    """Seconds per named stage of one step, as ``timing/<stage>_s`` metrics."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        out = {f"timing/{name}_s": s for name, s in self.seconds.items()}
        out["timing/step_s"] = sum(self.seconds.values())
        return out


@dataclass(frozen=True)
class RunResult:
    """Where a finished run left its outputs."""

    run_dir: Path
    run_id: str
    step: int
    checkpoint: Path | None
    metrics: Path
    plot: Path | None


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
        self._first_pass_logprobs: torch.Tensor | None = None  # see _first_pass_is_old
        self._first_pass_values: torch.Tensor | None = None  # see _critic_pass_gives_values
        self._setup_actor()
        self.critic = (ValueModel.from_actor(self.actor, share_backbone=config.critic.share_backbone)
                       if config.algorithm.adv_estimator == "gae" else None)
        self.actor_optim, self.actor_sched = self._optimizer(
            [p for p in self.actor.parameters() if p.requires_grad], config.actor)
        if config.actor.warm_optimizer and not config.train.sft_steps:  # an agentrl sft model
            carry_moments(saved_moments(config.model.name), self.actor_optim)
        self.critic_optim = self.critic_sched = None
        if self.critic is not None:
            self.critic_optim, self.critic_sched = self._optimizer(
                self.critic.trainable_parameters(), config.critic)
        self.llm = BatchingLLM(self.actor, self.tokenizer, max_batch=config.rollout.max_batch,
                               max_wait_ms=config.rollout.max_wait_ms, device=self.device,
                               seed=config.seed,
                               prefix_cache_tokens=config.rollout.prefix_cache_tokens,
                               compute_dtype=self.compute_dtype)
        self.loop = asyncio.new_event_loop()
        self.warm_start = (WarmStart(config, self.actor, self.tokenizer, self.loop,
                                     self.pad_token_id) if config.train.sft_steps else None)
        self.step = 0
        self.episode_samples: list[dict[str, Any]] = []
        """Episode records of the step being run (``trainer.log_episodes`` per split)."""
        r = config.rollout
        self.sampling = SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                                       max_new_tokens=r.max_new_tokens,
                                       constrained_actions=config.constrained_actions,
                                       return_features=self._critic_on_backbone)
        val_tokens = config.val.max_new_tokens or r.max_new_tokens
        self.val_sampling = SamplingParams(greedy=True, max_new_tokens=val_tokens,
                                           constrained_actions=config.constrained_actions)
        self.loss_settings = ppo.LossSettings(
            policy_loss=config.actor.policy_loss, clip_ratio_low=config.actor.clip_ratio_low,
            clip_ratio_high=config.actor.clip_ratio_high, clip_ratio_c=config.actor.clip_ratio_c,
            loss_agg_mode=config.actor.loss_agg_mode)

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
        self.reference = Reference(self.actor) if self._needs_ref() else None
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
            while self.step < total:
                step = self.step + 1
                self.episode_samples = []
                metrics = self.train_step(step)
                self.step = step
                last = step == total or (deadline is not None and time.monotonic() >= deadline)
                warm_start_done = step == config.train.sft_steps
                if freq and (step % freq == 0 or last or warm_start_done):
                    metrics.update(self.validate())
                # before the save: a saved step is always logged
                tracker.log(step, metrics, self.episode_samples)
                episode_log.write(step, self.episode_samples)
                if last or (config.trainer.save_freq and step % config.trainer.save_freq == 0):
                    last_saved = self.save(run_dir)
                if last:
                    break
        plot = None
        if config.trainer.plot and (run_dir / "metrics.jsonl").exists():
            references = reference_success(run_dir, list(self.val_presets),
                                           config.val.group_num)
            plot = plot_learning_curves(run_dir / "metrics.jsonl", run_dir / "learning_curves.png",
                                        references=references)
        return RunResult(run_dir=run_dir, run_id=tracker.run_id, step=self.step,
                         checkpoint=last_saved, metrics=run_dir / "metrics.jsonl", plot=plot)

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

    def save(self, run_dir: Path) -> Path:
        """A complete checkpoint of this step (see :mod:`agentrl.trainers.checkpoint`)."""
        state = {
            "step": self.step,
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
            state["critic_optim"] = self.critic_optim.state_dict()
            state["critic_sched"] = self.critic_sched.state_dict()
        return save_checkpoint(run_dir, self.step, models={"actor": (self.actor, self.tokenizer)},
                               tensors=tensors, config=self.config.to_dict(),
                               keep_last=self.config.trainer.keep_last)

    def _restore(self, path: Path) -> None:
        loaded = load_checkpoint(path, map_location=self.device)
        restore_weights(self.actor, loaded.model_dirs["actor"])
        state = loaded.tensors["trainer_state"]
        self.actor_optim.load_state_dict(state["actor_optim"])
        self.actor_sched.load_state_dict(state["actor_sched"])
        if self.critic is not None:
            self.critic.load_state_dict(loaded.tensors["critic"])
            self.critic_optim.load_state_dict(state["critic_optim"])
            self.critic_sched.load_state_dict(state["critic_sched"])
        restore_rng_state(state["rng"], {"llm": self.llm.generator})
        self.step = int(state["step"])
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
            trajectories = self._rollout(self.train_presets, train_seeds(
                step, config.train.group_num, config.seed), config.train.group_size,
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
            kept = filter_groups(trajectories, r.filter_ratio, r.filter_mode)
            if algo.distance_shaping:  # first: a group whose shaping differs still compares
                kept = distance_shaping(kept, algo.distance_shaping, turn_gamma)
            if r.drop_uniform_groups:
                kept = drop_uniform_groups(kept)
        metrics["train/kept_trajectories"] = float(len(kept))
        if not kept:  # every group played alike: nothing to compare, no update
            metrics.update(timer.metrics())
            return metrics
        with timer("filter"):
            if algo.step_advantage_weight:
                kept = step_advantages(kept, turn_gamma)
            kept = normalize_returns(kept, r.grouping, r.norm_method)
            batch = to_batch(kept, self.pad_token_id, r.reward_placement)
        metrics["train/training_samples"] = float(batch["responses"].shape[0])
        metrics.update(self._update(batch, timer))
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

    def _rollout(self, presets, seeds, group_size, sampling, desc: str, branches: int = 0):
        self.llm.clear_prefix_cache()  # its keys/values are of the weights before the update
        total = len(seeds) * group_size
        with tqdm(total=total, desc=desc, unit="ep", leave=False) as bar:
            return self.loop.run_until_complete(run_groups(
                presets, self.llm, self.tokenizer, sampling, group_num=len(seeds),
                group_size=group_size, seeds=seeds,
                max_context_tokens=self.config.rollout.max_context_tokens,
                on_episode_done=lambda _: bar.update(1),
                goal_distances=bool(self.config.algorithm.distance_shaping),
                branches=branches))

    @torch.no_grad()
    def _score(self, batch: dict[str, torch.Tensor], timer: StageTimer, *,
               old_logprobs: bool = True, values: bool = True) -> dict[str, torch.Tensor]:
        """Old log-probs and values (unless ``old_logprobs``/``values`` are False: the updates'
        first passes give them) and reference log-probs over the batch, micro-batch by
        micro-batch. A critic on the actor's backbone gets its values, and its update's inputs
        (``critic_features``: the backbone does not change before the critic update), from the
        rollout's features when the batch has them (the engine's pass at the same weights),
        else from the old-log-prob pass."""
        size = self.config.actor.micro_batch_size
        parts: dict[str, list[torch.Tensor]] = defaultdict(list)
        n, length = batch["responses"].shape
        temperature, share = self._temperature(), self.config.actor.shared_prefix_tokens
        separate_critic = self.critic is not None and not self._critic_on_backbone
        scored: dict[str, torch.Tensor] = {}
        # a critic on the backbone reads the rollout's features, else the old-log-prob pass's
        shared = self._critic_on_backbone and "rollout_features" not in batch
        if self._critic_on_backbone and not shared:  # no backbone pass for the critic
            with timer("values"):
                features = batch["rollout_features"]
                scored["values"] = torch.cat([
                    self.critic.values_from(features[start:start + size].to(self.device)).cpu()
                    for start in range(0, n, size)])
                scored["critic_features"] = features
        order = micro_order(batch, torch.arange(n), self.config.actor.shared_prefix_tokens)
        for run in plan_prefix_runs(batch, order, size, share):
            for rows in run.micro_batches:
                micro = micro_rows(batch, rows)
                if old_logprobs or shared:
                    with timer("old_logprobs"), self._precision():
                        old, _, features = response_logprobs(
                            self.actor, micro, temperature=temperature, with_features=shared,
                            shared_prefix_tokens=share, prefix=run.prefix("actor"),
                            head_mask=micro["response_mask"])
                        parts["old"].append(pad_responses(old, length))
                if shared:  # the critic reads this pass's features: no second backbone pass
                    with timer("values"):
                        parts["values"].append(pad_responses(self.critic.values_from(features),
                                                             length))
                        parts["critic_features"].append(pad_responses(features, length))
                if self._needs_ref():
                    with timer("ref"), self._reference() as ref, self._precision():
                        ref_logprobs = response_logprobs(ref, micro, temperature=temperature,
                                                         shared_prefix_tokens=share,
                                                         prefix=run.prefix("ref"),
                                                         head_mask=micro["response_mask"])[0]
                        parts["ref"].append(pad_responses(ref_logprobs, length))
                if separate_critic and values:
                    with timer("values"), self._precision():
                        parts["values"].append(pad_responses(
                            self.critic(micro, shared_prefix_tokens=share,
                                        prefix=run.prefix("critic")), length))
            run.backward()  # frees the run's prefixes (no graph here)
        back = torch.argsort(order)  # batch order again
        return {**scored, **{k: torch.cat(v)[back].cpu() for k, v in parts.items()}}

    def _first_pass_is_old(self, n: int, rollout_features: bool = False) -> bool:
        """Whether the actor's update is one pass over one mini-batch of the ``n`` trajectories.
        Its forward then runs at the old weights, so that pass's detached log-probs are the old
        ones (the ratio is exactly 1 there) and a separate no-grad pass would compute them again.
        Not when the advantages need the old log-probs first (``use_kl_in_reward``), nor with a
        critic on the actor's backbone whose values come from the old-log-prob pass's features
        (GAE needs them before the update): only when the rollout returned the features
        (``rollout_features``)."""
        config = self.config
        one_mini_batch = (config.actor.ppo_mini_batch_size or n) >= n
        return (config.actor.ppo_epochs == 1 and one_mini_batch
                and not config.algorithm.use_kl_in_reward
                and (rollout_features or not self._critic_on_backbone))

    @property
    def _critic_on_backbone(self) -> bool:
        """A critic that reads the actor's backbone: the rollout then returns the engine's
        features, and its values come from them without a backbone pass (:meth:`_score`)."""
        return self.critic is not None and self.critic.shared

    def _temperature(self) -> float:
        t = self.config.rollout.temperature
        return t if t > 0 else 1.0

    def _precision(self):
        """Autocast to ``model.dtype`` (a no-op in float32): as the sampler computes."""
        return compute_precision(self.device, self.compute_dtype)

    def _needs_ref(self) -> bool:
        return self.config.algorithm.use_kl_in_reward or self.config.actor.use_kl_loss

    @contextlib.contextmanager
    def _reference(self):
        with self.reference(self.actor) as ref:
            yield ref

    def _value_clip(self, returns: torch.Tensor, mask: torch.Tensor) -> float:
        """The value clip of this step: ``critic.cliprange_value``, times the step's return scale
        (max(1, RMS of the returns over model tokens)) when ``critic.value_clip_scale: returns``,
        so a critic can follow returns of any size at the same relative pace."""
        critic = self.config.critic
        if critic.value_clip_scale == "absolute":
            return critic.cliprange_value
        rms = float(((returns ** 2) * mask).sum().div(mask.sum().clamp(min=1)).sqrt())
        return critic.cliprange_value * max(1.0, rms)

    def _update(self, batch: dict[str, torch.Tensor], timer: StageTimer) -> dict[str, float]:
        config, algo = self.config, self.config.algorithm
        metrics: dict[str, float] = {}
        mask = batch["response_mask"].float()
        n = batch["responses"].shape[0]
        first_pass_is_old = self._first_pass_is_old(n, "rollout_features" in batch)
        critic_pass_values = self._critic_pass_gives_values(n, batch["episode_index"])
        scored = self._score(batch, timer, old_logprobs=not first_pass_is_old,
                             values=not critic_pass_values)
        with timer("advantages"):
            rewards = batch["token_level_rewards"].float()
            if algo.use_kl_in_reward:
                rewards, kl = ppo.rewards_with_kl(rewards, mask, scored["old"], scored["ref"],
                                                  kl_coef=algo.kl_coef, kl_penalty=algo.kl_penalty)
                chosen = choice_mask(batch)  # a forced token's KL is 0: not in the mean
                metrics["actor/reward_kl"] = float(kl.sum() / chosen.sum().clamp(min=1))
        batch = {**batch, "row": torch.arange(n), "rewards": rewards}
        skipped = 0
        if critic_pass_values and all_finite(rewards):  # the critic's pass gives the values
            # NaN until a micro-batch writes them: rows a stopped pass never reached have no
            # values, and GAE on them is non-finite, so the guard below skips the step
            self._first_pass_values = torch.full_like(mask, float("nan"))
            # the clip is around this pass's own values: it cannot bind
            critic_metrics, skipped = self._critic_update(batch, timer,
                                                          config.critic.cliprange_value)
            metrics.update(critic_metrics)
            scored["values"] = self._first_pass_values
        advantages = returns = None
        if all_finite(rewards):
            with timer("advantages"):
                advantages, returns = self._advantages(rewards, mask, scored.get("values"),
                                                       batch["group_index"], batch["episode_index"])
        if advantages is None or not all_finite(advantages, returns):
            log.warning("non-finite rewards or advantages: this step's update is skipped")
            metrics["guard/skipped_updates"] = 1.0
            return metrics
        if "step_advantages" in batch:  # GiGPO: the turn's standing among the same board's turns
            advantages = advantages + algo.step_advantage_weight * batch["step_advantages"] * mask
            metrics["actor/step_advantages_nonzero"] = float(
                (batch["step_advantages"] != 0).float().sum() / mask.sum().clamp(min=1))
        batch.update(advantages=advantages, returns=returns)
        if first_pass_is_old:  # filled by the actor's update, row by row (NaN: not reached)
            self._first_pass_logprobs = torch.full_like(mask, float("nan"))
        else:
            batch["old_logprobs"] = scored["old"]
        if "ref" in scored:
            batch["ref_logprobs"] = scored["ref"]
        for key in ("values", "critic_features"):
            if key in scored:
                batch[key] = scored[key]
        metrics["critic/returns_mean"] = float((returns * mask).sum() / mask.sum().clamp(min=1))
        metrics["actor/advantages_mean"] = float((advantages * mask).sum() / mask.sum().clamp(min=1))
        if self.critic is not None and not critic_pass_values:
            clip = self._value_clip(returns, mask)
            metrics["critic/cliprange_value"] = clip
            critic_metrics, skipped = self._critic_update(batch, timer, clip)
            metrics.update(critic_metrics)
        with timer("actor"):
            actor_metrics, s = self._epochs(batch, self._actor_micro, self.actor_optim,
                                            [p for p in self.actor.parameters() if p.requires_grad],
                                            config.actor.grad_clip, config.actor.ppo_epochs, "actor")
            metrics.update(actor_metrics)
            skipped += s
        if first_pass_is_old:
            scored["old"] = self._first_pass_logprobs
        if all_finite(scored["old"]):  # a first pass stopped by a non-finite loss has gaps
            metrics.update(logprob_gap(batch["rollout_log_probs"], scored["old"], mask))
        self.actor_sched.step()
        if self.critic_sched is not None:
            self.critic_sched.step()
        metrics["actor/lr"] = self.actor_sched.get_last_lr()[0]
        metrics["guard/skipped_updates"] = float(skipped)
        warn_if_entropy_collapsed(metrics.get("actor/entropy"))
        return metrics

    def _advantages(self, rewards: torch.Tensor, mask: torch.Tensor, values: torch.Tensor | None,
                    group_index: torch.Tensor, episode_index: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        algo = self.config.algorithm
        return ppo.compute_advantages(
            algo.adv_estimator, rewards, mask, values=values, group_index=group_index.numpy(),
            gamma=algo.gamma, lam=algo.lam, norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
            episode_index=episode_index, gamma_unit=algo.gamma_unit)

    def _critic_pass_gives_values(self, n: int, episode_index: torch.Tensor | None = None
                                  ) -> bool:
        """Whether a critic with its own backbone updates in one pass over one mini-batch of the
        ``n`` trajectories. Its forward then runs at the old weights, so that pass's detached
        values are the ones GAE needs, and a separate no-grad values pass would compute them
        again. A trajectory's returns depend on its own values and rewards only, so the update
        computes them micro-batch by micro-batch; the batch's (whitened) advantages follow it.
        Only when every episode is one row (``episode_index`` unique, when given): an episode
        split into context windows needs its later rows' values for its returns."""
        config = self.config
        epochs = config.critic.ppo_epochs or config.actor.ppo_epochs
        one_row_per_episode = (episode_index is None
                               or len(torch.unique(episode_index)) == len(episode_index))
        return (one_row_per_episode and self.critic is not None and not self.critic.shared
                and epochs == 1 and (config.actor.ppo_mini_batch_size or n) >= n)

    def _critic_update(self, batch, timer: StageTimer, clip: float) -> tuple[dict[str, float], int]:
        config = self.config
        with timer("critic"):
            return self._epochs(batch, functools.partial(self._critic_micro, cliprange_value=clip),
                                self.critic_optim, self.critic.trainable_parameters(),
                                config.critic.grad_clip,
                                config.critic.ppo_epochs or config.actor.ppo_epochs, "critic")

    def _epochs(self, batch, micro_loss, optim, params, grad_clip: float, epochs: int,
                role: str) -> tuple[dict[str, float], int]:
        """``epochs`` passes of shuffled mini-batches of ``role``'s loss
        (:func:`agentrl.trainers.update_loop.run_epochs`), cut by the actor's batch sizes and
        shuffled by the run's seed and step; returns mean metrics and skipped updates."""
        actor = self.config.actor
        shape = UpdateShape(epochs=epochs, mini_batch_size=actor.ppo_mini_batch_size,
                            micro_batch_size=actor.micro_batch_size,
                            shared_prefix_tokens=actor.shared_prefix_tokens, grad_clip=grad_clip)
        generator = torch.Generator().manual_seed(self.config.seed * 1_000_003 + self.step)
        return run_epochs(batch, micro_loss, optim, params, shape,
                          loss_mask=self._loss_mask(batch, role), generator=generator, role=role)

    @staticmethod
    def _loss_mask(batch: dict[str, torch.Tensor], role: str) -> torch.Tensor:
        """The tokens ``role``'s loss averages over: the actor's leave out the tokens a constraint
        forced (:func:`choice_mask`), the critic's are all model tokens."""
        return choice_mask(batch) if role == "actor" else batch["response_mask"].float()

    def _actor_micro(self, micro: dict[str, torch.Tensor], size: ppo.MiniBatchSize,
                     prefix: SharedPrefix | None = None):
        config = self.config.actor
        device = self.device
        mask = self._loss_mask(micro, "actor").to(device)
        with self._precision(), checkpointing(self.actor):
            logprobs, entropy, _ = response_logprobs(
                self.actor, micro, temperature=self._temperature(), with_entropy=True,
                entropy_grad=config.entropy_coeff != 0,
                shared_prefix_tokens=config.shared_prefix_tokens, prefix=prefix,
                head_mask=micro["response_mask"])
        old = micro.get("old_logprobs")
        if old is None:  # the first pass runs at the old weights: its log-probs are the old ones
            old = logprobs.detach()
            width = self._first_pass_logprobs.shape[1]
            self._first_pass_logprobs[micro["row"]] = pad_responses(old.cpu(), width)
        pg_loss, stats = ppo.policy_loss(logprobs, old.to(device),
                                         micro["advantages"].to(device), mask,
                                         self.loss_settings, size)
        entropy_term = ppo.entropy_bonus(entropy, mask, config.loss_agg_mode, size)
        loss = pg_loss - config.entropy_coeff * entropy_term
        terms = {"actor/pg_loss": float(pg_loss.detach()),
                 "actor/entropy": float(entropy_term.detach())}
        if config.use_kl_loss:
            kl = ppo.kl_loss(logprobs, micro["ref_logprobs"].to(device), mask,
                             config.kl_loss_type, config.loss_agg_mode, size)
            loss = loss + config.kl_loss_coef * kl
            terms["actor/kl_loss"] = float(kl.detach())
        return loss, terms, stats

    def _critic_micro(self, micro: dict[str, torch.Tensor], size: ppo.MiniBatchSize,
                      prefix: SharedPrefix | None = None, *, cliprange_value: float):
        device = self.device
        mask = micro["response_mask"].to(device).float()
        features = micro.get("critic_features")
        if features is None:
            with self._precision(), checkpointing(self.critic):
                vpreds = self.critic(
                    micro, shared_prefix_tokens=self.config.actor.shared_prefix_tokens,
                    prefix=prefix)
        else:
            vpreds = self.critic.values_from(features.to(device))
        old, returns = micro.get("values"), micro.get("returns")
        if old is None:  # the first pass runs at the old weights: its values are the old ones
            old = vpreds.detach()
            width = self._first_pass_values.shape[1]
            self._first_pass_values[micro["row"]] = pad_responses(old.cpu(), width)
            returns = self._advantages(micro["rewards"], micro["response_mask"].float(),
                                       old.cpu(), micro["group_index"], micro["episode_index"])[1]
        loss, clipfrac = ppo.value_loss(vpreds, returns.to(device), old.to(device), mask,
                                        cliprange_value=cliprange_value,
                                        mode=self.config.actor.loss_agg_mode, size=size)
        vpred_mean = float((vpreds.detach() * mask).sum() / mask.sum().clamp(min=1))
        return loss, {"critic/vf_loss": float(loss.detach())}, {"critic/vf_clipfrac": clipfrac,
                                                                "critic/vpred_mean": vpred_mean}
