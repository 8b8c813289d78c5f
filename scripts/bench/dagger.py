"""Does the warm start learn from the oracle's moves on the boards it reaches itself?

    python scripts/bench/dagger.py --model docs/results/learn_levers_runs/sft/seed_0/checkpoints/step_000024
    python scripts/bench/dagger.py --model CKPT --seed 1 --minutes 30 --rows corrections --out dagger.json
    python scripts/bench/dagger.py --model CKPT --labels oracle --max-steps 30     # the control
    python scripts/bench/dagger.py --model CKPT --labels both --max-steps 30       # both at once
    python scripts/bench/dagger.py --model CKPT --label-stats --games 64   # what the labels teach

The best per-move credit there is, in PPO's own budget: each step the warm-started policy plays
``--games`` new training games (sampled, as PPO's rollout, through
:class:`agentrl.trainers.local.LocalTrainer`), and every board it reached is labelled with the
game oracle's reply (DAgger, Ross et al. 2011). An SFT update then learns those replies in the
contexts the policy saw (one row per turn; ``--rows corrections`` keeps only the boards where
the policy's move did not close the oracle's distance by one, the moves a perfect critic would
debit; ``--rows on_path`` leaves out the boards a missed move led to, whose labels mostly move
the block just moved again: see ``--label-stats``). No reward model, critic or group credits a
move better than the oracle does.
``--labels oracle`` is the control: the oracle plays each step's games itself and the update
learns its episodes with all their context windows, as the warm start does (more of the warm
start, on new games), so the two tell learning in the policy's own contexts from more data.
``--labels both`` learns the two sets of rows in one update: DAgger as Ross et al. train it, on
the policy's labelled boards together with the expert's own play, not on the former alone.

A ``--model`` that is a training run or checkpoint (its ``config.yaml``) plays as the run did:
its decoding (constrained or free, reply limits, context budget, temperature), its agent
presets as it had them (history windows, prompts) and its first validation preset for
``--preset``, each unless ``--preset`` or a ``key=value`` override says otherwise
(:data:`RUN_KEYS`); the console's ``decoding:`` line and the JSON's ``decoding`` say how.

The policy is judged as the learning benchmark judges it (scripts/bench/learn.py): greedy,
constrained play of the same ``--val-groups`` held-out games (never training instances), before
the first step, every ``--val-every`` steps and at the end. Training stops at the first step
that ends past ``--minutes`` of training (validation not counted). The update is the warm
start's (:func:`agentrl.trainers.imitation.sft_update`: mean NLL over reply tokens, ``sft.lr``,
grad clip) with the warm start's AdamW moments carried over (``actor.warm_optimizer``), so its
step size is the one that taught the warm start. Extra ``key=value`` arguments are config
overrides (``threads=1``, ``sft.lr=3e-5``;
``actor.warm_optimizer=false`` for a model saved without its moments).

Prints a table (step, minutes, rows, training success, held-out success with its 95% Wilson
interval) and writes it as JSON to ``--out``.

``--label-stats`` trains nothing: the policy plays ``--games`` training games once, and every
turn after the first is counted by whether the policy's previous move closed the oracle's
distance by one (BlocksWorld; :func:`label_relations`): how often the oracle's label on the
board it left moves the block that move moved, and how often it puts it back. A shortest plan
never moves one block twice in a row (the two moves make one), so after an optimal move the
count is 0, as in the oracle's own episodes; after a missed move the label is mostly the
correction of that block. The context shows the previous move (its reply and the feedback that
echoes it), so DAgger's rows teach "move the block you just moved" where the demonstrations
teach the opposite, and a policy that cannot tell its good moves from its bad ones learns both.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from agentrl.agents import Agent
from agentrl.agents.parsing import parse_response
from agentrl.cli.bench import write_result
from agentrl.cli.eval import model_path
from agentrl.config import build_config, compose_config
from agentrl.envs.blocksworld import parse_move
from agentrl.envs.splits import train_seeds
from agentrl.evaluation.decoding import run_decoding
from agentrl.evaluation.stats import wilson_interval
from agentrl.rollout import to_batch
from agentrl.rollout.demonstrations import play_demonstrations, scripted_reply_ids
from agentrl.rollout.records import Trajectory
from agentrl.trainers.imitation import sft_update
from agentrl.trainers.local import LocalTrainer

PRESET = "tightBlocksworldTurnsAgent"
RUN_KEYS = ("rollout.constrained_actions", "rollout.max_new_tokens", "val.max_new_tokens",
            "rollout.max_context_tokens", "rollout.temperature", "rollout.top_p",
            "rollout.top_k", "model.chat_template", "agents")
"""What a run's config gives this benchmark (its decoding and agent presets), unless an
override names the key."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the warm start: an agentrl sft checkpoint "
                        "folder saved with its optimizer (sft.save_optimizer)")
    parser.add_argument("--preset", default=None,
                        help=f"agent preset (default: a run's first val.presets, else {PRESET})")
    parser.add_argument("--seed", type=int, default=0, help="training seed: which games (default 0)")
    parser.add_argument("--games", type=int, default=8, help="training games a step (default 8)")
    parser.add_argument("--labels", choices=("policy", "oracle", "both"), default="policy",
                        help="policy: the oracle labels the boards the policy reached (DAgger); "
                             "oracle: the oracle plays the games itself, more of the warm start "
                             "on new games (the control); both: the two sets of rows in one "
                             "update (default policy)")
    parser.add_argument("--rows", choices=("all", "corrections", "on_path"), default="all",
                        help="learn every board the policy reached, only those where its move "
                             "was not optimal (corrections), or all but those a missed move led "
                             "to (on_path) (default all)")
    parser.add_argument("--label-stats", action="store_true",
                        help="train nothing: the policy plays --games games once, and the oracle's "
                             "labels after its optimal and its missed moves are counted "
                             "(BlocksWorld)")
    parser.add_argument("--minutes", type=float, default=30.0,
                        help="training minutes, validation not counted (default 30: PPO's budget)")
    parser.add_argument("--max-steps", type=int, default=1000, help="steps at most (default 1000)")
    parser.add_argument("--val-groups", type=int, default=64, help="held-out games (default 64)")
    parser.add_argument("--val-every", type=int, default=0,
                        help="also validate every K steps (default: at the start and the end)")
    parser.add_argument("--save", type=Path, default=None,
                        help="also save the final policy as a checkpoint under this folder "
                             "(for agentrl eval --model)")
    parser.add_argument("--out", type=Path, default=Path("bench_results/dagger.json"),
                        help="JSON output path (default bench_results/dagger.json)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    args = parser.parse_args(argv)
    for name in ("games", "val_groups", "max_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.minutes <= 0 or args.val_every < 0:
        parser.error("--minutes must be > 0 and --val-every >= 0")
    return args


def build(args: argparse.Namespace) -> Any:
    """The benchmark's config: base.yaml's, a run's decoding and presets (:data:`RUN_KEYS`)
    over it when ``--model`` is a run, then the overrides; ``args.preset`` is filled in."""
    data = compose_config(["actor.warm_optimizer=true", *args.overrides, f"seed={args.seed}",
                           "trainer.logger=[console]", f"val.group_num={args.val_groups}",
                           "val.group_size=1", f"train.group_num={args.games}",
                           "train.group_size=1"]).to_dict()
    run = run_config(args.model)
    given = {override.split("=", 1)[0].lstrip("+~") for override in args.overrides}
    if run is not None:
        for key in RUN_KEYS:
            section, _, name = key.partition(".")
            if key in given or section in given or section not in run:
                continue
            if not name:  # the run's presets, but one an override changes stays base.yaml's
                data[section] = {preset: data[section].get(preset) if any(
                    g.startswith(f"{section}.{preset}.") for g in given) else config
                    for preset, config in run[section].items()}
            elif name in run[section]:
                data[section][name] = run[section][name]
        if "rollout.constrained_actions" not in given:  # as the run resolved it (null: engine's)
            data["rollout"]["constrained_actions"] = run_decoding(run).constrained
        args.preset = args.preset or next(iter(run.get("val", {}).get("presets") or []), None)
    args.preset = args.preset or PRESET
    data["model"]["name"] = model_path(str(args.model))  # a run folder: its checkpoint's model
    data["actor"]["lr"] = data["sft"]["lr"]  # the warm start's step size, in its own optimizer
    for section in ("train", "val", "sft"):
        data[section]["presets"] = [args.preset]
    return build_config(data)


def run_config(model: str) -> dict[str, Any] | None:
    """The resolved config of the run or checkpoint ``model`` names (its ``config.yaml``), or
    None for any other model."""
    from agentrl.cli.run_settings import run_settings

    settings = run_settings(model)
    if settings is None:
        return None
    return yaml.safe_load(settings.config_file.read_text())


def decoding(config: Any, args: argparse.Namespace) -> str:
    """How the rollout and the held-out games decode, and where the settings came from."""
    data = config.to_dict()
    source = f"the run {args.model}" if run_config(args.model) is not None else "base.yaml"
    rollout = data["rollout"]
    held_out = run_decoding(data).describe()
    return (f"rollout sampled at temperature {rollout['temperature']}, replies up to "
            f"{rollout['max_new_tokens']} tokens; held-out {held_out} (from {source} and "
            "the overrides)")


def replayed_turns(trajectory: Trajectory, agent: Agent) -> Iterator[tuple[Any, str, bool]]:
    """The policy's episode replayed on ``agent`` (reset to ``trajectory.seed`` first), turn by
    turn: ``(turn, the oracle's reply on the board the turn saw, whether the turn's move closed
    the oracle's distance by one)``, yielded after the move, so ``agent`` shows the board it
    led to."""
    for turn in trajectory.turns:
        oracle, before = agent.oracle_response(), agent.goal_distance()
        agent.step(turn.text)
        yield turn, oracle, before is not None and agent.goal_distance() == before - 1


def oracle_rows(trajectory: Trajectory, agent: Agent, tokenizer: Any, keep: str,
                max_new_tokens: int) -> list[Trajectory]:
    """One row per turn of ``trajectory``: the context the policy saw, answered by the oracle's
    reply on the board it saw (the game replayed from the seed with the policy's own moves),
    tokenized as a demonstration's. A row's ``group_index`` is its turn's index in the episode.
    ``keep`` (``--rows``): ``all``; ``corrections``, the turns whose move missed the oracle's
    distance; ``on_path``, all but the turns right after such a move."""
    agent.reset(seed=trajectory.seed)
    rows = []
    missed_before = False  # the previous turn's move missed
    for index, (turn, oracle, optimal) in enumerate(replayed_turns(trajectory, agent)):
        context = trajectory.turn_context(index)
        skip = (keep == "corrections" and optimal) or (keep == "on_path" and missed_before)
        missed_before = not optimal
        if skip:
            continue
        ids = scripted_reply_ids(oracle, tokenizer, max_new_tokens)
        reply = dataclasses.replace(turn, prompt_ids=tuple(context), response_ids=tuple(ids),
                                    logprobs=(0.0,) * len(ids), context_start=0,
                                    fresh_context=False, token_masks=None,
                                    text=oracle)
        rows.append(Trajectory(
            preset=trajectory.preset, seed=trajectory.seed, group_index=index,
            prompt_ids=context, response_ids=ids, response_mask=[1] * len(ids),
            response_logprobs=[0.0] * len(ids), turn_end_positions=[len(ids) - 1],
            turn_rewards=[0.0], success=False, episode_return=0.0, num_turns=1, turns=[reply]))
    return rows


def step_rows(trainer: LocalTrainer, agent: Agent, args: argparse.Namespace, seeds: list[int],
              step: int) -> tuple[list[Trajectory], list[Trajectory]]:
    """The rows a step learns on the games ``seeds`` (``--labels``), and the episodes whose
    success it reports: the policy's where it played, else the oracle's."""
    config = trainer.config
    rows: list[Trajectory] = []
    played: list[Trajectory] = []
    if args.labels in ("oracle", "both"):  # demonstrations with all their context windows
        played = trainer.loop.run_until_complete(play_demonstrations(
            trainer.train_presets, trainer.tokenizer, seeds, seed=config.seed,
            max_context_tokens=config.rollout.max_context_tokens,
            max_new_tokens=config.rollout.max_new_tokens))
        rows += played
    if args.labels in ("policy", "both"):
        played = trainer.rollout(trainer.train_presets, seeds, 1, trainer.sampling,
                                 desc=f"step {step} rollout")
        # the agent plays trainer.train_presets: the run's reply limit is folded in already
        rows += [row for t in played for row in
                 oracle_rows(t, agent, trainer.tokenizer, args.rows,
                             agent.config.max_response_tokens)]
    return rows, played


def label_relations(trajectory: Trajectory, agent: Agent) -> Counter:
    """BlocksWorld: each turn after the first of ``trajectory``, keyed by whether the policy's
    previous move closed the oracle's distance by one (``after_optimal``) or not
    (``after_missed``): ``rows``, ``same_block`` (the oracle's label on the board moves the block
    that move moved) and ``undo`` (it puts that block back where it was). The game is replayed
    from the seed with the policy's own replies."""
    if agent.config.game != "BlocksWorld" or agent.config.max_actions_per_turn != 1:
        config = agent.config
        raise ValueError("label relations need a BlocksWorld preset of one move a turn; this "
                         f"one plays {config.game}, {config.max_actions_per_turn} a turn")
    game = agent.env.unwrapped
    counts: Counter = Counter()
    agent.reset(seed=trajectory.seed)
    board = game.state
    previous = None  # (block, where it sat before, the move was optimal)
    for turn, oracle, optimal in replayed_turns(trajectory, agent):
        label = parse_move(oracle_action(oracle, agent.config))
        if previous is not None and label is not None:
            block, came_from, was_optimal = previous
            key = "after_optimal" if was_optimal else "after_missed"
            counts[key, "rows"] += 1
            counts[key, "same_block"] += label[0] == block
            counts[key, "undo"] += label == (block, came_from)
        move = parse_move(oracle_action(turn.text, agent.config))
        previous = None if move is None or agent.done else (move[0], board[move[0] - 1], optimal)
        board = game.state
    return counts


def oracle_action(reply: str, config: Any) -> str:
    """The one action of a well-formed one-move reply ('' for any other reply)."""
    parsed = parse_response(reply, enable_think=config.enable_think,
                            separator=config.action_separator, max_actions=1,
                            answer_format=config.answer_format)
    return parsed.actions[0] if parsed.format_ok and parsed.actions else ""


def label_stats(trainer: LocalTrainer, agent: Agent, args: argparse.Namespace
                ) -> dict[str, Any]:
    """``--label-stats``: the policy plays ``--games`` training games once; the relations of
    the oracle's labels to its previous moves, summed over the games."""
    seeds = train_seeds(1, args.games, trainer.config.seed)
    played = trainer.rollout(trainer.train_presets, seeds, 1, trainer.sampling,
                             desc="policy episodes")
    counts: Counter = Counter()
    for trajectory in played:
        counts.update(label_relations(trajectory, agent))
    table = {after: {name: counts[after, name] for name in ("rows", "same_block", "undo")}
             for after in ("after_optimal", "after_missed")}
    print("\n| the policy's previous move | rows | label moves the block it moved | "
          "label puts it back |")
    print("|---|---|---|---|")
    for after, row in table.items():
        print(f"| {after.removeprefix('after_')} | {row['rows']} | {row['same_block']} | "
              f"{row['undo']} |")
    return {"model": str(args.model), "preset": args.preset, "seed": args.seed,
            "games": len(played), "wins": sum(t.success for t in played),
            "sampling": "the rollout's (PPO's)", "labels": table}


def held_out(trainer: LocalTrainer, preset: str, games: int) -> dict[str, Any]:
    metrics = trainer.validate()
    success = metrics[f"val/{preset}/success"]
    low, high = wilson_interval(success * games, games)
    return {"success": success, "wins": round(success * games), "games": games,
            "success_ci95": [low, high]}


def validation(trainer: LocalTrainer, args: argparse.Namespace, step: int, train_s: float
               ) -> dict[str, Any]:
    point = {"step": step, "minutes": train_s / 60,
             **held_out(trainer, args.preset, args.val_groups)}
    print(f"step {step}: held-out {point['wins']}/{point['games']}", flush=True)
    return point


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    config = build(args)
    stated = decoding(config, args)
    print(f"decoding: {stated}", flush=True)
    trainer = LocalTrainer(config)
    agent = Agent(dict(trainer.train_presets)[args.preset])
    if args.label_stats:
        try:
            result = {**label_stats(trainer, agent, args), "decoding": stated}
        finally:
            agent.close()
            trainer.close()
        write_result(args.out, result)
        return result
    params = [p for p in trainer.actor.parameters() if p.requires_grad]
    curve = [validation(trainer, args, 0, 0.0)]
    train_s, step, rows_seen, episodes = 0.0, 0, 0, 0
    steps = []
    try:
        while train_s < args.minutes * 60 and step < args.max_steps:
            step += 1
            start = time.perf_counter()
            seeds = train_seeds(step, args.games, config.seed)
            rows, trajectories = step_rows(trainer, agent, args, seeds, step)
            loss, learned = float("nan"), 0
            if rows:
                batch = to_batch(rows, trainer.pad_token_id)
                learned = len(batch["episode_index"])  # rows: one per context window
                every_row = (batch["episode_index"] >= 0).nonzero().flatten()
                loss, _ = sft_update(trainer.actor, params, trainer.actor_optim, batch, every_row,
                                     config)
            train_s += time.perf_counter() - start
            rows_seen += learned
            episodes += len(trajectories)
            # the policy's own success on its training games (the oracle's with --labels oracle)
            won = sum(t.success for t in trajectories) / len(trajectories)
            steps.append({"step": step, "minutes": train_s / 60, "rows": learned, "loss": loss,
                          "train_success": won})
            print(f"step {step} | {train_s / 60:.1f} min | rows {learned} | loss {loss:.3f} | "
                  f"training success {won:.2f}", flush=True)
            if args.val_every and step % args.val_every == 0:
                curve.append(validation(trainer, args, step, train_s))
        if curve[-1]["step"] != step:
            curve.append(validation(trainer, args, step, train_s))
        if args.save is not None:
            trainer.step = step
            print(f"saved {trainer.save(args.save)}")
    finally:
        agent.close()
        trainer.close()
    print("\n| step | training minutes | held-out success (95% interval) |")
    print("|---|---|---|")
    for point in curve:
        low, high = point["success_ci95"]
        print(f"| {point['step']} | {point['minutes']:.1f} | {point['success']:.1%} "
              f"({point['wins']}/{point['games']}, {low:.1%}-{high:.1%}) |")
    result = {"model": str(args.model), "preset": args.preset, "seed": args.seed,
              "games_per_step": args.games, "labels": args.labels, "rows": args.rows,
              "lr": config.actor.lr, "decoding": stated,
              "overrides": args.overrides, "episodes": episodes, "rows_learned": rows_seen,
              "train_minutes": train_s / 60, "held_out": curve, "steps": steps}
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
