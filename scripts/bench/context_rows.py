"""Rows of the default preset with and without each turn's fresh chat, side by side.

    python scripts/bench/context_rows.py                       # embedded model, CPU preset
    python scripts/bench/context_rows.py --episodes 32 --repeats 2 model=tiny
    python scripts/bench/context_rows.py --out /tmp/rows.json

Two layouts of ``tightBlocksworldTurnsAgent`` (the training default of ``quick_train.sh``):

- ``history``: the preset as it was (``context: history``, ``history_window: 1``, ``rules:
  full``, the ``text`` rendering, the BlocksWorld hint and the default system prompt): a turn's context is the first
  prompt (instructions, rules, format, limits, the first state) plus the previous reply and
  the feedback and new state after it;
- ``state``: the preset as configured (``context: state``, ``rules: brief``, the ``compact``
  rendering): a turn's context is its own chat, the brief rules and the current state with
  its goal and turns left.

**Tokens.** The same games (training seeds) are played in both layouts by the oracle and by
random legal moves, through the real rollout (:func:`agentrl.rollout.run_episode`, the
scripted replies of the warm start's demonstrations), and cut into the rows the update trains
(:func:`agentrl.rollout.batch.context_samples`): prompt + response tokens per row and per
episode, and their ratio (state / history).

**Time.** One PPO step's batch per layout (``train.group_num`` x ``train.group_size`` episodes of
the same games, each turn the oracle's move or, half the time, a random one) goes through the
local trainer's whole update (:meth:`agentrl.trainers.ppo_update.PPOUpdate.update`: scores,
advantages, critic, actor), the layouts alternating for ``--repeats`` rounds after an untimed
warm-up of each, so machine load hits both alike. Seconds per episode (median) and the
process's CPU seconds, with the load average before and after. The weights change between
runs; the cost of an update does not depend on them.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import random
import statistics
import tempfile
import time

import agentrl  # noqa: F401  (first: OpenMP's passive waiting is set before torch loads it)
import torch
from rich.console import Console
from rich.table import Table

from agentrl.agents import Agent, AgentConfig, load_agent_presets
from agentrl.agents.config import DEFAULT_SYSTEM_PROMPT
from agentrl.cli.bench import device_name, write_result
from agentrl.config import compose_config
from agentrl.engines import SamplingParams
from agentrl.envs.splits import train_seeds
from agentrl.rollout import ChatSuffix, run_episode, to_batch
from agentrl.rollout.batch import context_samples
from agentrl.rollout.demonstrations import ScriptedReplies
from agentrl.trainers.timing import StageTimer

PRESET = "tightBlocksworldTurnsAgent"
POLICIES = {"oracle": 0.0, "random": 1.0}
"""Policy -> the share of turns that play a random legal move instead of the oracle's."""
MIXED_SHARE = 0.5
"""The timed batches' share of random moves: between the oracle's short episodes and random
play's long ones."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=64,
                        help="games each policy plays in each layout (token counts)")
    parser.add_argument("--repeats", type=int, default=3, help="timed updates per layout")
    parser.add_argument("--out", default="docs/results/context_rows.json")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    return parser.parse_args(argv)


def layouts(presets: dict[str, AgentConfig]) -> dict[str, AgentConfig]:
    """The preset as configured (``state``) and as it was before (``history``)."""
    state = presets[PRESET]
    env_kwargs = {key: value for key, value in state.env_kwargs.items() if key != "render_style"}
    history = dataclasses.replace(
        state, env_kwargs=env_kwargs, context="history", rules="full", history_window=1,
        system_prompt=DEFAULT_SYSTEM_PROMPT,
        instructions=presets["blocksworldTextAgent"].instructions)
    return {"history": history, "state": state}


async def play(config: AgentConfig, seeds: list[int], share: float, tokenizer,
               group_size: int = 1, rng_seed: int = 0) -> list:
    """Scripted episodes of ``config`` on ``seeds`` (``group_size`` each) through the rollout."""
    sampling = SamplingParams(greedy=True, max_new_tokens=config.max_response_tokens)
    suffix = ChatSuffix(tokenizer)
    trajectories = []
    with Agent(config) as agent:
        for g, seed in enumerate(seeds):
            for member in range(group_size):
                llm = ScriptedReplies(agent, tokenizer,
                                      random.Random(rng_seed * 1_000_003 + seed * 97 + member),
                                      share)
                trajectories.append(await run_episode(
                    agent, seed, llm, tokenizer, sampling, max_context_tokens=4096,
                    group_index=g, preset=PRESET, suffix=suffix))
    return trajectories


def row_tokens(trajectories: list) -> dict:
    """Prompt + response tokens of the rows the update trains, per row and per episode."""
    rows = [len(s.prompt_ids) + s.end - s.start for t in trajectories for s in context_samples(t)]
    prompts = [len(s.prompt_ids) for t in trajectories for s in context_samples(t)]
    model = [sum(t.response_mask) for t in trajectories]
    return {"episodes": len(trajectories), "rows": len(rows),
            "rows_per_episode": round(len(rows) / len(trajectories), 2),
            "tokens_per_row": round(statistics.mean(rows), 1),
            "prompt_tokens_per_row": round(statistics.mean(prompts), 1),
            "tokens_per_episode": round(sum(rows) / len(trajectories), 1),
            "model_tokens_per_episode": round(sum(model) / len(trajectories), 1),
            "success": round(sum(t.success for t in trajectories) / len(trajectories), 3)}


def time_updates(trainer, batches: dict[str, dict], episodes: int, repeats: int) -> dict:
    """The trainer's whole PPO update on each layout's batch, alternating (module docstring)."""
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in batches}
    for step in range(repeats + 1):
        for name, batch in batches.items():
            start, cpu = time.perf_counter(), time.process_time()
            trainer.updater.update(dict(batch), StageTimer(), step + 1)
            if step:  # the first round warms both up
                runs[name].append((time.perf_counter() - start, time.process_time() - cpu))
    return {name: {"seconds": [round(s, 3) for s, _ in results],
                   "seconds_per_episode": round(statistics.median(s for s, _ in results)
                                                / episodes, 3),
                   "cpu_seconds_per_episode": round(statistics.median(c for _, c in results)
                                                    / episodes, 3)}
            for name, results in runs.items()}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as run_dir:
        config = compose_config([f"train.presets=[{PRESET}]", f"val.presets=[{PRESET}]",
                                 *args.overrides, f"run_dir={run_dir}", "trainer.logger=[]",
                                 "trainer.plot=false", "resume=never"])
        from agentrl.trainers.local import LocalTrainer

        trainer = LocalTrainer(config)
        try:
            tokenizer = trainer.tokenizer
            configs = layouts(load_agent_presets(config.agents_file, check_envs=False))
            seeds = train_seeds(1, args.episodes, config.seed)
            tokens = {name: {policy: row_tokens(asyncio.run(play(agent, seeds, share, tokenizer)))
                             for policy, share in POLICIES.items()}
                      for name, agent in configs.items()}
            t = config.train
            step_seeds = train_seeds(1, t.group_num, config.seed)
            batches, step_tokens = {}, {}
            for name, agent in configs.items():
                played = asyncio.run(play(agent, step_seeds, MIXED_SHARE, tokenizer,
                                          group_size=t.group_size))
                step_tokens[name] = row_tokens(played)
                batches[name] = to_batch(played, trainer.pad_token_id,
                                         config.rollout.reward_placement,
                                         state_ids=trainer.needs_board_ids)
            timing = time_updates(trainer, batches, t.group_num * t.group_size, args.repeats)
        finally:
            trainer.close()
    ratio = lambda a, b: round(a / b, 3) if b else None  # noqa: E731
    result = {
        "preset": PRESET, "model": config.model.name, "device_name": device_name(config.device),
        "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "episodes_per_policy": args.episodes, "tokens": tokens,
        "token_ratio": {policy: ratio(tokens["state"][policy]["tokens_per_episode"],
                                      tokens["history"][policy]["tokens_per_episode"])
                        for policy in POLICIES},
        "step": {"episodes": t.group_num * t.group_size,
                 "groups": f"{t.group_num} x {t.group_size}", "random_share": MIXED_SHARE,
                 "micro_batch_size": config.actor.micro_batch_size,
                 "shared_prefix_tokens": config.actor.shared_prefix_tokens,
                 "repeats": args.repeats, "tokens": step_tokens, "timing": timing},
        "step_token_ratio": ratio(step_tokens["state"]["tokens_per_episode"],
                                  step_tokens["history"]["tokens_per_episode"]),
        "step_time_ratio": ratio(timing["state"]["seconds_per_episode"],
                                 timing["history"]["seconds_per_episode"]),
        "step_cpu_time_ratio": ratio(timing["state"]["cpu_seconds_per_episode"],
                                     timing["history"]["cpu_seconds_per_episode"]),
    }
    show(result)
    write_result(args.out, result)
    return result


def show(result: dict) -> None:
    console = Console()
    table = Table(title=f"{result['preset']} rows, {result['model']}: history (as before) "
                        "vs state (each turn its own chat)")
    for column in ("policy", "layout", "rows/ep", "prompt/row", "tokens/row", "tokens/ep",
                   "success", "state/history"):
        table.add_column(column, justify="right")
    for policy, share in result["token_ratio"].items():
        for name in ("history", "state"):
            row = result["tokens"][name][policy]
            table.add_row(policy, name, str(row["rows_per_episode"]),
                          str(row["prompt_tokens_per_row"]), str(row["tokens_per_row"]),
                          str(row["tokens_per_episode"]), str(row["success"]),
                          str(share) if name == "state" else "")
    console.print(table)
    step = result["step"]
    table = Table(title=f"one PPO update, {step['groups']} episodes (random share "
                        f"{step['random_share']}), median of {step['repeats']}; load average "
                        f"{result['load_average_before']} -> {result['load_average_after']} "
                        f"on {result['cpu_count']} CPUs")
    for column in ("layout", "tokens/ep", "s/ep", "CPU s/ep"):
        table.add_column(column, justify="right")
    for name in ("history", "state"):
        timing = step["timing"][name]
        table.add_row(name, str(step["tokens"][name]["tokens_per_episode"]),
                      str(timing["seconds_per_episode"]), str(timing["cpu_seconds_per_episode"]))
    table.add_row("state/history", str(result["step_token_ratio"]),
                  str(result["step_time_ratio"]), str(result["step_cpu_time_ratio"]))
    console.print(table)


if __name__ == "__main__":
    main()
