"""Size and load time of `agentrl report` on a synthetic long run (no model, no training).

    python scripts/bench/report.py                           # 1,000 steps, 2 presets
    python scripts/bench/report.py --steps 200 --out /tmp/report_bench.json

Writes a run folder in the trainers' formats: metrics.jsonl (train and val metrics of each
preset, losses, timings; validation every --test-freq steps) and episodes/step_N.jsonl
(--log-episodes training and validation episodes per step, --turns turns each, with a Sokoban
board and a reply of about 200 characters per turn). Then builds the page (seconds, file size),
and opens it in headless Chromium (when installed): the page's own load time (navigation start
to drawn page, `data-load-ms`), and the wall time of Chromium opening it and dumping the DOM.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import tempfile
import time
from pathlib import Path

from agentrl.cli.bench import write_result
from agentrl.report import write_report
from agentrl.report.browser import chromium, dump_dom
from agentrl.trainers.episode_log import EpisodeLog

PRESETS = ("simpleSokobanAgent", "largeSokobanAgent")
SUFFIXES = ("success", "return", "format_error", "action_is_valid", "turns", "response_length")


def episode(rng: random.Random, step: int, split: str, preset: str, seed: int, turns: int):
    rows = ["#######"] + ["#" + "".join(rng.choice("__X_O") for _ in range(5)) + "#"
                          for _ in range(5)] + ["#######"]
    reply = ("<think>" + " ".join(rng.choice(["push", "box", "left", "target", "wall", "then"])
                                  for _ in range(28)) + "</think><answer>Up || Left</answer>")
    return {"split": split, "preset": preset, "seed": seed, "success": rng.random() < step / 1500,
            "return": round(rng.uniform(-1, 10), 2), "num_turns": turns, "turns_left_out": 0,
            "turns": [{"observation": "Reward: -0.1\nRoom:\n" + "\n".join(rows),
                       "reply": reply,
                       "actions": [{"action": "Up", "valid": True},
                                   {"action": "Left", "valid": rng.random() < 0.8}],
                       "reward": -0.1, "format_error": False, "cut_by_length": False,
                       "dropped_context": False} for _ in range(turns)]}


def synthetic_run(run_dir: Path, args) -> None:
    rng = random.Random(0)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.json").write_text(json.dumps({"run_id": f"synthetic-{args.steps}-steps"}))
    log = EpisodeLog(run_dir)
    with (run_dir / "metrics.jsonl").open("w") as file:
        for step in range(args.steps + 1):
            record = {"step": step, "time": 1.7e9 + step}
            validate = step % args.test_freq == 0
            splits = (["train"] if step else []) + (["val"] if validate else [])
            for split in splits:
                for preset in PRESETS:
                    for suffix in SUFFIXES:
                        record[f"{split}/{preset}/{suffix}"] = rng.random()
            if step:
                for key in ("actor/pg_loss", "critic/vf_loss", "actor/entropy", "actor/ppo_kl",
                            "actor/grad_norm", "timing/step_s"):
                    record[key] = rng.random()
            file.write(json.dumps(record) + "\n")
            records = [episode(rng, step, split, PRESETS[i % 2], 1_000_000 + i // 2, args.turns)
                       for split in splits for i in range(args.log_episodes)]
            log.write(step, records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--test-freq", type=int, default=5)
    parser.add_argument("--log-episodes", type=int, default=4)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--max-episode-steps", type=int, default=40)
    parser.add_argument("--out", default="bench_results/report.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        run_dir = Path(folder) / "run"
        synthetic_run(run_dir, args)
        episodes_bytes = sum(p.stat().st_size for p in (run_dir / "episodes").iterdir())
        start = time.perf_counter()
        page = write_report(run_dir, play_references=False,
                            max_episode_steps=args.max_episode_steps)
        build_s = time.perf_counter() - start
        result = {"steps": args.steps, "episode_files_bytes": episodes_bytes,
                  "metrics_bytes": (run_dir / "metrics.jsonl").stat().st_size,
                  "page_bytes": page.stat().st_size, "build_s": round(build_s, 3)}
        if chromium():
            start = time.perf_counter()
            dom = dump_dom(page)
            result["chromium_open_and_dump_s"] = round(time.perf_counter() - start, 3)
            found = re.search(r'data-load-ms="(\d+)"', dom)
            result["page_load_ms"] = int(found[1]) if found else None
            result["polylines"] = dom.count("<polyline")
    for key, value in result.items():
        print(f"{key:>26}: {value}")
    write_result(args.out, result)


if __name__ == "__main__":
    main()
