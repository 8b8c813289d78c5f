"""Episode records: what a person reads to see how an episode went, turn by turn.

    from agentrl.rollout.episode_record import episode_record, sample_episodes
    records = [episode_record(t, split="val", step=10) for t in sample_episodes(trajectories, 4)]

One record is a plain JSON object (the same on every engine: the local trainer builds it from
its trajectories, verl's AgentLoop from its own, ``agentrl eval`` from the model's or a scripted
policy's)::

    {"step": 10, "split": "val", "preset": "simpleSokobanAgent", "seed": 1000000,
     "success": false, "return": -0.3, "num_turns": 3, "turns_left_out": 0,
     "turns": [{"observation": "...", "reply": "...", "actions": [{"action": "Up", "valid": true}],
                "reward": -0.1, "format_error": false, "cut_by_length": false,
                "dropped_context": false}, ...]}

``observation`` is the user message the reply answered (turn 1 holds the instructions, then the
board). **Bounded**: a text longer than ``MAX_TEXT_CHARS`` keeps its head and its tail (where the
board is) around a marked cut; an episode keeps its first ``MAX_TURNS // 2`` and last
``MAX_TURNS // 2`` turns (``turns_left_out`` counts the others), so a record stays under about
``2 * MAX_TEXT_CHARS * MAX_TURNS`` characters however long the model rambles.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from agentrl.rollout.records import Trajectory

__all__ = ["MAX_TEXT_CHARS", "MAX_TURNS", "TABLE_COLUMNS", "clip_text", "episode_record",
           "episode_table", "sample_episodes", "sample_line"]

MAX_TEXT_CHARS = 2000
"""Longest observation or reply text kept in a record (longer: head and tail kept)."""
MAX_TURNS = 40
"""Most turns kept in a record (the first and the last halves)."""
SAMPLE_LINE_CHARS = 100
"""Length of the reply excerpt in the console's sample line."""

T = TypeVar("T")
TABLE_COLUMNS = ("step", "split", "preset", "seed", "success", "return", "turn", "observation",
                 "reply", "actions", "reward", "flags")
"""Columns of :func:`episode_table` (WandB's episode table)."""


def clip_text(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """``text``, or its head and tail around a ``[... N characters cut ...]`` mark."""
    if len(text) <= limit:
        return text
    mark = f"\n[... {len(text) - limit} characters cut ...]\n"
    head = limit // 3
    return text[:head] + mark + text[len(text) - (limit - head):]


def episode_record(trajectory: Trajectory, *, split: str, step: int | None = None
                   ) -> dict[str, Any]:
    """The record of one episode (see the module docstring)."""
    turns = list(trajectory.turns)
    left_out = max(0, len(turns) - MAX_TURNS)
    if left_out:
        turns = turns[: MAX_TURNS // 2] + turns[len(turns) - MAX_TURNS // 2:]
    return {
        "step": step, "split": split, "preset": trajectory.preset, "seed": int(trajectory.seed),
        "success": bool(trajectory.success), "return": float(trajectory.episode_return),
        "num_turns": int(trajectory.num_turns), "turns_left_out": left_out,
        "turns": [{
            "observation": clip_text(turn.observation),
            "reply": clip_text(turn.text),
            "actions": [{"action": clip_text(action, 200), "valid": bool(valid)}
                        for action, valid in zip(turn.actions, turn.action_valid)],
            "reward": float(turn.reward),
            "format_error": not turn.format_ok,
            "cut_by_length": bool(turn.truncated_by_length),
            "dropped_context": turn.context_start > 0,
        } for turn in turns],
    }


def sample_episodes(episodes: Iterable[T], count: int,
                    key: Callable[[T], tuple[str, int]] = lambda t: (t.preset, t.seed)
                    ) -> list[T]:
    """At most ``count`` episodes, taken in turn from each preset, a new seed before a repeat
    of one: deterministic, so validation (greedy, the same held-out seeds every time) records
    the same games at every step and they can be compared. ``key`` gives (preset, seed)."""
    by_preset: dict[str, tuple[list[T], list[T]]] = {}
    seen: set[tuple[str, int]] = set()
    for episode in episodes:
        preset, seed = key(episode)
        first, repeats = by_preset.setdefault(preset, ([], []))
        (repeats if (preset, seed) in seen else first).append(episode)
        seen.add((preset, seed))
    queues = [first + repeats for first, repeats in by_preset.values()]
    picked: list[T] = []
    while len(picked) < count and any(queues):
        for queue in queues:
            if queue and len(picked) < count:
                picked.append(queue.pop(0))
    return picked


def sample_line(records: Sequence[Mapping[str, Any]]) -> str | None:
    """One short console line with a sampled reply (the first turn of the first record), so a
    collapse ('!!!!!', empty answers) shows without opening anything; None without records."""
    for record in records:
        for turn in record.get("turns", [])[:1]:
            reply = " ".join(str(turn["reply"]).split())
            if len(reply) > SAMPLE_LINE_CHARS:
                reply = reply[: SAMPLE_LINE_CHARS - 3] + "..."
            flags = [name for name in ("format_error", "cut_by_length") if turn.get(name)]
            return (f"{record['split']} sample {record['preset']} seed {record['seed']}: "
                    f"{reply!r} reward {float(turn['reward']):+.2f}"
                    + (f" ({', '.join(flags)})" if flags else ""))
    return None


def episode_table(records: Sequence[Mapping[str, Any]]) -> tuple[tuple[str, ...], list[list]]:
    """``(TABLE_COLUMNS, rows)``: one row per turn of each record (actions as ``Up, Left!``,
    ``!`` marking one the game refused; flags as words)."""
    rows = []
    for record in records:
        for number, turn in enumerate(record.get("turns", []), 1):
            actions = ", ".join(a["action"] + ("" if a["valid"] else "!") for a in turn["actions"])
            flags = " ".join(name for name in ("format_error", "cut_by_length", "dropped_context")
                             if turn.get(name))
            rows.append([record.get("step"), record["split"], record["preset"], record["seed"],
                         record["success"], record["return"], number, turn["observation"],
                         turn["reply"], actions, turn["reward"], flags])
    return TABLE_COLUMNS, rows
