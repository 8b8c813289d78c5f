"""``algorithm.skip_after_missed_moves``: the replies a batch's ``learned_mask`` leaves out stay
in the context and in the critic's loss, but the actor learns nothing from them."""

from __future__ import annotations

import pytest
import torch

from agentrl.config import compose_config
from test_forced_tokens import actor_epoch, with_inputs
from test_step_groups import BLOCKS, one_step
from update_fixtures import relative_difference, tiny_trainer, two_turn_batch


@pytest.fixture(scope="module")
def trainer(tmp_path_factory, one_torch_thread):
    return tiny_trainer(tmp_path_factory.mktemp("left_out"), "actor.entropy_coeff=0.01")


def second_replies_left_out() -> dict[str, torch.Tensor]:
    """Two-turn episodes whose second reply the actor's loss leaves out."""
    batch = two_turn_batch(4)
    model = batch["response_mask"]
    after_a_gap = ((model == 0) & (model.cumsum(1) > 0)).cumsum(1) > 0  # past the first reply
    second = model.bool() & after_a_gap
    assert second.any(1).all() and (model.bool() & ~second).any(1).all()
    return {**batch, "learned_mask": (~second).float()}


def test_the_actor_learns_nothing_from_left_out_replies(trainer):
    batch = with_inputs(trainer, second_replies_left_out())
    left_out = batch["learned_mask"] == 0
    grads, metrics = actor_epoch(trainer, batch)
    other_advantages = {**batch, "advantages": torch.where(left_out, 5.0, batch["advantages"])}
    assert relative_difference(actor_epoch(trainer, other_advantages)[0], grads) < 1e-6
    counted_out = {**batch, "response_mask": (batch["response_mask"].bool() & ~left_out).long()}
    expected_grads, expected = actor_epoch(trainer, counted_out)
    assert relative_difference(grads, expected_grads) < 1e-5
    assert metrics["actor/pg_loss"] == pytest.approx(expected["actor/pg_loss"], rel=1e-5)


def test_the_critic_still_reads_left_out_replies(trainer):
    batch = second_replies_left_out()
    critic = trainer.updater._loss_mask(batch, "critic")
    assert critic.tolist() == batch["response_mask"].float().tolist()
    assert trainer.updater._loss_mask(batch, "actor").sum() < critic.sum()


def test_a_step_records_distances_and_leaves_out_turns_after_missed_moves(tmp_path,
                                                                           one_torch_thread):
    metrics, moved = one_step(tmp_path / "run", BLOCKS, "train.group_num=1",
                              "train.group_size=2", "rollout.temperature=2.0",
                              "algorithm.skip_after_missed_moves=true")
    assert 0 <= metrics["train/turns_left_out"] < 1 and moved


def test_the_switch_is_refused_where_it_cannot_act():
    with pytest.raises(ValueError, match="algorithm.skip_after_missed_moves=True is not allowed "
                                         "with backend"):
        compose_config(["hardware=a100", "model=qwen_halfb",
                        "algorithm.skip_after_missed_moves=true"])
    with pytest.raises(ValueError, match="not allowed with rollout.turn_branches=2"):
        compose_config(["algorithm.skip_after_missed_moves=true", "rollout.turn_branches=2"])
