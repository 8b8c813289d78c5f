"""One PPO epoch over one mini-batch: the old log-probs are the update's own first-pass
log-probs (detached), and a separate critic's old values its update's first-pass values, not
separate no-grad passes. The update is the same either way (weights after the step within
1e-6), and actor and critic each run one forward pass fewer per micro-batch."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from agentrl.trainers import ppo
from agentrl.trainers.timing import StageTimer
from agentrl.trainers.ppo_update import PPOUpdate
from agentrl.trainers.policy import backbone_of
from update_fixtures import GradientRecorder, relative_difference, tiny_trainer, two_turn_batch


def one_step(tmp_path, *overrides: str) -> dict:
    """Per role (actor, critic): weights after one step, gradients applied, forward passes."""
    trainer = tiny_trainer(tmp_path, "actor.lr=1e-4", "critic.lr=1e-4", "actor.micro_batch_size=2",
                           "critic.ppo_epochs=null", "critic.ppo_mini_batch_size=null",
                           *overrides)
    roles = {"actor": (trainer.actor, trainer.actor_optim)}
    if trainer.critic is not None:
        roles["critic"] = (trainer.critic, trainer.critic_optim)
    out = {}
    for role, (model, optim) in roles.items():
        out[role] = {"passes": 0, "recorder": GradientRecorder(optim), "model": model}

        def count(*_, record=out[role]):
            record["passes"] += 1

        # the actor's passes run its backbone (the LM head only at model tokens)
        (backbone_of(model) if role == "actor" else model).register_forward_pre_hook(count)
    trainer.step = 1
    metrics = trainer.updater.update(two_turn_batch(4), StageTimer())
    for record in out.values():
        record["weights"] = [p.detach().clone() for p in record.pop("model").parameters()]
        record["grads"] = record.pop("recorder").steps[0]
    out["metrics"] = metrics
    return out


@pytest.mark.slow
@pytest.mark.parametrize("critic", ["algorithm.adv_estimator=grpo", "critic.share_backbone=false"])
def test_first_pass_old_logprobs_and_values_give_the_same_update(tmp_path, monkeypatch, critic,
                                                                 one_torch_thread):
    fast = one_step(tmp_path / "fast", critic)
    with monkeypatch.context() as patch:
        patch.setattr(PPOUpdate, "_first_pass_is_old", lambda self, n, *rest: False)
        patch.setattr(PPOUpdate, "_critic_pass_gives_values", lambda self, n, *rest: False)
        slow = one_step(tmp_path / "slow", critic)
    assert fast["metrics"]["actor/ppo_kl"] == 0.0  # the ratio is exactly 1 in that pass
    for role in ("actor", "critic") if "critic" in fast else ("actor",):
        print(f"{role} forward passes: {fast[role]['passes']} with the shortcut, "
              f"{slow[role]['passes']} without")
        assert fast[role]["passes"] == slow[role]["passes"] - 2  # 4 trajectories, micro 2
        assert relative_difference(fast[role]["grads"], slow[role]["grads"]) < 1e-5
        assert max(float((a - b).abs().max())
                   for a, b in zip(fast[role]["weights"], slow[role]["weights"])) < 1e-6
    if "critic" in fast:
        assert fast["metrics"]["critic/vf_clipfrac"] == 0.0
        assert fast["metrics"]["critic/returns_mean"] == pytest.approx(
            slow["metrics"]["critic/returns_mean"], abs=1e-6)


def test_no_shortcut_where_the_old_logprobs_are_needed_first(tmp_path, one_torch_thread):
    """Several mini-batches or epochs update between passes; KL in the reward reads the old
    log-probs before the advantages; a critic on the actor's backbone needs that pass for its
    values."""
    trainer = tiny_trainer(tmp_path / "separate", "critic.share_backbone=false",
                           "critic.ppo_epochs=null",  # the actor's one pass
                           "actor.micro_batch_size=2")  # fits the mini-batch of 2 below
    assert trainer.updater._first_pass_is_old(4)
    config = trainer.config
    for section, key, value in (("actor", "ppo_mini_batch_size", 2), ("actor", "ppo_epochs", 2),
                                ("algorithm", "use_kl_in_reward", True)):
        changed = dataclasses.replace(getattr(config, section), **{key: value})
        trainer.updater.config = dataclasses.replace(config, **{section: changed})
        assert not trainer.updater._first_pass_is_old(4), key
    trainer.updater.config = config
    assert trainer.updater._critic_pass_gives_values(4)
    for key, value in (("ppo_epochs", 2), ("ppo_mini_batch_size", 2)):
        trainer.updater.config = dataclasses.replace(
            config, critic=dataclasses.replace(config.critic, **{key: value}))
        assert not trainer.updater._critic_pass_gives_values(4), key
    shared = tiny_trainer(tmp_path / "shared", "critic.share_backbone=true")
    assert not shared.updater._first_pass_is_old(4) and not shared.updater._critic_pass_gives_values(4)
    assert shared.updater._first_pass_is_old(4, rollout_features=True)  # values from the rollout


def test_a_shared_critic_reads_the_rollouts_features(tmp_path, one_torch_thread):
    """With a critic on the actor's backbone the rollout returns the engine's features: its
    values equal the old-log-prob pass's (1e-5 at model tokens), the update is the same (weights
    within 1e-6), and it runs no scoring pass: the actor's first pass gives the old log-probs."""
    from agentrl.envs.splits import train_seeds
    from agentrl.rollout import to_batch

    overrides = ("critic.share_backbone=true", "algorithm.adv_estimator=gae",
                 "train.presets=[tightBlocksworldTurnsAgent]", "rollout.max_new_tokens=8")
    reader = tiny_trainer(tmp_path / "rollout", *overrides)
    assert reader.sampling.return_features
    try:
        trajectories = reader.rollout(reader.train_presets, train_seeds(1, 2, 1), 2,
                                      reader.sampling, desc="rollout")
    finally:
        reader.close()
    batch = to_batch(trajectories, reader.pad_token_id, "turn")
    assert batch["responses"].shape[0] > len(trajectories)  # a row per context window
    features, mask = batch["rollout_features"], batch["response_mask"].bool()
    assert features.shape[:2] == mask.shape and bool((features[~mask] == 0).all())
    scored = reader.updater._score({k: v for k, v in batch.items() if k != "rollout_features"},
                           StageTimer())
    from_rollout = reader.updater._score(batch, StageTimer(), old_logprobs=False)
    assert set(from_rollout) == {"values", "critic_features"}  # no backbone pass
    assert torch.allclose(from_rollout["values"][mask], scored["values"][mask], atol=1e-5)
    assert torch.allclose(features[mask], scored["critic_features"][mask], atol=1e-5)

    def update(name: str, rows: dict) -> dict:
        trainer = tiny_trainer(tmp_path / name, *overrides, "actor.lr=1e-4", "critic.lr=1e-4")
        passes = [0]
        backbone_of(trainer.actor).register_forward_pre_hook(
            lambda *_: passes.__setitem__(0, passes[0] + 1))
        trainer.step = 1
        metrics = trainer.updater.update(dict(rows), StageTimer())
        return {"metrics": metrics, "passes": passes[0],
                "weights": [p.detach().clone() for p in trainer.actor.parameters()]
                + [p.detach().clone() for p in trainer.critic.trainable_parameters()]}

    fast = update("fast", batch)
    slow = update("slow", {k: v for k, v in batch.items() if k != "rollout_features"})
    print(f"actor forward passes: {fast['passes']} from the rollout's features, "
          f"{slow['passes']} with a scoring pass")
    assert fast["passes"] < slow["passes"]
    assert fast["metrics"]["actor/ppo_kl"] == 0.0  # old log-probs from the update's first pass
    assert fast["metrics"]["critic/returns_mean"] == pytest.approx(
        slow["metrics"]["critic/returns_mean"], abs=1e-5)
    assert max(float((a - b).abs().max()) for a, b in zip(fast["weights"], slow["weights"])) < 1e-6


def infinite_on_first_call(loss_function):
    """``loss_function`` (returning ``(loss, extra)``) whose first call's loss is infinite."""
    calls = []

    def wrapped(*args, **kwargs):
        loss, extra = loss_function(*args, **kwargs)
        calls.append(1)
        return (loss * float("inf") if len(calls) == 1 else loss), extra

    return wrapped


def test_a_critic_update_cut_short_leaves_no_made_up_values(tmp_path, monkeypatch,
                                                            one_torch_thread):
    """The critic's first pass gives GAE its values micro-batch by micro-batch. A non-finite
    loss stops that pass after its first micro-batch: the rows it never reached have no values,
    so the step must be skipped, not trained on advantages made from zeros."""
    trainer = tiny_trainer(tmp_path, "critic.share_backbone=false", "actor.micro_batch_size=2",
                           "critic.ppo_epochs=null", "critic.ppo_mini_batch_size=null")
    assert trainer.updater._critic_pass_gives_values(4)
    monkeypatch.setattr(ppo, "value_loss", infinite_on_first_call(ppo.value_loss))
    before = [p.detach().clone() for p in trainer.actor.parameters()]
    trainer.step = 1
    metrics = trainer.updater.update(two_turn_batch(4), StageTimer())
    assert metrics["guard/skipped_updates"] >= 1
    assert all(torch.equal(a, p) for a, p in zip(before, trainer.actor.parameters()))


def test_an_actor_update_cut_short_reports_no_made_up_logprob_gap(tmp_path, monkeypatch,
                                                                  one_torch_thread):
    """The actor's first pass gives the old log-probs row by row; after a non-finite loss the
    rows it never reached have none, so no sampler-trainer gap is reported from them."""
    trainer = tiny_trainer(tmp_path, "algorithm.adv_estimator=grpo", "actor.micro_batch_size=2")
    assert trainer.updater._first_pass_is_old(4)
    monkeypatch.setattr(ppo, "policy_loss", infinite_on_first_call(ppo.policy_loss))
    trainer.step = 1
    metrics = trainer.updater.update(two_turn_batch(4), StageTimer())
    assert metrics["guard/skipped_updates"] == 1
    assert "rollout/logprob_gap_mean" not in metrics
