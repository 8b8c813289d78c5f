"""Sibling values (critic.sibling_pseudocount): a turn's value from its group's other episodes
from the same board and turn, blended with the critic's."""

from __future__ import annotations

import pytest
import torch

from agentrl.config import compose_config
from agentrl.rollout import to_batch
from agentrl.rollout.records import Trajectory, Turn
from agentrl.trainers.sibling_values import blend, sibling_returns
from agentrl.trainers.timing import StageTimer

from update_fixtures import tiny_trainer


def episode(group: int, states: list[str], rewards: list[float], seed: int = 0,
            window: bool = False) -> Trajectory:
    """Two-token replies from the given boards, a one-token observation between them;
    ``window``: each turn after the first opens a context window of its own (a row each)."""
    ids, mask, ends, turns = [], [], [], []
    for k, state in enumerate(states):
        if k:
            ids.append(7)
            mask.append(0)
        reply = (20 + seed, 30 + k)
        ids += reply
        mask += [1, 1]
        ends.append(len(ids) - 1)
        turns.append(Turn(prompt_ids=(5,), response_ids=reply, logprobs=(-1.0, -1.0),
                          reward=rewards[k], format_ok=True, num_actions=1, num_valid=1,
                          num_effective=1, truncated_by_length=False, state=state,
                          context_start=len(ids) - 2 if window and k else 0))
    return Trajectory(preset="p", seed=seed, group_index=group, prompt_ids=[1, 2, 3],
                      response_ids=ids, response_mask=mask, response_logprobs=[-1.0] * len(ids),
                      turn_end_positions=ends, turn_rewards=list(rewards), success=False,
                      episode_return=sum(rewards), num_turns=len(states), turns=turns)


def test_one_id_per_group_board_and_turn_on_the_replies_model_tokens():
    batch = to_batch([episode(0, ["A", "B"], [0, 1]), episode(0, ["A", "A"], [0, 2], seed=1),
                      episode(1, ["A", ""], [0, 3], seed=2)], pad_token_id=0, state_ids=True)
    ids = batch["state_ids"]
    assert ids[0].tolist() == [0, 0, -1, 1, 1]  # the observation between the replies: -1
    assert ids[1].tolist() == [0, 0, -1, 2, 2]  # board A again, but on turn 2: another id
    assert ids[2].tolist() == [3, 3, -1, -1, -1]  # another group; no recorded board: -1
    assert "state_ids" not in to_batch([episode(0, ["A"], [1])], pad_token_id=0)


def test_an_episode_over_several_context_windows_is_never_its_own_sibling():
    """An episode cut into a row per turn keeps its ids across the rows, and its rows do not
    count as each other's siblings: only the other episode's turns from the board do."""
    batch = to_batch([episode(0, ["A", "B"], [0.0, 4.0], window=True),
                      episode(0, ["A", "B"], [0.0, -2.0], seed=1)], pad_token_id=0,
                     state_ids=True)
    assert batch["episode_index"].tolist() == [0, 0, 1]  # the first episode is two rows
    ids = batch["state_ids"]
    assert ids[0, :2].tolist() == [0, 0] and ids[1, :2].tolist() == [1, 1]
    assert ids[2].tolist() == [0, 0, -1, 1, 1]
    mask = batch["response_mask"].float()
    returns = torch.tensor([[4.0, 4.0, 0.0, 0.0, 0.0], [4.0, 4.0, 0.0, 0.0, 0.0],
                            [-2.0, -2.0, 0.0, -2.0, -2.0]])[:, :mask.shape[1]]
    mean, count = sibling_returns(returns, ids, batch["episode_index"], mask)
    assert mean[0, :2].tolist() == [-2.0, -2.0] and mean[1, :2].tolist() == [-2.0, -2.0]
    assert mean[2, 0] == 4.0 and mean[2, 3] == 4.0 and count[mask.bool()].tolist() == [1] * 8


def test_a_turns_sibling_value_is_the_other_episodes_mean_return_from_its_board():
    returns = torch.tensor([[4.0, 4.0, 0.0, 1.0, 1.0],
                            [2.0, 2.0, 0.0, 2.0, 2.0],
                            [9.0, 9.0, 0.0, 0.0, 0.0],
                            [6.0, 6.0, 0.0, 6.0, 6.0]])
    mask = torch.tensor([[1, 1, 0, 1, 1]] * 3 + [[1, 1, 0, 1, 1]])
    state_ids = torch.tensor([[0, 0, -1, 1, 1],
                              [0, 0, -1, 1, 1],
                              [0, 0, -1, -1, -1],
                              [0, 0, -1, 0, 0]])  # row 3 meets board 0 twice: its own visits
    episodes = torch.tensor([0, 1, 2, 3])
    mean, count = sibling_returns(returns, state_ids, episodes, mask)
    # (2 + 9 + 6 + 6) / 4: every other episode's visit of the board, not its own 4
    assert mean[0, :2].tolist() == pytest.approx([23 / 4] * 2)
    assert count[0, :2].tolist() == [4, 4]
    assert mean[3, 0] == pytest.approx(5.0) and count[3, 0] == 3  # not its own later visit
    assert mean[0, 3] == pytest.approx(2.0) and mean[1, 3] == pytest.approx(1.0)
    assert count[2, 3:].tolist() == [0, 0] and count[:, 2].tolist() == [0, 0, 0, 0]


def test_the_blend_counts_the_critic_as_pseudocount_episodes():
    values = torch.tensor([[1.0, 1.0, 1.0]])
    mixed = blend(values, torch.tensor([[5.0, 5.0, 5.0]]), torch.tensor([[0.0, 1.0, 3.0]]), 1.0)
    assert mixed.tolist() == [[1.0, 3.0, 4.0]]
    with pytest.raises(ValueError, match="pseudocount"):
        blend(values, values, values, 0.0)


def test_the_values_gae_reads_learn_from_siblings_and_the_critic_is_reported_beside(tmp_path):
    """Two games of two episodes: each game's episodes get the same return and the games differ,
    so the other episode from the same board predicts every return; a new critic does not."""
    trajectories = [episode(g, ["A", "B"], [0.0, 4.0 if g else -4.0], seed=2 * g + i)
                    for g in (0, 1) for i in (0, 1)]
    batch = to_batch(trajectories, pad_token_id=0, state_ids=True)
    trainer = tiny_trainer(tmp_path, "critic.sibling_pseudocount=0.01")
    assert trainer.needs_board_ids
    metrics = trainer.updater.update(batch, StageTimer())
    assert metrics["critic/vf_explained_var"] > 0.99
    assert metrics["critic/head_explained_var"] < 0.5
    assert metrics["critic/sibling_share"] == 1.0 and metrics["critic/siblings_mean"] == 1.0
    plain = tiny_trainer(tmp_path / "plain").updater.update(batch, StageTimer())
    assert "critic/head_explained_var" not in plain
    assert plain["critic/vf_explained_var"] == pytest.approx(metrics["critic/head_explained_var"])


def test_below_lambda_one_the_values_are_also_scored_against_whole_returns(tmp_path):
    """At lam < 1 GAE's returns lean on the values themselves, so ``vf_explained_var`` can
    credit a critic for agreeing with itself; ``mc_explained_var`` scores the same values
    against the Monte-Carlo returns-to-go. At lam 1 the two are one number."""
    trajectories = [episode(g, ["A", "B", "C"], [0.0, 1.0 if i else 0.0, 3.0 if g else -3.0],
                            seed=2 * g + i) for g in (0, 1) for i in (0, 1)]
    batch = to_batch(trajectories, pad_token_id=0, state_ids=True)
    turn = ("critic.sibling_pseudocount=1", "algorithm.gamma_unit=turn")
    whole = tiny_trainer(tmp_path / "whole", *turn).updater.update(batch, StageTimer())
    assert whole["critic/mc_explained_var"] == pytest.approx(whole["critic/vf_explained_var"])
    lam = tiny_trainer(tmp_path / "lam", *turn, "algorithm.lam=0.5").updater.update(
        batch, StageTimer())
    assert lam["critic/vf_explained_var"] > lam["critic/mc_explained_var"] + 0.05
    # the same critic and siblings give the same values: scored against whole returns alike
    assert lam["critic/mc_explained_var"] == pytest.approx(whole["critic/mc_explained_var"])


def test_sibling_values_are_the_local_engines_critics_and_unused_without_one(tmp_path):
    # GRPO has no critic: the CPU preset's sibling values do not stop it, and nothing blends
    grpo = tiny_trainer(tmp_path, "critic.sibling_pseudocount=2", "algorithm.adv_estimator=grpo")
    assert grpo.critic is None and not grpo.needs_board_ids  # its batches skip the board ids
    batch = to_batch([episode(0, ["A"], [1.0]), episode(0, ["A"], [2.0], seed=1)],
                     pad_token_id=0)  # no board ids: a blend would refuse it
    assert "critic/sibling_share" not in grpo.updater.update(batch, StageTimer())
    with pytest.raises(ValueError, match="critic.sibling_pseudocount"):
        compose_config(["critic.sibling_pseudocount=0"])
    with pytest.raises(ValueError, match="algorithm.gamma_unit='turn'"):
        compose_config(["critic.sibling_pseudocount=2", "algorithm.gamma=0.99",
                        "algorithm.gamma_unit=token"])
    assert compose_config(["critic.sibling_pseudocount=2", "algorithm.gamma=0.99",
                           "algorithm.gamma_unit=turn"]).critic.sibling_pseudocount == 2
    with pytest.raises(ValueError, match="critic.sibling_pseudocount=2.0 is not allowed with "
                                         "backend='verl'"):
        compose_config(["hardware=cpu-verl", "critic.sibling_pseudocount=2"])


def test_a_batch_without_board_ids_is_refused_by_name(tmp_path):
    batch = to_batch([episode(0, ["A"], [1.0]), episode(0, ["A"], [2.0], seed=1)], pad_token_id=0)
    trainer = tiny_trainer(tmp_path, "critic.sibling_pseudocount=1")
    with pytest.raises(ValueError, match="state_ids"):
        trainer.updater.update(batch, StageTimer())
