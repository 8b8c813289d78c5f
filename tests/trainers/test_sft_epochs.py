"""An SFT epoch covers every demonstration window once, in mini-batches of whole episodes, and
the demonstrations depend on the run seed.

Episodes here keep one past turn (``history_window: 1``), so each is several context-window
rows of the batch (:func:`agentrl.rollout.to_batch`): rows outnumber episodes, the case where a
mini-batch counted in rows and an epoch counted in episodes left most windows untrained.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
import torch

from agentrl.config import build_config
from agentrl.envs.splits import split_of
from agentrl.rollout import to_batch
from agentrl.trainers import imitation, sft, warm_start
from test_sft import REPLAY_PRESET, sft_config

EPISODES, MINI = 6, 2
WINDOWED = {**REPLAY_PRESET, "max_turns": 4, "max_actions_all_turns": 4, "history_window": 1}


def windowed_config(tmp_path, seed=0, episodes=EPISODES):
    data = sft_config(tmp_path, episodes=episodes, mini_batch_size=MINI, micro_batch_size=1,
                      epochs=2).to_dict()
    data.update(agents={"replay": WINDOWED}, seed=seed)
    return build_config(data)


@pytest.fixture
def recorded(monkeypatch):
    """The rows each SFT update trains on, in order (the update itself is not run)."""
    calls: list[torch.Tensor] = []

    def record(_model, _params, _optim, _batch, rows, _config):
        calls.append(rows.clone())
        return 1.0, 0.0

    monkeypatch.setattr(sft, "sft_update", record)
    monkeypatch.setattr(warm_start, "sft_update", record)
    return calls


def assert_epochs_cover_every_window(calls, batch, epochs):
    """Each update holds all windows of MINI whole episodes; each epoch every row once."""
    episode = batch["episode_index"]
    n_rows, per_epoch = episode.numel(), -(-EPISODES // MINI)
    assert n_rows > EPISODES, "windowed episodes must outnumber their rows to test this"
    assert len(calls) == epochs * per_epoch
    for rows in calls:
        episodes = episode[rows].unique()
        assert len(episodes) == MINI
        assert sorted(rows.tolist()) == torch.isin(episode, episodes).nonzero().flatten().tolist()
    for e in range(epochs):
        touched = Counter(torch.cat(calls[e * per_epoch:(e + 1) * per_epoch]).tolist())
        assert touched == Counter(range(n_rows)), f"epoch {e}: rows trained {touched}"
    assert not torch.equal(calls[0], calls[per_epoch])  # a fresh order each epoch


def test_agentrl_sft_trains_every_window_of_every_demonstration_once_per_epoch(
        tmp_path, recorded):
    trainer = sft.SFTTrainer(windowed_config(tmp_path))
    try:
        demos = trainer.demonstrations()
        losses = trainer.train(demos)
        batch = to_batch(demos, trainer.pad_token_id)
    finally:
        trainer.close()
    assert len(demos) == EPISODES and len(losses) == len(recorded)
    assert_epochs_cover_every_window(recorded, batch, epochs=2)


def test_the_warm_start_steps_train_every_window_of_every_demonstration_once_per_epoch(
        tmp_path, tiny, recorded):
    model, tokenizer = tiny
    loop = asyncio.new_event_loop()
    try:
        warm = warm_start.WarmStart(windowed_config(tmp_path), model, tokenizer, loop,
                                    tokenizer.pad_token_id)
        metrics = [warm.step(step) for step in range(1, 7)]
        batch = warm.demonstrations()
    finally:
        loop.close()
    assert_epochs_cover_every_window(recorded, batch, epochs=2)
    assert [m["sft/epoch"] for m in metrics] == pytest.approx([k / 3 for k in range(1, 7)])
    rows = [m["sft/rows"] for m in metrics]
    assert sum(rows[:3]) == batch["episode_index"].numel()  # an epoch's rows, each once


def test_demonstrations_depend_on_the_run_seed_and_stay_in_the_training_split(tmp_path, tiny):
    _, tokenizer = tiny
    loop = asyncio.new_event_loop()
    try:
        seeds = [[t.seed for t in imitation.oracle_demonstrations(
            windowed_config(tmp_path, seed=run_seed, episodes=3), tokenizer, loop)]
            for run_seed in (0, 1, 0)]
    finally:
        loop.close()
    assert not set(seeds[0]) & set(seeds[1]), seeds  # other games for another training seed
    assert seeds[2] == seeds[0]  # the same again: a resumed run replays them
    assert {split_of(s) for s in seeds[0] + seeds[1]} == {"train"}


def test_demonstration_seeds_are_a_function_of_the_run_seed_and_the_index():
    from agentrl.envs.splits import train_seeds
    from agentrl.rollout.demonstrations import demonstration_seeds

    many = demonstration_seeds(192, seed=7)
    assert demonstration_seeds(8, seed=7) == many[:8]  # more episodes extend the same list
    assert len(set(many)) == 192 and {split_of(s) for s in many} == {"train"}
    ppo_games = set(train_seeds(1, 1_000, seed=7))  # PPO's first 500 steps of 2 groups
    assert not ppo_games & set(many)
    for run_seed in (0, 9, 10**6, 2**31):  # wrap around the training range, never out of it
        assert {split_of(s) for s in demonstration_seeds(4, seed=run_seed)} == {"train"}
