"""How much of a PPO step's returns could a critic that reads the state explain? An estimate
of ``critic/vf_explained_var``'s reach on the default preset's batches, simulated.

    python scripts/bench/critic_ceiling.py                     # 2000 steps a setting
    python scripts/bench/critic_ceiling.py --steps 200 --out /tmp/ceiling.json

The default preset (``tightBlocksworldTurnsAgent``: 3-4 blocks, one move a turn for 6 turns,
-1 a move, +10 at the goal) played by a model of a policy: each game has a skill q, drawn per
game from a Beta distribution of mean ``--skill`` (concentration ``--concentration``), and every
turn the policy plays one of the oracle's shortest-plan moves with probability q, else a
uniformly random legal move (constrained decoding: every move is legal). A PPO step plays
``--groups`` games x ``--group-size`` episodes (the CPU preset's 4 x 8); with ``dropwon`` a
group whose episodes all won with the same return is left out of the step, the trainer's rule
(``rollout.drop_uniform_groups``, ``drop_uniform_outcome: won``); with ``keepall`` none is.

Each turn is a row with its return-to-go (every token of a reply shares it, so rows weigh
alike), and each step's explained variance is the trainer's formula
(:func:`agentrl.trainers.ppo_update.explained_variance`) of two baselines, each the mean
return-to-go per key over the rows such steps keep (``--table-episodes`` other episodes,
under the same rule: a critic fits the rows it trains on):

- ``state``: a summary of what the prompt shows that decides the return: the block count,
  the oracle's distance to the goal and the turns left (the exact arrangement, which a critic
  also reads, is left out, so a critic could do a little better);
- ``state+skill``: also the policy's skill on this game (to a tenth): roughly what a critic
  that had learnt how well the policy plays every game could reach;
- ``state+siblings``: ``state`` blended with the mean return-to-go of the group's other
  episodes from the same board at the same turn, the table counting as ``--pseudocount``
  episodes: the trainer's ``critic.sibling_pseudocount``, by its own functions
  (:mod:`agentrl.trainers.sibling_values`), over a critic that read the state perfectly.

The table: per setting, success, the share of groups kept, the mean and median per-step
explained variance (the issue's mark, >= 0.2, averages it over PPO steps 5-20) and the share
of 12-step runs (steps 5-16 of a 16-step run) whose mean reaches 0.2. A model, not a
measurement: its policy has no memory and a skill fixed over a run.
"""

from __future__ import annotations

import argparse
import collections
import functools
import random
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import agentrl  # noqa: F401  (first: OpenMP's passive waiting is set before torch loads it)
import torch

from agentrl.cli.bench import write_result
from agentrl.envs.blocksworld import (GOAL_REWARD, MOVE_PENALTY, State, all_states, apply_move,
                                      legal_moves)
from agentrl.trainers.ppo_update import explained_variance
from agentrl.trainers.sibling_values import blend, sibling_returns

BLOCKS = (3, 4)
"""The default preset's block counts (``min_blocks: 3`` of the ``text`` preset's 2-4)."""
TURNS = 6
MARK = 0.2
"""The issue's mark: mean explained variance over PPO steps 5-20."""
RUN_STEPS = 12
"""Steps 5-16 of a 16-step run: the window the mark averages."""
BASELINES = ("state", "state+skill", "state+siblings")
TABLES = 2
"""The baselines that are a table of conditional means (the first two)."""
Row = tuple[tuple, tuple, State, float]
"""(state key, state+skill key, board, return-to-go) of one turn."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--steps", type=int, default=2000, help="PPO steps simulated a setting")
    parser.add_argument("--skill", type=float, nargs="+", default=[0.55, 0.7],
                        help="mean per-game skill (chance of an oracle move), one setting each")
    parser.add_argument("--concentration", type=float, default=2.0,
                        help="a + b of the skill's Beta: lower spreads games wider (default 2)")
    parser.add_argument("--groups", type=int, default=4, help="games a step (default 4)")
    parser.add_argument("--group-size", type=int, default=8, help="episodes a game (default 8)")
    parser.add_argument("--table-episodes", type=int, default=200_000,
                        help="episodes the baselines' tables are estimated on")
    parser.add_argument("--pseudocount", type=float, default=2.0,
                        help="state+siblings: episodes the state table counts as (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench_results/critic_ceiling.json")
    args = parser.parse_args(argv)
    for key in ("steps", "groups", "group_size", "table_episodes"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be >= 1")
    if not all(0 < s < 1 for s in args.skill) or args.concentration <= 0:
        parser.error("--skill must lie in (0, 1) and --concentration be > 0")
    if args.pseudocount <= 0:
        parser.error("--pseudocount must be > 0")
    return args


@functools.cache
def distances(n: int) -> dict[State, dict[State, int]]:
    """Shortest-plan length from every arrangement to every goal of ``n`` blocks (moves are
    reversible, so a search from each goal gives every start's distance to it)."""
    table = {}
    for goal in all_states(n):
        seen, frontier = {goal: 0}, collections.deque([goal])
        while frontier:
            state = frontier.popleft()
            for move in legal_moves(state):
                after = apply_move(state, *move)
                if after not in seen:
                    seen[after] = seen[state] + 1
                    frontier.append(after)
        table[goal] = seen
    return table


def new_game(rng: random.Random) -> tuple[State, State]:
    """A start and a goal as the environment draws them: uniform, goal != start."""
    states = all_states(rng.choice(BLOCKS))
    start, goal = rng.sample(range(len(states)), 2)
    return states[start], states[goal]


def episode(rng: random.Random, start: State, goal: State, skill: float) -> tuple[list[Row], bool]:
    """One episode's rows and whether it won."""
    to_goal = distances(len(start))[goal]
    state, seen, boards, rewards = start, [], [], []
    for turn in range(TURNS):
        seen.append((len(state), to_goal[state], TURNS - turn))
        boards.append(state)
        moves = list(legal_moves(state))
        best = [m for m in moves if to_goal[apply_move(state, *m)] < to_goal[state]]
        state = apply_move(state, *(rng.choice(best) if rng.random() < skill
                                    else rng.choice(moves)))
        won = state == goal
        rewards.append(MOVE_PENALTY + GOAL_REWARD * won)
        if won:
            break
    to_go = [sum(rewards[t:]) for t in range(len(rewards))]
    bin_ = round(skill, 1)
    return [(key, (*key, bin_), board, g) for key, board, g in zip(seen, boards, to_go)], \
        state == goal


def skills(rng: random.Random, mean: float, concentration: float) -> Iterator[float]:
    while True:
        yield rng.betavariate(mean * concentration, (1 - mean) * concentration)


def play_group(rng: random.Random, draw: Iterator[float], size: int
               ) -> list[tuple[list[Row], bool]]:
    """``size`` episodes of one new game at one skill."""
    game, skill = new_game(rng), next(draw)
    return [episode(rng, *game, skill) for _ in range(size)]


def dropped(group: list[tuple[list[Row], bool]]) -> bool:
    """The trainer's rule (``drop_uniform_groups`` with ``drop_uniform_outcome: won``): every
    episode won, and with the same return (its first row's return-to-go)."""
    return all(won for _, won in group) and len({rows[0][-1] for rows, _ in group}) == 1


def tables(args: argparse.Namespace, mean: float, drop: bool, rng: random.Random
           ) -> list[dict[tuple, float]]:
    """Each baseline's conditional mean of the return-to-go, per key, over the rows a step
    keeps (a critic fits the rows it trains on)."""
    sums = [collections.defaultdict(lambda: [0.0, 0]) for _ in range(TABLES)]
    draw = skills(rng, mean, args.concentration)
    for _ in range(max(1, args.table_episodes // args.group_size)):
        group = play_group(rng, draw, args.group_size)
        if drop and dropped(group):
            continue
        for rows, _ in group:
            for *keys, _, g in rows:
                for table, key in zip(sums, keys):
                    table[key][0] += g
                    table[key][1] += 1
    return [{key: total / count for key, (total, count) in table.items()} for table in sums]


def simulate(args: argparse.Namespace, mean: float, drop: bool) -> dict[str, Any]:
    """``--steps`` steps at one skill, with or without the uniform all-won groups."""
    rng = random.Random(f"{args.seed}/{mean}")
    draw = skills(rng, mean, args.concentration)
    values = tables(args, mean, drop, random.Random(f"{args.seed}/{mean}/tables"))
    per_step = {name: [] for name in BASELINES}
    wins = episodes = kept_groups = 0
    for _ in range(args.steps):
        rows, places = [], []  # places: (group, episode) of each row
        for g in range(args.groups):
            group = play_group(rng, draw, args.group_size)
            wins += sum(won for _, won in group)
            episodes += len(group)
            if drop and dropped(group):
                continue
            kept_groups += 1
            for e, (played, _) in enumerate(group):
                rows += played
                places += [(g, e)] * len(played)
        if not rows:  # every group dropped: no update, no critic metric (as the trainer)
            continue
        returns = torch.tensor([row[-1] for row in rows])
        mask = torch.ones_like(returns)
        predictions = [torch.tensor([values[i].get(row[i], 0.0) for row in rows])
                       for i in range(TABLES)]
        predictions.append(with_siblings(predictions[0], rows, places, args.pseudocount))
        for name, predicted in zip(BASELINES, predictions):
            ev = explained_variance(returns, predicted, mask)
            if ev == ev:  # NaN: equal returns, nothing to explain
                per_step[name].append(ev)
    return {"skill": mean, "groups": "dropwon" if drop else "keepall",
            "success": wins / episodes,
            "kept_groups_share": kept_groups / (args.steps * args.groups),
            **{name: summary(evs) for name, evs in per_step.items()}}


def with_siblings(prior: torch.Tensor, rows: list[Row], places: list[tuple[int, int]],
                  pseudocount: float) -> torch.Tensor:
    """``prior`` blended with the sibling values of the step's rows, by the trainer's functions:
    each row is a one-token turn whose id is its (group, board, turns left)."""
    ids: dict[tuple, int] = {}
    state_ids = torch.tensor([[ids.setdefault((group, row[2], row[0][2]), len(ids))]
                              for row, (group, _) in zip(rows, places)])
    episodes = torch.tensor([group * len(places) + e for group, e in places])
    returns = torch.tensor([[row[-1]] for row in rows])
    mean, count = sibling_returns(returns, state_ids, episodes, torch.ones_like(returns))
    return blend(prior[:, None], mean, count, pseudocount)[:, 0]


def summary(evs: list[float]) -> dict[str, float | None]:
    """Mean and median per-step explained variance, and the share of runs of ``RUN_STEPS``
    consecutive steps whose mean reaches the mark (None where no step had one)."""
    runs = [statistics.mean(evs[i:i + RUN_STEPS]) for i in range(0, len(evs) - RUN_STEPS + 1,
                                                                   RUN_STEPS)]
    return {"ev_mean": statistics.mean(evs) if evs else None,
            "ev_median": statistics.median(evs) if evs else None,
            "runs_reaching_mark": sum(r >= MARK for r in runs) / len(runs) if runs else None,
            "steps": len(evs)}


def show(rows: list[dict[str, Any]]) -> None:
    print(f"{'skill':>5} {'groups':>8} {'success':>7} {'kept':>5} | "
          + " | ".join(f"{name + ': EV mean, median, runs >= 0.2':>38}" for name in BASELINES))
    for r in rows:
        cells = [" ".join(f"{'-' if v is None else format(v, fmt):>12}" for v, fmt in (
            (r[n]["ev_mean"], ".3f"), (r[n]["ev_median"], ".3f"),
            (r[n]["runs_reaching_mark"], ".0%"))) for n in BASELINES]
        print(f"{r['skill']:>5.2f} {r['groups']:>8} {r['success']:>7.1%} "
              f"{r['kept_groups_share']:>5.0%} | " + " | ".join(cells))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    rows = [simulate(args, mean, drop) for mean in args.skill for drop in (False, True)]
    show(rows)
    result = {"what": "the ceiling of critic/vf_explained_var per PPO step on the default "
                      "preset's batches, simulated (scripts/bench/critic_ceiling.py)",
              "settings": {k: v for k, v in vars(args).items() if k != "out"}, "mark": MARK,
              "run_steps": RUN_STEPS, "rows": rows}
    write_result(Path(args.out), result)
    return result


if __name__ == "__main__":
    main()
