"""The update half of a PPO step: score a batch, compute its advantages, update critic and actor.

    updater = PPOUpdate(config, actor=..., critic=..., reference=..., ...)
    metrics = updater.update(batch, timer, step)

Stages, each timed by the trainer's :class:`StageTimer` (``timing/<stage>_s``):

- ``old_logprobs`` / ``ref`` / ``values``: the actor's log-probs of the sampled tokens (the PPO
  ratio's denominator), the frozen reference's (only when a KL term is on) and the critic's
  values, without gradients. With one epoch over one mini-batch the old log-probs, and a
  separate critic's values, are not computed here: the updates' own first passes are at the old
  weights, and their detached outputs are the old ones (:meth:`PPOUpdate._first_pass_is_old`,
  :meth:`PPOUpdate._critic_pass_gives_values`).
- ``advantages``: optional KL penalty in the reward, then GAE (values optionally blended with
  siblings') or a critic-free estimator, plus GiGPO's step level and the push on groups no
  episode won (``algorithm.step_advantage_weight``, ``algorithm.lost_group_advantage``).
- ``critic`` then ``actor``: ``ppo_epochs`` passes over shuffled mini-batches
  (:func:`agentrl.trainers.update_loop.run_epochs`), each the sum of micro-batch gradients
  (exact accumulation, see :mod:`agentrl.trainers.ppo`), grad-norm clipping, AdamW. Inside a
  mini-batch the rows are ordered by prompt, so a micro-batch holds a group's members, and the
  prompt tokens its rows share run once (``actor.shared_prefix_tokens``,
  :mod:`agentrl.trainers.shared_prefix`; the same gradients, in every pass). A loss metric
  (``actor/pg_loss``, ``actor/entropy``, ``actor/kl_loss``, ``critic/vf_loss``) is the
  mini-batch's aggregated term under ``loss_agg_mode``, averaged over the step's mini-batches.
  The actor's terms leave out the tokens a constraint forced (one allowed id: no choice,
  log-prob 0 under every policy), which would shrink the step and the entropy by their share
  (:func:`agentrl.trainers.policy.choice_mask`).

The trainer owns the models and optimizers (it builds, saves and restores them); this class only
reads them, so a restored or warm-started model is the one the next update trains.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections import defaultdict
from typing import Any

import torch

from agentrl.models.precision import compute_precision
from agentrl.trainers import ppo
from agentrl.trainers.guards import all_finite, logprob_gap, warn_if_entropy_collapsed
from agentrl.trainers.microbatch import micro_order, micro_rows, pad_responses
from agentrl.trainers.policy import ValueModel, checkpointing, choice_mask, response_logprobs
from agentrl.trainers.reference import Reference
from agentrl.trainers.shared_prefix import SharedPrefix, plan_prefix_runs
from agentrl.trainers.sibling_values import blend, sibling_returns
from agentrl.trainers.timing import StageTimer
from agentrl.trainers.update_loop import KL_TERM, UpdateShape, run_epochs, trajectory_count
from agentrl.trainers.value_fit import RidgeValueFit

__all__ = ["PPOUpdate", "explained_variance", "pooled_explained_variance",
           "value_error_moments"]

log = logging.getLogger("agentrl.train")


def explained_variance(returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 - Var(returns - values) / Var(returns)`` over model tokens, as verl logs it
    (``critic/vf_explained_var``): 1 is a critic that predicts every return, 0 one no better
    than their mean, below 0 one that adds noise; NaN when the returns are all equal."""
    chosen = mask.bool()
    target, predicted = returns[chosen].float(), values[chosen].float()
    if target.numel() < 2 or float(target.var()) < 1e-8:  # equal returns: nothing to explain
        return float("nan")
    return float(1.0 - (target - predicted).var() / (target.var() + 1e-5))


def value_error_moments(returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
                        ) -> dict[str, float]:
    """The step's squared value error, the returns' variance and the token count (model
    tokens): a run's explained variance pooled over steps is ``1 - sum(n * mse) / sum(n *
    (var + (mean - pooled mean)^2))``, which a batch of all-equal returns does not swamp the way
    it swamps that step's own ratio (:func:`pooled_explained_variance`)."""
    chosen = mask.bool()
    target, predicted = returns[chosen].double(), values[chosen].double()
    return {"critic/value_mse": float(((target - predicted) ** 2).mean()),
            "critic/returns_var": float(target.var(unbiased=False)),
            "critic/tokens": float(target.numel())}


def pooled_explained_variance(records: list[dict[str, float]]) -> float | None:
    """``1 - (squared value error) / (returns' variance)`` over every model token of the steps
    in ``records`` (their ``critic/returns_mean``, ``critic/returns_var``, ``critic/value_mse``
    and ``critic/tokens``), errors measured before each step's update; None without them."""
    rows = [r for r in records if all(r.get(k) is not None for k in (
        "critic/returns_mean", "critic/returns_var", "critic/value_mse", "critic/tokens"))]
    total = sum(r["critic/tokens"] for r in rows)
    if not total:
        return None
    mean = sum(r["critic/tokens"] * r["critic/returns_mean"] for r in rows) / total
    variance = sum(r["critic/tokens"] * (r["critic/returns_var"]
                                         + (r["critic/returns_mean"] - mean) ** 2)
                   for r in rows) / total
    error = sum(r["critic/tokens"] * r["critic/value_mse"] for r in rows) / total
    return 1.0 - error / variance if variance > 0 else None


class PPOUpdate:
    """The critic's and the actor's update from one step's batch; see the module docstring."""

    def __init__(self, config: Any, *, device: torch.device, actor: torch.nn.Module,
                 critic: ValueModel | None, reference: Reference | None,
                 actor_optim: torch.optim.Optimizer, actor_sched: Any,
                 critic_optim: torch.optim.Optimizer | None, critic_sched: Any,
                 compute_dtype: str | None):
        self.config = config
        self.device = device
        self.actor, self.critic, self.reference = actor, critic, reference
        self.actor_optim, self.actor_sched = actor_optim, actor_sched
        self.critic_optim, self.critic_sched = critic_optim, critic_sched
        self.compute_dtype = compute_dtype
        self.step = 0
        self._first_pass_logprobs: torch.Tensor | None = None  # see _first_pass_is_old
        self._first_pass_values: torch.Tensor | None = None  # see _critic_pass_gives_values
        self.value_fit = (RidgeValueFit(config.critic.fit_window)  # critic.head_fit: ridge
                          if critic is not None and config.critic.head_fit == "ridge" else None)
        self._observed_rows: set[int] = set()  # see _critic_micro
        self._warned_no_boards = False  # see _with_sibling_values
        actor_settings = config.actor
        self.loss_settings = ppo.LossSettings(
            policy_loss=actor_settings.policy_loss, clip_ratio_low=actor_settings.clip_ratio_low,
            clip_ratio_high=actor_settings.clip_ratio_high,
            clip_ratio_c=actor_settings.clip_ratio_c, loss_agg_mode=actor_settings.loss_agg_mode)

    def update(self, batch: dict[str, torch.Tensor], timer: StageTimer, step: int = 0, *,
               update_actor: bool = True) -> dict[str, float]:
        """Score ``batch``, compute its advantages, update the critic then the actor; metrics.
        ``step`` seeds the mini-batch shuffle (the same step shuffles alike after a resume);
        ``update_actor=False`` updates the critic only (``critic.pretrain_steps``), and the
        actor's learning-rate schedule waits with it."""
        self.step = step
        config, algo = self.config, self.config.algorithm
        metrics: dict[str, float] = {}
        mask = batch["response_mask"].float()
        trajectories = trajectory_count(batch)
        first_pass_is_old = self._first_pass_is_old(trajectories, "rollout_features" in batch)
        critic_pass_values = self._critic_pass_gives_values(trajectories, batch["episode_index"])
        needs_old = update_actor or algo.use_kl_in_reward
        scored = self._score(batch, timer, old_logprobs=needs_old and not first_pass_is_old,
                             values=not critic_pass_values)
        with timer("advantages"):
            rewards = batch["token_level_rewards"].float()
            if algo.use_kl_in_reward:
                rewards, kl = ppo.rewards_with_kl(rewards, mask, scored["old"], scored["ref"],
                                                  kl_coef=algo.kl_coef, kl_penalty=algo.kl_penalty)
                chosen = choice_mask(batch)  # a forced token's KL is 0: not in the mean
                metrics["actor/reward_kl"] = float(kl.sum() / chosen.sum().clamp(min=1))
        batch = {**batch, "row": torch.arange(mask.shape[0]), "rewards": rewards}
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
        advantages = returns = to_go = None
        gae_values = scored.get("values")
        blended = gae_values is not None and bool(config.critic.sibling_pseudocount)
        if all_finite(rewards):
            with timer("advantages"):
                if gae_values is not None:
                    to_go = self._returns_to_go(batch, mask)
                if blended:
                    gae_values = self._with_sibling_values(batch, gae_values, to_go, metrics)
                advantages, returns = self._advantages(rewards, mask, gae_values,
                                                       batch["group_index"], batch["episode_index"])
        if advantages is None or not all_finite(advantages, returns):
            log.warning("non-finite rewards or advantages: this step's update is skipped")
            metrics["guard/skipped_updates"] = 1.0
            return metrics
        if "step_advantages" in batch:  # GiGPO: the turn's standing among the same board's turns
            advantages = advantages + algo.step_advantage_weight * batch["step_advantages"] * mask
            metrics["actor/step_advantages_nonzero"] = float(
                (batch["step_advantages"] != 0).float().sum() / mask.sum().clamp(min=1))
        if "lost_group" in batch:  # a game every episode lost: pushed down as a whole
            lost = batch["lost_group"][:, None].to(mask) * mask
            advantages = advantages + algo.lost_group_advantage * lost
            metrics["actor/lost_group_share"] = float(lost.sum() / mask.sum().clamp(min=1))
        batch.update(advantages=advantages, returns=returns)
        if update_actor and first_pass_is_old:  # filled by the actor's update, row by row
            self._first_pass_logprobs = torch.full_like(mask, float("nan"))  # NaN: not reached
        elif update_actor:
            batch["old_logprobs"] = scored["old"]
        if "ref" in scored:
            batch["ref_logprobs"] = scored["ref"]
        for key in ("values", "critic_features"):
            if key in scored:
                batch[key] = scored[key]
        metrics["critic/returns_mean"] = float((returns * mask).sum() / mask.sum().clamp(min=1))
        if gae_values is not None:  # the values GAE read: the critic's, or blended
            metrics["critic/vf_explained_var"] = explained_variance(returns, gae_values, mask)
            # below lam 1 GAE's returns contain the values themselves: this one does not
            metrics["critic/mc_explained_var"] = explained_variance(to_go, gae_values, mask)
            metrics.update(value_error_moments(returns, gae_values, mask))
        if blended:  # the critic's own, beside
            metrics["critic/head_explained_var"] = explained_variance(returns, scored["values"],
                                                                      mask)
        metrics["actor/advantages_mean"] = float((advantages * mask).sum() / mask.sum().clamp(min=1))
        if self.value_fit is not None:
            with timer("critic"):
                metrics.update(self._refit_head(batch, returns, mask))
        elif self.critic is not None and not critic_pass_values:
            clip = self._value_clip(returns, mask)
            metrics["critic/cliprange_value"] = clip
            critic_metrics, skipped = self._critic_update(batch, timer, clip)
            metrics.update(critic_metrics)
        if update_actor:
            with timer("actor"):
                actor_metrics, s = self._epochs(
                    batch, self._actor_micro, self.actor_optim,
                    [p for p in self.actor.parameters() if p.requires_grad],
                    config.actor.grad_clip, config.actor.ppo_epochs, "actor",
                    target_kl=config.actor.target_kl)
            metrics.update(actor_metrics)
            skipped += s
            if first_pass_is_old:
                scored["old"] = self._first_pass_logprobs
            self.actor_sched.step()
        metrics["actor/updated"] = float(update_actor)
        old = scored.get("old")
        if old is not None and all_finite(old):  # a first pass stopped by a non-finite loss
            metrics.update(logprob_gap(batch["rollout_log_probs"], old, mask))  # has gaps
        if self.critic_sched is not None:
            self.critic_sched.step()
        metrics["actor/lr"] = self.actor_sched.get_last_lr()[0]
        metrics["guard/skipped_updates"] = float(skipped)
        warn_if_entropy_collapsed(metrics.get("actor/entropy"))
        return metrics

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
        separate_critic = self.critic is not None and not self.critic_on_backbone
        scored: dict[str, torch.Tensor] = {}
        # a critic on the backbone reads the rollout's features, else the old-log-prob pass's
        shared = self.critic_on_backbone and "rollout_features" not in batch
        if self.critic_on_backbone and not shared:  # no backbone pass for the critic
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
                if self.reference is not None:  # a KL term is on
                    with timer("ref"), self._reference() as ref, self._precision():
                        ref_logprobs = response_logprobs(ref, micro, temperature=temperature,
                                                         shared_prefix_tokens=share,
                                                         prefix=run.prefix("ref"),
                                                         head_mask=micro["response_mask"])[0]
                        parts["ref"].append(pad_responses(ref_logprobs, length))
                if separate_critic and values:
                    with timer("values"), self._precision():
                        critic_inputs = dict(shared_prefix_tokens=share,
                                             prefix=run.prefix("critic"))
                        if self.value_fit is None:
                            critic_values = self.critic(micro, **critic_inputs)
                        else:  # the refit reads the features too
                            features = self.critic.features(micro, **critic_inputs)
                            critic_values = self.critic.values_from(features)
                            parts["critic_features"].append(pad_responses(features, length))
                        parts["values"].append(pad_responses(critic_values, length))
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
                and (rollout_features or not self.critic_on_backbone))

    @property
    def critic_on_backbone(self) -> bool:
        """A critic that reads the actor's backbone: the rollout then returns the engine's
        features, and its values come from them without a backbone pass (:meth:`_score`)."""
        return self.critic is not None and self.critic.shared

    def _temperature(self) -> float:
        t = self.config.rollout.temperature
        return t if t > 0 else 1.0

    def _precision(self):
        """Autocast to ``model.dtype`` (a no-op in float32): as the sampler computes."""
        return compute_precision(self.device, self.compute_dtype)

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

    def _advantages(self, rewards: torch.Tensor, mask: torch.Tensor, values: torch.Tensor | None,
                    group_index: torch.Tensor, episode_index: torch.Tensor,
                    lam: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """GAE (or the configured estimator) over whole episodes; ``lam`` overrides
        ``algorithm.lam``."""
        algo = self.config.algorithm
        return ppo.compute_advantages(
            algo.adv_estimator, rewards, mask, values=values, group_index=group_index.numpy(),
            gamma=algo.gamma, lam=algo.lam if lam is None else lam,
            norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo, episode_index=episode_index,
            gamma_unit=algo.gamma_unit)

    def _returns_to_go(self, batch: dict[str, torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        """Monte-Carlo returns-to-go (GAE with lambda 1 and no values), whatever
        ``algorithm.lam`` is: what a value is meant to predict."""
        rewards = batch["rewards"]
        return self._advantages(rewards, mask, torch.zeros_like(rewards), batch["group_index"],
                                batch["episode_index"], lam=1.0)[1]

    def _with_sibling_values(self, batch: dict[str, torch.Tensor], values: torch.Tensor,
                             to_go: torch.Tensor, metrics: dict[str, float]) -> torch.Tensor:
        """``critic.sibling_pseudocount``: the critic's ``values`` blended with the mean
        Monte-Carlo return-to-go (``to_go``) of the group's other episodes from each turn's
        board (:mod:`agentrl.trainers.sibling_values`)."""
        if "state_ids" not in batch:
            raise ValueError("critic.sibling_pseudocount needs the batch's state_ids "
                             "(to_batch(..., state_ids=True))")
        mask = batch["response_mask"].float()
        if not bool((batch["state_ids"] >= 0).any()) and not self._warned_no_boards:
            log.warning("critic.sibling_pseudocount: no turn of this batch recorded its board "
                        "(Turn.state), so no value is blended: the preset's game gives none")
            self._warned_no_boards = True
        mean, count = sibling_returns(to_go, batch["state_ids"], batch["episode_index"], mask)
        metrics["critic/sibling_share"] = float(((count > 0).float() * mask).sum()
                                                / mask.sum().clamp(min=1))
        metrics["critic/siblings_mean"] = float((count * mask).sum()
                                                / ((count > 0).float() * mask).sum().clamp(min=1))
        return blend(values, mean, count, self.config.critic.sibling_pseudocount)

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
        mini = config.critic.ppo_mini_batch_size or config.actor.ppo_mini_batch_size or n
        return (one_row_per_episode and self.critic is not None and not self.critic.shared
                and self.value_fit is None and epochs == 1 and mini >= n)

    def _refit_head(self, batch: dict[str, torch.Tensor], returns: torch.Tensor,
                    mask: torch.Tensor) -> dict[str, float]:
        """``critic.head_fit: ridge``: this step's model tokens join the window, and the head is
        refit on it in closed form (:mod:`agentrl.trainers.value_fit`); the backbone does not
        train. The values GAE used were the previous fit's predictions on this batch, unseen."""
        chosen = mask.bool()
        features = batch["critic_features"][:, :mask.shape[1]]
        chosen = chosen[:, :features.shape[1]]
        games = batch["group_index"][:, None].expand_as(mask)[:, :features.shape[1]]
        self.value_fit.add(features[chosen].float(), returns[:, :features.shape[1]][chosen],
                           games[chosen])
        fit = self.value_fit.refit(self.critic.head)
        return fit.metrics() if fit is not None else {}

    def _critic_update(self, batch, timer: StageTimer, clip: float) -> tuple[dict[str, float], int]:
        config = self.config
        self._observed_rows = set()  # rows whose features the head's statistics have seen
        with timer("critic"):
            return self._epochs(batch, functools.partial(self._critic_micro, cliprange_value=clip),
                                self.critic_optim, self.critic.trainable_parameters(),
                                config.critic.grad_clip,
                                config.critic.ppo_epochs or config.actor.ppo_epochs, "critic",
                                mini_batch_size=config.critic.ppo_mini_batch_size)

    def _epochs(self, batch, micro_loss, optim, params, grad_clip: float, epochs: int,
                role: str, *, mini_batch_size: int | None = None,
                target_kl: float | None = None) -> tuple[dict[str, float], int]:
        """``epochs`` passes of shuffled mini-batches of ``role``'s loss
        (:func:`agentrl.trainers.update_loop.run_epochs`), cut by the actor's batch sizes (or
        ``mini_batch_size``) and shuffled by the run's seed and step, stopped early past
        ``target_kl``; returns mean metrics and skipped updates."""
        actor = self.config.actor
        shape = UpdateShape(epochs=epochs,
                            mini_batch_size=mini_batch_size or actor.ppo_mini_batch_size,
                            micro_batch_size=actor.micro_batch_size,
                            shared_prefix_tokens=actor.shared_prefix_tokens, grad_clip=grad_clip,
                            target_kl=target_kl)
        generator = torch.Generator().manual_seed(self.config.seed * 1_000_003 + self.step)
        return run_epochs(batch, micro_loss, optim, params, shape,
                          loss_mask=self._loss_mask(batch, role), generator=generator, role=role)

    @staticmethod
    def _loss_mask(batch: dict[str, torch.Tensor], role: str) -> torch.Tensor:
        """The tokens ``role``'s loss averages over: the actor's leave out the tokens a constraint
        forced (:func:`choice_mask`) and the replies ``learned_mask`` leaves out
        (``algorithm.skip_after_missed_moves``); the critic's are all model tokens."""
        if role != "actor":
            return batch["response_mask"].float()
        mask = choice_mask(batch)
        return mask * batch["learned_mask"] if "learned_mask" in batch else mask

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
        with torch.no_grad():  # CleanRL's approx_kl, (r - 1) - log r: the early stop reads it
            log_ratio = logprobs.detach() - old.to(device)
            approx_kl = ppo.aggregate(torch.expm1(log_ratio) - log_ratio, mask, "token-mean", size)
        terms = {"actor/pg_loss": float(pg_loss.detach()),
                 "actor/entropy": float(entropy_term.detach()), KL_TERM: float(approx_kl)}
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
                features = self.critic.features(
                    micro, shared_prefix_tokens=self.config.actor.shared_prefix_tokens,
                    prefix=prefix)
        features = features.to(device)
        rows = [int(r) for r in micro["row"]] if "row" in micro else None
        if rows is None or not self._observed_rows.issuperset(rows):  # the step's first pass
            self.critic.observe(features, mask[:, :features.shape[1]])
            self._observed_rows.update(rows or ())
        with self._precision():
            vpreds = self.critic.values_from(features)
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
