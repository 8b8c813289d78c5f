"""Groups (filtering, normalization), the batch layout and metrics on hand-made trajectories."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.rollout import (
    Trajectory,
    Turn,
    drop_uniform_groups,
    filter_groups,
    normalize_returns,
    rollout_metrics,
    step_advantages,
    to_batch,
    trajectory_groups,
    uniform_group_metrics,
)
from agentrl.rollout.batch import token_rewards


def traj(group, ret, preset="p", prompt=(5, 6), response=(7, 8, 9, 10), mask=(1, 1, 0, 1),
         ends=(1, 3), rewards=None, **metrics):
    rewards = list(rewards) if rewards is not None else [0.0] * (len(ends) - 1) + [ret]
    return Trajectory(
        preset=preset, seed=100 + group, group_index=group, prompt_ids=list(prompt),
        response_ids=list(response), response_mask=list(mask),
        response_logprobs=[-0.1 * m for m in mask], turn_end_positions=list(ends),
        turn_rewards=rewards, success=ret > 0, episode_return=ret, num_turns=len(ends),
        metrics=dict(metrics), timings={"generate_s": 1.0, "env_s": 0.5, "tokenize_s": 0.25})


# returns per group: std (unbiased) 0, ~0.577, 1.0 (hand-computed below)
GROUPS = [[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 1.0], [0.0, 0.0, 2.0, 2.0]]
TRAJS = [traj(g, r) for g, rets in enumerate(GROUPS) for r in rets]


def test_filter_std_keeps_highest_std_groups():
    kept = filter_groups(TRAJS, filter_ratio=0.5, mode="std")  # ceil(1.5) = 2 groups
    assert sorted({t.group_index for t in kept}) == [1, 2]
    kept = filter_groups(TRAJS, filter_ratio=0.34, mode="std")  # ceil(1.02) = 2
    assert sorted({t.group_index for t in kept}) == [1, 2]
    kept = filter_groups(TRAJS, filter_ratio=0.2, mode="std")
    assert {t.group_index for t in kept} == {2}
    kept = filter_groups(TRAJS, filter_ratio=0.2, mode="std_rev")
    assert {t.group_index for t in kept} == {0}
    assert filter_groups(TRAJS, 1.0) == TRAJS
    with pytest.raises(ValueError, match="filter mode"):
        filter_groups(TRAJS, 0.5, mode="nope")


def test_drop_uniform_groups_keeps_groups_whose_returns_differ():
    assert drop_uniform_groups(TRAJS) == TRAJS[4:]  # group 0 all returned 1.0
    assert drop_uniform_groups(TRAJS[:4]) == []
    singles = [traj(g, 1.0) for g in range(3)]  # a group of one compares nothing
    assert drop_uniform_groups(singles) == []


def test_drop_uniform_groups_can_leave_out_only_the_won_or_only_the_lost():
    lost = [traj(3, -1.0) for _ in range(4)]  # all lost alike; group 0 all won alike
    trajectories = [*TRAJS, *lost]
    assert drop_uniform_groups(trajectories) == TRAJS[4:]
    assert drop_uniform_groups(trajectories, "won") == [*TRAJS[4:], *lost]
    assert drop_uniform_groups(trajectories, "lost") == TRAJS
    with pytest.raises(ValueError, match="allowed: 'any', 'won', 'lost'"):
        drop_uniform_groups(trajectories, "all")


def uniform_share(trajectories) -> float:
    return uniform_group_metrics(trajectory_groups(trajectories))["train/uniform_groups"]


def test_uniform_group_metrics_count_the_groups_that_compare_nothing():
    assert uniform_share(TRAJS) == pytest.approx(1 / 3)  # group 0 all returned 1.0
    assert uniform_share(TRAJS[:4]) == 1.0
    assert uniform_share(TRAJS[4:]) == 0.0
    assert uniform_group_metrics([]) == {"train/uniform_groups": 0.0,
                                         "train/uniform_groups_won": 0.0}
    # what it measures is what drop_uniform_groups leaves out
    kept_groups = {t.group_index for t in drop_uniform_groups(TRAJS)}
    assert uniform_share(TRAJS) == pytest.approx(1 - len(kept_groups) / len(GROUPS))


def test_uniform_groups_that_all_won_are_told_from_those_that_all_lost():
    lost = [traj(3, -1.0) for _ in range(4)]  # all lost alike: uniform, not won
    metrics = uniform_group_metrics(trajectory_groups([*TRAJS, *lost]))
    assert metrics == {"train/uniform_groups": 0.5, "train/uniform_groups_won": 0.25}
    # a group that all won in different ways (returns differ) is not uniform
    mixed_wins = [traj(4, 1.0), traj(4, 2.0)]
    assert uniform_group_metrics([mixed_wins])["train/uniform_groups_won"] == 0.0
    assert uniform_group_metrics([[], mixed_wins]) == uniform_group_metrics([mixed_wins])


def test_drop_uniform_groups_sees_the_shaping_terms():
    """Equal returns, different shaping: the group still compares moves, so it is kept."""
    import dataclasses

    group = [dataclasses.replace(traj(0, -2.0), turn_shaping=[0.0, shaping])
             for shaping in (1.0, -1.0, 1.0)]
    assert drop_uniform_groups(group) == group
    alike = [dataclasses.replace(t, turn_shaping=[0.5, 0.5]) for t in group]
    assert drop_uniform_groups(alike) == []


def test_normalize_state_mean_std_by_hand():
    scores = [t.score for t in normalize_returns(TRAJS, grouping="state", method="mean_std")]
    assert scores[:4] == [0.0] * 4  # std 0 -> zeros
    std1 = math.sqrt(((0 - 0.75) ** 2 + 3 * 0.25 ** 2) / 3)  # 0.5
    assert scores[4:8] == pytest.approx([(r - 0.75) / (std1 + 1e-6) for r in GROUPS[1]])
    std2 = math.sqrt(4 * 1.0 / 3)
    assert scores[8:] == pytest.approx([(r - 1.0) / (std2 + 1e-6) for r in GROUPS[2]])


def test_normalize_batch_and_asym_clip_and_identity():
    rets = [r for g in GROUPS for r in g]
    mean = sum(rets) / len(rets)
    std = math.sqrt(sum((r - mean) ** 2 for r in rets) / (len(rets) - 1))
    scores = [t.score for t in normalize_returns(TRAJS, grouping="batch", method="mean_std")]
    assert scores == pytest.approx([(r - mean) / (std + 1e-6) for r in rets])
    clipped = [t.score for t in normalize_returns(TRAJS, grouping="state", method="asym_clip")]
    assert clipped[4] == pytest.approx(-1.0)  # (0 - 0.75) / 0.5 = -1.5 -> clipped to -1
    assert clipped[5] == pytest.approx(0.25 / 0.5, rel=1e-4)
    ident = [t.score for t in normalize_returns(TRAJS, method="identity")]
    assert ident == rets
    with pytest.raises(ValueError):
        normalize_returns(TRAJS, grouping="nope")


def test_format_penalty_is_in_the_normalized_return():
    # a group where one member broke the format (-0.1) and the others got 0
    group = [traj(0, -0.1, rewards=[-0.1, 0.0]), traj(0, 0.0), traj(0, 0.0)]
    scores = [t.score for t in normalize_returns(group, method="mean_std")]
    assert scores[0] < 0 < scores[1] == scores[2]


def test_to_batch_layout():
    a = traj(0, 1.0, rewards=[0.5, 0.5])
    b = traj(1, 2.0, prompt=(1, 2, 3), response=(4, 5), mask=(1, 1), ends=(1,))
    batch = to_batch([a, b], pad_token_id=0, reward_placement="turn")
    assert batch["prompts"].tolist() == [[0, 5, 6], [1, 2, 3]]
    assert batch["responses"].tolist() == [[7, 8, 9, 10], [4, 5, 0, 0]]
    assert batch["input_ids"].tolist() == [[0, 5, 6, 7, 8, 9, 10], [1, 2, 3, 4, 5, 0, 0]]
    assert batch["attention_mask"].tolist() == [[0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0]]
    assert batch["position_ids"].tolist() == [[0, 0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 4, 4]]
    assert batch["response_mask"].tolist() == [[1, 1, 0, 1], [1, 1, 0, 0]]
    assert torch.allclose(batch["rollout_log_probs"],
                          torch.tensor([[-0.1, -0.1, 0.0, -0.1], [-0.1, -0.1, 0.0, 0.0]]))
    assert batch["token_level_rewards"].tolist() == [[0, 0.5, 0, 0.5], [0, 2.0, 0, 0]]
    last = to_batch([a, b], pad_token_id=0, reward_placement="last")
    assert last["token_level_rewards"].tolist() == [[0, 0, 0, 1.0], [0, 2.0, 0, 0]]
    scored = normalize_returns([a, b], grouping="batch", method="mean_std")
    last = to_batch(scored, pad_token_id=0, reward_placement="last")
    assert last["token_level_rewards"][0, 3].item() == pytest.approx(scored[0].score)
    padded = to_batch([a], 0, max_prompt_length=4, max_response_length=6)
    assert padded["input_ids"].shape == (1, 10)
    with pytest.raises(ValueError, match="max_response_length"):
        to_batch([a], 0, max_response_length=2)


def test_token_rewards_cut_to_a_length_drop_the_turns_past_it():
    t = traj(0, 3.0, response=(7, 8, 9, 10, 11), mask=(1, 1, 0, 1, 1), ends=(1, 4),
             rewards=[1.0, 2.0])
    assert token_rewards(t, "turn") == [0, 1.0, 0, 0, 2.0]
    assert token_rewards(t, "last") == [0, 0, 0, 0, 3.0]
    assert token_rewards(t, "turn", length=4) == [0, 1.0, 0, 0]  # turn 2 ends past the cut
    assert token_rewards(t, "last", length=4) == [0, 1.0, 0, 0]  # its reward is not counted
    assert token_rewards(t, "last", length=1) == [0]
    with pytest.raises(ValueError, match="allowed: \\('turn', 'last'\\)"):
        token_rewards(t, "first")


def test_metrics_names_and_values():
    ts = [traj(0, 1.0, num_actions=4, num_valid=3, num_effective=2, format_errors=0,
               format_progress=2.0, truncated_turns=1, response_length=3, context_truncated=0),
          traj(0, 0.0, num_actions=0, num_valid=0, num_effective=0, format_errors=2,
               format_progress=0.5, truncated_turns=0, response_length=5, context_truncated=1),
          traj(1, 1.0, preset="q", num_actions=2, num_valid=2, num_effective=2)]
    m = rollout_metrics(ts, split="val")
    assert m["val/p/success"] == 0.5 and m["val/p/return"] == 0.5 and m["val/p/turns"] == 2
    assert m["val/p/num_actions"] == 2 and m["val/p/action_is_valid"] == 0.75
    assert m["val/p/action_is_effective"] == 0.5 and m["val/p/format_error"] == 0.5
    assert m["val/p/format_progress"] == (2.0 + 0.5) / 4   # per reply, over the preset's turns
    assert m["val/p/response_length"] == 4 and m["val/p/truncated_turns"] == 0.5
    assert m["val/p/context_truncated"] == 0.5 and m["val/q/action_is_valid"] == 1.0
    assert m["timing/generate_s"] == 1.0 and m["timing/env_s"] == 0.5
    assert m["timing/tokenize_s"] == 0.25


@pytest.mark.parametrize("method", ["identity", "mean_std", "asym_clip"])
def test_normalized_turn_rewards_are_one_affine_map_of_the_raw_ones(method):
    # BlocksWorld-like costs: a long failed episode far below its group's mean
    below = traj(0, -20.0, response=(7, 8, 9, 10, 11, 12, 13), mask=(1, 0, 1, 0, 1, 0, 1),
                 ends=(0, 2, 4, 6), rewards=[-5.0, -6.0, -4.0, -5.0])
    group = normalize_returns([below, traj(0, -2.0, rewards=[-1.0, -1.0]),
                               traj(0, 0.0, rewards=[-1.0, 1.0])], method=method)
    for t in group:
        rewards = token_rewards(t, "turn")
        turns = [rewards[end] for end in t.turn_end_positions]
        assert sum(rewards) == pytest.approx(sum(turns))
        assert sum(turns) == pytest.approx(t.score)  # the episode sums to its normalized return
        for i, raw_i in enumerate(t.turn_rewards):  # one increasing map: the order is kept
            for j, raw_j in enumerate(t.turn_rewards):
                if raw_i < raw_j:
                    assert turns[i] <= turns[j]
    below_turns = [token_rewards(group[0], "turn")[end] for end in group[0].turn_end_positions]
    if method != "identity":
        assert group[0].score < 0
    assert all(reward <= 0 for reward in below_turns)  # before: the last turn got +13.9


def board_episode(group: int, boards: list[str], rewards: list[float]) -> Trajectory:
    """An episode of one-token replies (ids 50+k), each followed by a one-token observation."""
    turns = [Turn(prompt_ids=(), response_ids=(50 + k,), logprobs=(-0.1,), reward=r,
                  format_ok=True, num_actions=1, num_valid=1, num_effective=1,
                  truncated_by_length=False, state=board)
             for k, (board, r) in enumerate(zip(boards, rewards))]
    n = len(turns)
    response = [x for k in range(n) for x in (50 + k, 9)][:-1]
    return Trajectory(preset="p", seed=group, group_index=group, prompt_ids=[5],
                      response_ids=response, response_mask=[1, 0] * (n - 1) + [1],
                      response_logprobs=[-0.1, 0.0] * (n - 1) + [-0.1],
                      turn_end_positions=[2 * k for k in range(n)], turn_rewards=rewards,
                      success=False, episode_return=sum(rewards), num_turns=n, turns=turns)


def test_step_advantages_compare_the_turns_from_one_board():
    # group 0: both episodes start on board A; from there, one earned 4 in all, the other 0;
    # board B is met once (nothing to compare); group 1 meets A too, but is another game
    episodes = [board_episode(0, ["A", "B"], [1.0, 3.0]), board_episode(0, ["A", "C"], [0.0, 0.0]),
                board_episode(1, ["A"], [7.0])]
    out = step_advantages(episodes)
    std = math.sqrt((4 - 2) ** 2 * 2 / 1)  # returns-to-go 4 and 0 from A, unbiased std
    assert out[0].turn_advantages == pytest.approx([(4 - 2) / (std + 1e-6), 0.0])
    assert out[1].turn_advantages == pytest.approx([(0 - 2) / (std + 1e-6), 0.0])
    assert out[2].turn_advantages == [0.0]
    assert episodes[0].turn_advantages is None  # copies


def test_step_advantages_land_on_their_replies_tokens():
    episode = step_advantages([board_episode(0, ["A", "A"], [1.0, -1.0]),
                               board_episode(0, ["A"], [2.0])])[0]
    # board A's returns-to-go: 0 and -1 (episode 0), 2 (episode 1)
    returns = torch.tensor([0.0, -1.0, 2.0], dtype=torch.float64)
    expected = ((returns - returns.mean()) / (returns.std() + 1e-6)).tolist()
    batch = to_batch([episode], pad_token_id=0)
    assert batch["step_advantages"][0].tolist() == pytest.approx([expected[0], 0.0, expected[1]])
    assert "step_advantages" not in to_batch([board_episode(0, ["A"], [1.0])], pad_token_id=0)


def test_distance_shaping_is_potential_based_and_survives_normalization():
    import dataclasses

    from agentrl.rollout import distance_shaping

    episode = dataclasses.replace(traj(0, 9.0, rewards=[-1.0, 9.0]), goal_distances=[3, None, 0])
    (shaped,) = distance_shaping([episode], weight=2.0, gamma=0.5)
    assert shaped.turn_shaping == [0.0, 0.0]  # an unknown distance shapes neither turn beside it
    episode = dataclasses.replace(episode, goal_distances=[3, 2, 0])
    (shaped,) = distance_shaping([episode], weight=2.0, gamma=0.5)
    assert shaped.turn_shaping == pytest.approx([2.0 * (3 - 0.5 * 2), 2.0 * (2 - 0.0)])
    (other,) = normalize_returns([shaped, dataclasses.replace(shaped, episode_return=1.0,
                                                              turn_rewards=[-1.0, 2.0])],
                                 method="mean_std")[:1]
    scale, shift = other.score_map
    assert token_rewards(other, "turn") == pytest.approx(
        [0.0, scale * -1.0 + shift / 2 + 4.0, 0.0, scale * 9.0 + shift / 2 + 4.0])


def test_turns_after_a_missed_move_are_flagged():
    from agentrl.rollout.groups import missed_move_turns

    # moves: 4->3 closes, 3->3 stays, 3->4 opens, 4->3 closes, 3->None loses the plan
    assert missed_move_turns([4, 3, 3, 4, 3, None]) == [False, False, True, True, False]
    assert missed_move_turns([None, 2, 1]) == [False, True]  # an unknown start judges nothing
    assert missed_move_turns([2, 1]) == [False]  # the first turn follows no move


def test_left_out_turns_are_masked_for_the_actor_alone():
    import dataclasses

    from agentrl.rollout import leave_out_after_missed_moves

    episode = board_episode(0, ["A", "B", "C"], [0.0, 0.5, 1.0])  # replies at 0, 2, 4
    with pytest.raises(ValueError, match="no goal distances"):
        leave_out_after_missed_moves([episode])
    (flagged,) = leave_out_after_missed_moves(
        [dataclasses.replace(episode, goal_distances=[2, 3, 2, 1])])  # the first move missed
    assert flagged.turns_left_out == [False, True, False]
    batch = to_batch([flagged], pad_token_id=0)
    assert batch["learned_mask"][0].tolist() == [1.0, 1.0, 0.0, 1.0, 1.0]
    assert batch["response_mask"][0].tolist() == [1, 0, 1, 0, 1]  # GAE and the critic: all
    assert batch["token_level_rewards"][0].tolist()[2] == 0.5  # the reward stays on its turn
    assert "learned_mask" not in to_batch([episode], pad_token_id=0)
