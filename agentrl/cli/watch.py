"""`agentrl play GAME --model MODEL`: watch a model play a game in the terminal, turn by turn.

    agentrl play sokoban --model embedded --seed 3
    agentrl play sokoban --model runs/agentrl/quick --delay 1      # a run's best checkpoint
    agentrl play tetris --model runs/agentrl/quick/checkpoints/step_000020 --pause

The model plays exactly as in training and evaluation: the agent preset's prompts and rules
(``--agent-preset``, default: the game's first preset in configs/agents.yaml, or the one whose
game preset is ``--preset``), through :func:`agentrl.rollout.run_episode` on the local engine,
greedy unless ``--temperature`` is set. A run's (or checkpoint's) model plays as the run
validated (agentrl/cli/run_settings.py): its validation preset of the game as the run had it,
constrained or free, its reply limit and context budget, unless ``--agent-preset``,
``--[no-]constrained`` or ``--max-new-tokens`` say otherwise; a ``decoding:`` line says how
replies are decoded. After each reply it prints the reply, the actions run
(and whether the game accepted each), the reward and the new board, then waits ``--delay``
seconds, or for Enter with ``--pause`` (``q`` or end of input stops). ``--model`` takes what
``agentrl eval --model`` takes (agentrl/models/loading.py resolves it).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from agentrl.agents import Agent, AgentConfig, AgentWrapper, TurnResult, load_agent_presets

__all__ = ["WatchedAgent", "agent_preset_for", "run"]

QUIT = {"q", "quit", "exit"}
DEFAULT_MAX_CONTEXT_TOKENS = 8192


class StopWatching(Exception):
    """The viewer stopped the episode (``q`` or end of input under ``--pause``)."""


def agent_preset_for(game: str, name: str | None, game_preset: str | None,
                     presets: dict[str, AgentConfig] | None = None,
                     preferred: tuple[str, ...] = ()) -> tuple[str, AgentConfig]:
    """The agent preset to play ``game`` with: ``name``, else the first of ``preferred`` (a
    run's validation presets) of the game, else the first preset of the game (whose game preset
    is ``game_preset`` when given), from ``presets`` (default: configs/agents.yaml). A mismatch
    raises ValueError naming the allowed presets."""
    presets = presets if presets is not None else load_agent_presets()
    of_game = {n: c for n, c in presets.items() if c.game == game}
    if name is None:
        name = next((n for n in preferred if n in of_game and (
            game_preset is None or of_game[n].env_kwargs.get("preset") == game_preset)), None)
    if name is not None:
        if name not in of_game:
            raise ValueError(f"--agent-preset {name!r} is not a {game} preset; allowed: "
                             f"{', '.join(of_game)}")
        return name, of_game[name]
    for preset_name, config in of_game.items():
        if game_preset is None or config.env_kwargs.get("preset") == game_preset:
            return preset_name, config
    raise ValueError(f"no agent preset of {game} plays game preset {game_preset!r}; give "
                     f"--agent-preset (allowed: {', '.join(of_game)})")


class WatchedAgent(AgentWrapper):
    """An :class:`Agent` that shows each turn as ``run_episode`` plays it, then waits."""

    def __init__(self, agent: Agent, say, wait):
        super().__init__(agent)
        self.say = say
        self.wait = wait

    def reset(self, seed: int | None = None) -> list[dict]:
        messages = self.agent.reset(seed=seed)
        self.say(self.agent.observation)
        return messages

    def step(self, response_text: Any) -> TurnResult:
        result = self.agent.step(response_text)
        info = result.info
        self.say(f"\n-- turn {info['turn']} --")
        self.say(f"reply: {str(response_text).strip()}")
        if not result.format_ok:
            self.say(f"format error: {info['format_error']}")
        actions = [f"{a} ({'valid' if ok else 'INVALID'})"
                   for a, ok in zip(info["actions"], info["action_valid"])]
        self.say(f"actions: {', '.join(actions) or 'none'}")
        self.say(f"reward {result.reward:+.2f}, return {info['episode_return']:+.2f}")
        self.say(self.agent.observation)
        if not result.done:
            self.wait()
        return result


def run(args: argparse.Namespace, stdin=None, out=None) -> int:
    """Load the model and let it play one episode of ``args.game`` on ``args.seed``."""
    stdin = sys.stdin if stdin is None else stdin  # the streams of now, not of import time
    out = sys.stdout if out is None else out
    from agentrl.cli.arguments import check_device
    from agentrl.cli.eval import load_named_model
    from agentrl.engines import BatchingLLM, SamplingParams
    from agentrl.rollout import run_episode

    from agentrl.cli.run_settings import played_presets, run_settings
    from agentrl.evaluation.decoding import Decoding, history_shown

    settings = run_settings(args.model)  # a run's model plays as the run validated
    name, config = agent_preset_for(
        args.game, args.agent_preset, args.preset,
        settings.agents if settings is not None else None,
        tuple(settings.val_presets) if settings is not None else ())
    run = settings.decoding if settings is not None else None
    limit = args.max_new_tokens or (run.max_new_tokens if run else None)
    if run is not None:
        config = played_presets({name: config}, limit)[name]
    constrained = args.constrained if args.constrained is not None else bool(
        run and run.constrained)
    context = (run and run.max_context_tokens) or DEFAULT_MAX_CONTEXT_TOKENS
    flags = [flag for flag, given in (
        ("--max-new-tokens", args.max_new_tokens is not None),
        ("--constrained" if args.constrained else "--no-constrained", args.constrained is not None),
        ("--temperature", args.temperature > 0)) if given]
    source = run.source if run else "defaults"
    decoding = Decoding(constrained=constrained,
                        max_new_tokens=limit or config.max_response_tokens,
                        temperature=args.temperature, max_context_tokens=context,
                        history_windows={name: history_shown(config)},
                        source=source + (f", with {', '.join(flags)}" if flags else ""))
    check_device(args.device)
    say = lambda text="": print(text, file=out, flush=True)  # noqa: E731

    def wait() -> None:
        if args.pause:
            print("Enter: next turn, q: stop> ", end="", file=out, flush=True)
            line = stdin.readline()
            if not line or line.strip().lower() in QUIT:
                raise StopWatching
        elif args.delay > 0:
            time.sleep(args.delay)

    model, tokenizer = load_named_model(args.model, device=args.device)
    llm = BatchingLLM(model, tokenizer, max_batch=1, seed=args.seed)
    sampling = SamplingParams(greedy=args.temperature == 0, temperature=args.temperature or 1.0,
                              max_new_tokens=decoding.max_new_tokens,
                              constrained_actions=decoding.constrained)
    agent = Agent(config)
    say(f"== {args.game} (seed {args.seed}): {args.model} plays as {name} ==")
    say(f"decoding: {decoding.describe()}")
    stopped = False
    try:
        trajectory = asyncio.run(run_episode(
            WatchedAgent(agent, say, wait), args.seed, llm, tokenizer, sampling,
            max_context_tokens=min(context, llm.max_positions or context),
            preset=name))
    except StopWatching:
        stopped = True
    finally:
        llm.close()
        agent.close()
    if stopped:
        say(f"\n== stopped: success={agent.success} return={agent.episode_return:+.2f} "
            f"turns={agent.turn} ==")
    else:
        outcome = "SOLVED" if trajectory.success else "over"
        say(f"\n== {outcome}: success={trajectory.success} "
            f"return={trajectory.episode_return:+.2f} turns={trajectory.num_turns} ==")
    return 0
