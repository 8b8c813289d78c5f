"""Collapse guards and micro-batch slicing."""

from __future__ import annotations

import logging

import pytest
import torch

from agentrl.rollout import to_batch
from agentrl.rollout.records import Trajectory, Turn
from agentrl.trainers.guards import all_finite, collapse_metrics, is_echo
from agentrl.trainers.microbatch import micro_rows, pad_responses


def test_echo_is_repetition_not_length():
    assert is_echo("Up " * 40) and is_echo("a" * 60)
    assert not is_echo("Up " * 5)  # too short to judge
    prose = ("The box sits left of the target, so I walk around it, push it right twice, "
             "then check whether the wall blocks the last move before I answer.")
    assert not is_echo(prose)


def turn(text: str, tokens: int) -> Turn:
    return Turn(prompt_ids=(), response_ids=tuple(range(tokens)), logprobs=(0.0,) * tokens,
                reward=0.0, format_ok=True, num_actions=0, num_valid=0, num_effective=0,
                truncated_by_length=False, text=text)


def episode(*turns: Turn) -> Trajectory:
    return Trajectory(preset="p", seed=0, group_index=0, prompt_ids=[1], response_ids=[],
                      response_mask=[], response_logprobs=[], turn_end_positions=[],
                      turn_rewards=[], success=False, episode_return=0.0,
                      num_turns=len(turns), turns=list(turns))


def test_collapse_metrics_count_echoes_and_warn(caplog):
    trajectories = [episode(turn("Up " * 40, 40), turn("Right then up.", 4)), episode(turn("a" * 80, 1))]
    with caplog.at_level(logging.WARNING, logger="agentrl.train"):
        metrics = collapse_metrics(trajectories, max_new_tokens=64)
    assert metrics["guard/echo_rate"] == 2 / 3
    assert metrics["guard/reply_tokens"] == 15.0
    assert "echo trap" in caplog.text


def test_short_replies_warn_only_when_longer_ones_were_allowed(caplog):
    with caplog.at_level(logging.WARNING, logger="agentrl.train"):
        collapse_metrics([episode(turn("A", 1))], max_new_tokens=1)
    assert "collapsed" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="agentrl.train"):
        collapse_metrics([episode(turn("A", 1))], max_new_tokens=64)
    assert "collapsed" in caplog.text


def test_all_finite():
    assert all_finite(torch.zeros(2), torch.ones(3))
    assert not all_finite(torch.zeros(2), torch.tensor([1.0, float("nan")]))
    assert not all_finite(torch.tensor([float("inf")]))


def padded(prompt: list[int], response: list[int]) -> Trajectory:
    n = len(response)
    return Trajectory(preset="p", seed=0, group_index=0, prompt_ids=prompt, response_ids=response,
                      response_mask=[1] * n, response_logprobs=[-1.0] * n,
                      turn_end_positions=[n - 1], turn_rewards=[1.0], success=True,
                      episode_return=1.0, num_turns=1)


def test_micro_rows_drop_only_shared_padding():
    batch = to_batch([padded([1, 2, 3, 4], [5, 6, 7, 8, 9]), padded([1, 2], [5, 6]),
                      padded([1, 2, 3], [5])], pad_token_id=0)
    micro = micro_rows(batch, torch.tensor([1, 2]))
    # rows 1-2: longest prompt 3 (of 4 columns), longest response 2 (of 5)
    assert micro["prompts"].shape == (2, 3) and micro["responses"].shape == (2, 2)
    assert micro["input_ids"].shape == (2, 5)
    assert micro["input_ids"][0].tolist() == [0, 1, 2, 5, 6]
    assert micro["token_level_rewards"][0].tolist() == [0.0, 1.0]
    restored = pad_responses(micro["response_mask"], batch["responses"].shape[1])
    assert restored.tolist() == batch["response_mask"][1:].tolist()


def test_micro_rows_and_padding_keep_per_token_features():
    batch = to_batch([padded([1, 2, 3], [5, 6, 7]), padded([1], [5])], pad_token_id=0)
    batch["features"] = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 4)
    micro = micro_rows(batch, torch.tensor([1]))
    assert micro["features"].shape == (1, 1, 4)
    restored = pad_responses(micro["features"], 3)
    assert restored.shape == (1, 3, 4) and restored[0, 1:].abs().sum() == 0
    assert restored[0, 0].tolist() == batch["features"][1, 0].tolist()


def test_logprob_gap_is_measured_on_model_tokens_and_warns_once(caplog):
    from agentrl.trainers.guards import LOGPROB_GAP_WARN, logprob_gap

    sampler = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])
    trainer = torch.tensor([[-1.1, -2.0, -9.0], [-0.5 - 2 * LOGPROB_GAP_WARN, -7.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    with caplog.at_level("WARNING", logger="agentrl.train"):
        gap = logprob_gap(sampler, trainer, mask)
    assert gap["rollout/logprob_gap_max"] == pytest.approx(2 * LOGPROB_GAP_WARN)
    assert gap["rollout/logprob_gap_mean"] == pytest.approx((0.1 + 0 + 2 * LOGPROB_GAP_WARN) / 3)
    assert len([r for r in caplog.records if "log-probs differ" in r.getMessage()]) == 1
    caplog.clear()
    with caplog.at_level("WARNING", logger="agentrl.train"):
        logprob_gap(sampler, sampler, mask)
    assert not caplog.records
