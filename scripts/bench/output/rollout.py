"""The rollout benchmark's output (scripts/bench/rollout.py): its tables and verdicts.

Why apart: the benchmark times schedulers and the engine and writes a result; these print that
result (the targets too come from it), so they change without touching what is measured. Loaded
by path (:func:`agentrl.cli.bench.script_module`).
"""

from __future__ import annotations

from collections.abc import Iterable

from rich.console import Console
from rich.table import Table

import agentrl


def print_table(result: dict) -> None:
    """The scheduler comparison: both modes, then the targets' verdicts."""
    args = result["args"]
    table = Table(title=f"agentrl {agentrl.__version__} rollout: {result['ours']['episodes']} "
                        f"episodes, simulated model {args['base_ms']} ms + "
                        f"{args['ms_per_token']} ms/token")
    columns = ("mode", "episodes", "turns", "reply tokens", "wall s", "model s", "start s",
               "episodes/s", "overhead", "CPU/wall")
    for column in columns:
        table.add_column(column, justify="left" if column == "mode" else "right")
    for mode in ("ours", "barrier"):
        row = result[mode]
        table.add_row(mode, str(row["episodes"]), str(row["turns"]), str(row["reply_tokens"]),
                      f"{row['wall_s']:.2f}", f"{row['model_critical_path_s']:.2f}",
                      f"{row['startup_s']:.2f}",
                      f"{row['episodes_per_s']:.1f}", f"{100 * row['overhead_share']:.1f}%",
                      f"{row['cpu_over_wall']:.2f}")
    console = Console(width=120)
    console.print(table)
    speedup, overhead = result["speedup"], result["ours"]["overhead_share"]
    targets = result["targets"]
    target_speedup, target_overhead = targets["speedup"], targets["overhead_share"]
    ideal = "-" if result["ideal_speedup"] is None else f"{result['ideal_speedup']:.2f}x"
    print(f"(a) speed-up {speedup:.2f}x (ideal {ideal}; target >= {target_speedup}x: "
          f"{_verdict(speedup >= target_speedup)}); same episodes in both modes: "
          f"{result['same_episodes']}")
    print(f"(b) overhead of ours {100 * overhead:.1f}% of wall time (target <= "
          f"{100 * target_overhead:.0f}%: {_verdict(overhead <= target_overhead)})")
    tokens, turns = result["reply_tokens"], result["episode_turns"]
    print(f"reply tokens min/p50/p90/max {tokens['min']}/{tokens['p50']}/{tokens['p90']}/"
          f"{tokens['max']}; turns per episode min/mean/max {turns['min']}/{turns['mean']}/"
          f"{turns['max']}")
    if result.get("embedded"):
        rows = result["embedded"]
        base = rows[0]["tokens_per_second"]
        print("(c) embedded model: " + "; ".join(
            f"batch {r['batch_size']}: {r['tokens_per_second']:.1f} tok/s "
            f"({r['tokens_per_second'] / base:.2f}x)" for r in rows))


def _verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def print_jump_forward(result: dict, modes: Iterable[str]) -> None:
    """Step-by-step vs jump-forward decoding, one row per mode, then the targets' verdicts."""
    args = result["args"]
    table = Table(title=f"agentrl {agentrl.__version__} jump-forward: {args['jf_preset']}, "
                        f"{args['jf_model']} model, constrained, temperature "
                        f"{args['temperature']}")
    columns = ("mode", "episodes", "turns", "tokens", "decode steps", "steps/episode",
               "jumped tokens", "rollout s", "s/episode", "prefill s", "success")
    for column in columns:
        table.add_column(column, justify="left" if column == "mode" else "right")
    for mode in modes:
        row = result[mode]
        table.add_row(mode, str(row["episodes"]), str(row["turns"]),
                      str(row["generated_tokens"]), str(row["decode_steps"]),
                      f"{row['decode_steps_per_episode']:.1f}", str(row["jumped_tokens"]),
                      f"{row['rollout_s']:.1f}", f"{row['rollout_s_per_episode']:.2f}",
                      f"{row['prefill_s']:.1f}", f"{row['success']:.2f}")
    Console(width=140).print(table)
    steps, time_ = result["fewer_decode_steps"], result["less_rollout_time"]
    targets = result["targets"]
    target_steps, target_time = targets["fewer_decode_steps"], targets["less_rollout_time"]
    print(f"decode steps per episode -{100 * steps:.1f}% (target >= "
          f"{100 * target_steps:.0f}%: {_verdict(steps >= target_steps)}); rollout "
          f"seconds per episode -{100 * time_:.1f}% (target >= {100 * target_time:.0f}%: "
          f"{_verdict(time_ >= target_time)}); with the masked head too -"
          f"{100 * result['less_rollout_time_masked_head']:.1f}%; load average "
          f"{result['load_average_1m']} on {result['cpus']} CPUs")
