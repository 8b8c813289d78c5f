"""`agentrl play GAME`: a person plays a game in the terminal, or watches the oracle or a model
play it.

    agentrl play sokoban --seed 3
    agentrl play tetris --preset 4x4-type2 --oracle
    agentrl play blocksworld --constrained     # only valid actions are taken
    agentrl play sokoban --model runs/agentrl/quick --delay 1     # a model (agentrl/cli/watch.py)

Type an action per line (`help` lists them, `quit` or end of input stops). With
``--constrained`` a line goes to the game only when it is one of the valid actions, checked by
the same answer grammar that constrains a model's decoding (:mod:`agentrl.agents.grammar`);
anything else is refused and asked again, as the engine's mask would refuse it.
"""

from __future__ import annotations

import argparse
import sys
import time

import gymnasium

from agentrl.agents.grammar import AnswerGrammar
from agentrl.cli.arguments import non_negative_float, non_negative_int, positive_int
from agentrl.envs import GAMES, env_id

QUIT = {"quit", "exit", "q"}


def game_name(text: str) -> str:
    """Case-insensitive game lookup: 'sokoban' -> 'Sokoban'."""
    for game in GAMES:
        if game.lower() == text.lower():
            return game
    raise argparse.ArgumentTypeError(f"unknown game {text!r}; allowed: {', '.join(GAMES)}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("game", type=game_name, help=f"one of: {', '.join(GAMES)} (any case)")
    parser.add_argument("--seed", type=non_negative_int, default=0,
                        help="episode seed, an integer >= 0 (default 0)")
    parser.add_argument("--preset", default=None, help="game preset (default: the game's own)")
    parser.add_argument("--oracle", action="store_true", help="watch the oracle solve the game")
    parser.add_argument("--delay", type=non_negative_float, default=0.0,
                        help="seconds between oracle moves or model turns")
    parser.add_argument("--constrained", action=argparse.BooleanOptionalAction, default=None,
                        help="take only valid actions (as constrained decoding does): a person's "
                             "other lines are refused; a model decodes under the answer grammar "
                             "(--no-constrained: free; a run's model decodes as the run "
                             "validated unless this says otherwise)")
    model = parser.add_argument_group("watching a model (--model)")
    model.add_argument("--model", default=None,
                       help="watch this model play: embedded, tiny, an HF folder or hub id, a "
                            "checkpoint or a run folder (as agentrl eval --model)")
    model.add_argument("--checkpoint", default=None, metavar="best|last|step_N",
                       help="which checkpoint of a run folder --model loads (default best: by "
                            "held-out validation)")
    model.add_argument("--agent-preset", default=None,
                       help="agent preset (prompts, limits) the model plays with (default: a "
                            "run's validation preset of the game, else the game's first in "
                            "configs/agents.yaml matching --preset)")
    model.add_argument("--temperature", type=non_negative_float, default=0.0,
                       help="sampling temperature (default 0: greedy)")
    model.add_argument("--max-new-tokens", type=positive_int, default=None,
                       help="cap on one reply's tokens (default: a run's validation limit, "
                            "else the preset's)")
    model.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                       help="where the model runs (default auto)")
    model.add_argument("--pause", action="store_true",
                       help="wait for Enter after each model turn (q or end of input stops)")


def run(args: argparse.Namespace, stdin=None, out=None) -> int:
    stdin = sys.stdin if stdin is None else stdin  # the streams of now, not of import time
    out = sys.stdout if out is None else out
    if args.model is not None:
        from agentrl.cli import watch
        from agentrl.trainers.checkpoint import chosen_model

        args.model = chosen_model(args.model, args.checkpoint)  # a run folder's --checkpoint

        return watch.run(args, stdin, out)
    kwargs = {} if args.preset is None else {"preset": args.preset}
    env = gymnasium.make(env_id(args.game), **kwargs)
    game = env.unwrapped
    obs, info = env.reset(seed=args.seed)
    say = lambda text="": print(text, file=out, flush=True)  # noqa: E731
    say(f"== {args.game} (seed {args.seed}) ==")
    say(game.rules)
    say()
    say(obs)
    plan = iter(game.oracle_plan() or []) if args.oracle else None
    total, done = 0.0, False
    while not done:
        say(f"valid actions: {', '.join(game.valid_actions())}")
        action = _next_action(plan, stdin, out)
        if action is None:
            break
        if action.strip().lower() == "help":
            say(game.rules)
            continue
        if getattr(args, "constrained", False) and not allowed(action, game.valid_actions()):
            say(f"refused: {action.strip()!r} is not a valid action now")
            continue
        obs, reward, terminated, truncated, info = env.step(action)
        total += reward
        done = terminated or truncated
        validity = "valid" if info["action_is_valid"] else "INVALID"
        say(f"> {action}   reward {reward:+.2f} ({validity}), return {total:+.2f}")
        say(obs)
        if args.oracle and args.delay:
            time.sleep(args.delay)
    outcome = "SOLVED" if info["success"] else ("over" if done else "stopped")
    say(f"== {outcome}: success={info['success']} return={total:+.2f} steps={info['num_steps']} ==")
    env.close()
    return 0


def allowed(action: str, valid_actions: list[str]) -> bool:
    """``action`` is a whole reply of the plain one-action grammar of ``valid_actions`` (in
    any letter case: a person types ``up`` for ``Up``)."""
    if not valid_actions:
        return False
    grammar = AnswerGrammar(actions=tuple(a.lower() for a in valid_actions), opening="",
                            closing="")
    return grammar.can_stop(grammar.run(grammar.start(), " ".join(action.lower().split())))


def _next_action(plan, stdin, out) -> str | None:
    """The oracle's next move, or a line typed by the player (None: stop)."""
    if plan is not None:
        return next(plan, None)
    print("action> ", end="", flush=True, file=out)
    line = stdin.readline()
    if not line or line.strip().lower() in QUIT:
        return None
    return line.rstrip("\n")
