"""PPO masters a pool: on a fixed pool of training games (``train.pool``) the tiny model's
greedy success rises from 0 to every game, for a reason the test controls.

The games are BlocksWorld boards one move from their goal, played for one turn: under
constrained decoding a reply samples only the block and the target, so each game is a
contextual bandit over its legal moves with one paying move, and the pool holds games the
untrained model's greedy move loses. Only a correct policy gradient moves greedy play onto the
paying moves: with the advantages' sign flipped the same run leaves them lost. The pool's
games share their paying target: the tiny random model barely tells two boards apart, so games
whose paying targets differ would pull its one target choice two ways (a limit of the tiny
model, seen as one game won and one lost, not of PPO).
"""

from __future__ import annotations

import dataclasses

import pytest

from agentrl.agents import Agent
from agentrl.config import build_config, compose_config
from agentrl.envs.splits import split_seeds
from agentrl.trainers import ppo
from agentrl.trainers.local import LocalTrainer

PRESET = "tightBlocksworldTurnsAgent"
POOL = 2
STEPS = 14


def one_move_games(config, count: int) -> dict[int, str]:
    """Training seeds whose board is one move from its goal, with at least 3 legal moves, and
    the target of that move."""
    found = {}
    for seed in split_seeds("train", 600):
        with Agent(config.agents[PRESET]) as agent:
            agent.reset(seed=seed)
            game = agent.env.unwrapped
            plan = game.oracle_plan() or []
            if len(plan) == 1 and len(game.valid_actions()) >= 3:
                found[seed] = plan[0].rsplit(" ", 1)[-1]
        if len(found) == count:
            return found
    raise AssertionError("too few one-move boards among 600 training seeds")


def pool_config(tmp_path, pool: list[int]):
    base = compose_config(["model=tiny", f"agents.{PRESET}.max_turns=1",
                           f"agents.{PRESET}.max_actions_all_turns=1"]).to_dict()
    base.update(run_dir=str(tmp_path / "run"), seed=1, threads=1)
    base["train"].update(presets=[PRESET], group_num=len(pool), group_size=8,
                         total_steps=STEPS, pool=pool)
    base["val"].update(presets=[PRESET], group_num=1, test_freq=0, before_train=False)
    base["rollout"].update(constrained_actions=True, max_context_tokens=1024)
    base["actor"].update(lr=1e-3, micro_batch_size=16, ppo_epochs=2)
    base["critic"].update(lr=2e-3, share_backbone=True)
    base["trainer"].update(logger=[], plot=False, save_freq=0)
    return build_config(base)


def greedy_wins(trainer: LocalTrainer, pool: list[int]) -> list[bool]:
    sampling = dataclasses.replace(trainer.sampling, greedy=True)
    trajectories = trainer.rollout(trainer.train_presets, pool, 1, sampling, desc="pool")
    return [bool(t.success) for t in trajectories]


@pytest.mark.slow
@pytest.mark.parametrize("flip", [False, True], ids=["ppo", "flipped-advantages"])
def test_ppo_masters_a_pool_its_greedy_play_loses(flip, tmp_path, monkeypatch,
                                                   one_torch_thread):
    if flip:
        real = ppo.compute_advantages

        def flipped(*args, **kwargs):
            advantages, returns = real(*args, **kwargs)
            return -advantages, returns

        monkeypatch.setattr(ppo, "compute_advantages", flipped)
    targets = one_move_games(pool_config(tmp_path, [0]), 24)
    candidates = list(targets)
    trainer = LocalTrainer(pool_config(tmp_path, candidates[:1]))
    try:
        lost = [seed for seed, won in zip(candidates, greedy_wins(trainer, candidates))
                if not won]
    finally:
        trainer.close()
    target = max({targets[seed] for seed in lost}, key=[targets[s] for s in lost].count)
    lost = [seed for seed in lost if targets[seed] == target][:POOL]
    assert len(lost) == POOL, "the untrained model's greedy move loses some one-move boards"
    trainer = LocalTrainer(pool_config(tmp_path, lost))
    try:
        trainer.fit()
        after = greedy_wins(trainer, lost)
    finally:
        trainer.close()
    print("pool", lost, "greedy wins after", after, "flipped" if flip else "")
    if flip:
        assert not any(after), "pushed away from the paying moves, greedy play stays lost"
    else:
        assert all(after), f"PPO did not master its pool: {after}"
