"""``algorithm.lost_group_advantage``: a game every episode lost is pushed down as a whole,
beside whatever baseline the advantages had."""

from __future__ import annotations

import pytest
import torch

from agentrl.config import compose_config
from agentrl.rollout import lost_group_rows, to_batch
from agentrl.rollout.records import Trajectory
from agentrl.trainers.timing import StageTimer

from test_step_groups import BLOCKS, one_step
from update_fixtures import tiny_trainer


def episode(group: int, reward: float, won: bool, reply: int = 0) -> Trajectory:
    """A one-turn episode of a two-token reply."""
    return Trajectory(preset="p", seed=group, group_index=group, prompt_ids=[1, 2, 3],
                      response_ids=[20 + reply, 30], response_mask=[1, 1],
                      response_logprobs=[-1.0, -1.0], turn_end_positions=[1],
                      turn_rewards=[reward], success=won, episode_return=reward, num_turns=1)


def games() -> list[Trajectory]:
    """Group 0 all lost (with different returns), group 1 mixed, group 2 all won."""
    return [episode(0, -1.0, False), episode(0, -3.0, False, reply=1),
            episode(1, -1.0, False, reply=2), episode(1, 5.0, True, reply=3),
            episode(2, 5.0, True, reply=4), episode(2, 4.0, True, reply=5)]


def test_the_rows_of_groups_no_episode_won_are_flagged():
    trajectories = games()
    batch = to_batch(trajectories, pad_token_id=0)
    flags = lost_group_rows(batch["group_index"], trajectories)
    assert flags.tolist() == [True, True] + [False] * 4


def test_a_lost_groups_model_tokens_get_the_push_on_their_advantages(tmp_path):
    batch = to_batch(games(), pad_token_id=0)
    plain = tiny_trainer(tmp_path / "plain").updater.update(dict(batch), StageTimer())
    batch["lost_group"] = lost_group_rows(batch["group_index"], games())
    pushed = tiny_trainer(tmp_path / "push", "algorithm.lost_group_advantage=-1.5").updater.update(
        batch, StageTimer())
    assert pushed["actor/lost_group_share"] == pytest.approx(1 / 3)  # 2 of 6 rows alike long
    assert pushed["actor/advantages_mean"] == pytest.approx(plain["actor/advantages_mean"] - 0.5)
    assert pushed["actor/pg_loss"] != plain["actor/pg_loss"]
    assert pushed["critic/returns_mean"] == pytest.approx(plain["critic/returns_mean"])


def test_a_step_pushes_the_games_the_tiny_model_lost(tmp_path, one_torch_thread):
    metrics, _ = one_step(tmp_path, BLOCKS, "train.group_num=2", "train.group_size=2",
                          "rollout.max_new_tokens=8", "algorithm.lost_group_advantage=-1")
    assert metrics[f"train/{BLOCKS}/success"] == 0
    assert metrics["actor/lost_group_share"] == 1.0  # every token of the batch


def test_the_push_is_a_finite_number_at_most_0_of_the_local_engine_without_turn_branches():
    for bad in ("0.5", "-inf"):
        with pytest.raises(ValueError, match="algorithm.lost_group_advantage"):
            compose_config([f"algorithm.lost_group_advantage={bad}"])
    with pytest.raises(ValueError, match="rollout.turn_branches=2"):
        compose_config(["algorithm.lost_group_advantage=-1", "rollout.turn_branches=2"])
    with pytest.raises(ValueError, match="algorithm.lost_group_advantage=-1.0 is not allowed "
                                         "with backend='verl'"):
        compose_config(["hardware=cpu-verl", "algorithm.lost_group_advantage=-1"])
