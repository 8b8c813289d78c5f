"""Multi-turn episodes on the local engine with and without its prefix cache, same games.

    python scripts/bench/prefix_cache.py                        # embedded model, CPU
    python scripts/bench/prefix_cache.py --model tiny --groups 2 --out /tmp/prefix.json
    python scripts/bench/prefix_cache.py --device cuda --groups 16 --group-size 4

Both runs play the same held-out games (``agentrl.evaluation.evaluate``, greedy) with one
engine each: ``--prefix-cache-tokens`` (on) or 0 (off). Without the cache every turn re-reads
the whole conversation; with it, a turn reads its reply's last token and the new observation.
Identical prompts in a batch (a group's first turn, ``--group-size`` > 1) are read once in both
runs. The table shows prompt tokens sent and tokens the model read, the mean batch, prefill and
decode seconds, wall time and the speed-up (replies much shorter than the conversation gain the
most: the cache removes prefill, not decoding); the runs alternate (off, on, off, on, ...) for
``--repeats`` rounds so machine load hits both alike. Greedy replies are checked to be the same in both runs (float
noise may flip a near-tie; the count of differing episodes is reported).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import agentrl  # noqa: F401  (first: OpenMP's passive waiting is set before torch loads it)
import torch
from rich.console import Console
from rich.table import Table

from agentrl.agents import load_agent_presets
from agentrl.cli.bench import device_name, write_result
from agentrl.engines import BatchingLLM, SamplingParams
from agentrl.evaluation import evaluate
from agentrl.models import load_model


def play(llm: BatchingLLM, presets, args) -> dict:
    """One evaluation; its time, the engine's counters and each episode's replies."""
    llm.clear_prefix_cache()
    llm.reset_stats()
    sampling = SamplingParams(greedy=True, max_new_tokens=args.max_new_tokens)
    start = time.perf_counter()
    result = asyncio.run(evaluate(presets, llm, groups=args.groups, group_size=args.group_size,
                                  tokenizer=llm.tokenizer, sampling=sampling,
                                  max_context_tokens=args.max_context_tokens, progress=False))
    seconds = time.perf_counter() - start
    stats = llm.stats
    return {
        "seconds": seconds,
        "turns": sum(t.num_turns for t in result.trajectories),
        "prompt_tokens": stats.prompt_tokens,
        "prefill_tokens": stats.prefill_tokens,
        "prefill_seconds": stats.prefill_seconds,
        "generated_tokens": stats.generated_tokens,
        "decode_seconds": stats.generation_seconds - stats.prefill_seconds,
        "batches": stats.batches,
        "mean_batch_size": stats.mean_batch_size,
        "replies": [[turn.response_ids for turn in t.turns] for t in result.trajectories],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded", help="a load_model name")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument("--dtype", default=None, help="float32 (default), bfloat16, float16")
    parser.add_argument("--preset", default="simpleSokobanAgent")
    parser.add_argument("--groups", type=int, default=4, help="held-out games")
    parser.add_argument("--group-size", type=int, default=2, help="episodes per game")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="reply limit")
    parser.add_argument("--max-context-tokens", type=int, default=8192)
    parser.add_argument("--prefix-cache-tokens", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=2, help="rounds of (off, on)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--out", default="bench_results/prefix_cache.json")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    model, tokenizer = load_model(args.model, device=args.device, dtype=args.dtype)
    presets = {args.preset: load_agent_presets()[args.preset]}
    engines = {"off": BatchingLLM(model, tokenizer, seed=0, prefix_cache_tokens=0),
               "on": BatchingLLM(model, tokenizer, seed=0,
                                 prefix_cache_tokens=args.prefix_cache_tokens)}
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    for _ in range(args.repeats):
        for mode, llm in engines.items():
            runs[mode].append(play(llm, presets, args))
    for llm in engines.values():
        llm.close()

    rows = {}
    for mode, results in runs.items():
        first = results[0]
        rows[mode] = {
            "seconds_median": round(statistics.median(r["seconds"] for r in results), 2),
            "seconds": [round(r["seconds"], 2) for r in results],
            "prefill_seconds_median": round(statistics.median(
                r["prefill_seconds"] for r in results), 2),
            "decode_seconds_median": round(statistics.median(
                r["decode_seconds"] for r in results), 2),
            "mean_batch_size": round(statistics.mean(r["mean_batch_size"] for r in results), 2),
            **{k: first[k] for k in ("turns", "prompt_tokens", "prefill_tokens",
                                      "generated_tokens")},
        }
    differing = sum(a != b for a, b in zip(runs["off"][0]["replies"], runs["on"][0]["replies"]))
    speedup = rows["off"]["seconds_median"] / rows["on"]["seconds_median"]

    table = Table(title=f"{args.model} on {args.device}: {args.preset}, {args.groups} games x "
                        f"{args.group_size}, replies <= {args.max_new_tokens} tokens")
    for column in ("prefix cache", "turns", "prompt tokens", "read by the model",
                   "mean batch", "prefill s", "decode s", "wall s (median)", "speed-up"):
        table.add_column(column, justify="right")
    for mode, row in rows.items():
        table.add_row(mode, str(row["turns"]), str(row["prompt_tokens"]),
                      str(row["prefill_tokens"]), f"{row['mean_batch_size']:.1f}",
                      f"{row['prefill_seconds_median']:.1f}",
                      f"{row['decode_seconds_median']:.1f}", f"{row['seconds_median']:.1f}",
                      f"{speedup:.2f}x" if mode == "on" else "1.00x")
    Console(width=max(120, Console().width)).print(table)  # whole headers in logs too
    print(f"episodes whose greedy replies differ between the runs: {differing} of "
          f"{len(runs['off'][0]['replies'])}")
    result = {
        "rows": rows, "speedup": round(speedup, 3), "episodes_differing": differing,
        "episodes": len(runs["off"][0]["replies"]), "args": vars(args),
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "device_name": device_name(args.device),
    }
    write_result(args.out, result)


if __name__ == "__main__":
    main()
