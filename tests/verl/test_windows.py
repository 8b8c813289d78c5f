"""Context windows on verl's V1 trainer: the AgentLoop returns one row per window, driven by
verl's own ``AgentLoopWorkerTQ`` (on a fake TransferQueue, as in test_agent_loop.py). Each row's
prompt is the context its replies were sampled from, every model token is in exactly one row,
and verl's per-row GAE at γ = λ = 1 gives the whole episode's returns."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_agent_loop import fake, one_action_per_turn, presets, rollout, tokenizer, workers  # noqa: F401
from verl_fakes import ORACLE, play_script, task_row

from agentrl.verl.episode_task import EpisodeTask
from agentrl.verl.windows import windowed_context_tokens

PRESET = "simpleSokobanAgent"
SCRIPT = ["no format", "still no format", ORACLE, ORACLE, ORACLE]


def windowed_game(tokenizer, presets, history_window: int = 1):  # noqa: F811
    config = one_action_per_turn(presets, PRESET, history_window=history_window)
    game = play_script(tokenizer, PRESET, config, 1, SCRIPT)
    assert len(game.rewards) >= 4
    return game


def test_v1_rows_are_the_windows_with_the_whole_episodes_returns(workers, fake, tmp_path,  # noqa: F811
                                                                 tokenizer, presets):
    from verl import DataProto
    from verl.trainer.ppo.core_algos import AdvantageEstimator
    from verl.trainer.ppo.ray_trainer import compute_advantage

    game = windowed_game(tokenizer, presets)
    result = rollout(workers, fake, "v1", tmp_path, [game], n=1)
    calls = fake.calls
    assert len(calls) == len(game.replies)
    # history_window 1: the first row holds turns 1-2, then one turn a row (2 blocks would be kept)
    assert len(result.samples) == len(calls) - 1
    firsts = [0, *range(2, len(calls))]  # the call of each row's first reply
    model_tokens, returns = [], []
    for sample, first in zip(result.samples, firsts):
        assert sample.prompt == calls[first].prompt_ids  # the context it was sampled from
        model_tokens += [t for t, m in zip(sample.response, sample.mask) if m]
    assert model_tokens == [t for call in calls for t in call.token_ids]  # each exactly once
    earlier = calls[-2].prompt_ids + calls[-2].token_ids
    assert calls[-1].prompt_ids[:len(earlier)] != earlier  # an older turn left the context

    mask = result.padded["response_mask"]
    values = torch.where(mask.bool(), torch.tensor(0.5), torch.tensor(9.0))  # 9: never read
    data = DataProto.from_dict(tensors={
        "response_mask": mask, "values": values, "token_level_rewards": result.padded["rm_scores"]})
    gae = compute_advantage(data, adv_estimator=AdvantageEstimator.GAE, gamma=1.0, lam=1.0,
                            config=result.config.algorithm).batch["returns"]
    for row in range(len(result.samples)):
        returns += gae[row][mask[row].bool()].tolist()
    by_hand = [sum(game.rewards[turn:]) for turn, call in enumerate(calls)
               for _ in call.token_ids]  # each reply's tokens: the return from its turn on
    assert returns == pytest.approx(by_hand, abs=1e-5)
    assert sum(sample.rm_scores[-1] for sample in result.samples[-1:]) == pytest.approx(
        game.rewards[-1])


def test_every_windowed_row_fits_verls_tensors(workers, fake, tmp_path, tokenizer,  # noqa: F811
                                               presets):
    """A response width that holds the newest turn block and a reply, not two blocks: the
    context cap, not the history window (3), drops the older turns, and no row overflows."""
    game = windowed_game(tokenizer, presets, history_window=3)
    reply = game.config.max_response_tokens  # a reply's most tokens
    block = max(len(tokenizer.encode(text, add_special_tokens=False)) + 1 + len(observation)
                for text, observation in zip(game.replies, game.observations))
    prompt_length, response_length = len(game.prompt_ids) + 2 * block, block + reply
    result = rollout(workers, fake, "v1", tmp_path, [game], n=1, prompt_length=prompt_length,
                     response_length=response_length)
    assert len(fake.calls) == len(game.replies)  # the whole game was played
    assert len(result.samples) == len(game.replies) - 1  # a window from the third turn on
    for sample in result.samples:
        assert len(sample.prompt) <= prompt_length
        assert len(sample.response) <= response_length
    cap = windowed_context_tokens(len(game.prompt_ids), 4096, prompt_length, response_length,
                                  reply)
    assert cap == len(game.prompt_ids) + response_length
    assert all(len(call.prompt_ids) + reply <= cap for call in fake.calls)


def test_a_windowed_task_needs_the_v1_trainer(tokenizer, presets):  # noqa: F811
    game = windowed_game(tokenizer, presets)
    extra_info = task_row(game, 0, max_context_tokens=4096)["extra_info"]
    with pytest.raises(ValueError, match=r"history_window=1; not allowed on verl's legacy "
                                         r"trainer.*allowed: 0, or trainer.use_v1=true"):
        EpisodeTask.from_extra_info(extra_info)
    task = EpisodeTask.from_extra_info(extra_info, windows=True)
    assert task.agent_config == dataclasses.replace(game.config, held_out_of=None)
