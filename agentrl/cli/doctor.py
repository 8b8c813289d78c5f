"""`agentrl doctor [key=value ...]`: a first-run check of the verl backend on this node, before a
long job: a table of PASS, FAIL and SKIP rows, exit 0 when nothing failed.

    agentrl doctor hardware=a100 model=qwen_3b        # a GPU node: <= 10 minutes
    agentrl doctor hardware=cpu-verl model=tiny_vllm  # the rows a CPU can run (~5 min, 2 cores)
    agentrl doctor --check runs/doctor                # the table again from a doctor's folder
    agentrl doctor hardware=cpu-verl model=tiny_vllm --stages legacy  # one stage (~3 min)
    bash examples/check_gpu.sh qwen_7b                # the same with this node's preset and GPUs

It runs verl's own trainer three times, briefly, with the overrides given (the hardware and
model of the job to come), each a child ``agentrl train`` in a session of its own, into
``--out`` (default ``runs/doctor``): ``legacy`` (the legacy trainer, 3 steps of a Sokoban
preset whose episodes the response budget cuts after the first reply), ``constrained`` (the
same, 2 steps, with ``rollout.constrained_actions=true``) and ``v1`` (``verl.trainer=v1``, 2
steps of a windowed preset: a row per turn). The rows:

- **legacy steps**: every step logged, ``training/rollout_probs_diff_max`` and ``_mean`` (vLLM's
  probabilities against the actor's recompute of the same tokens) within ``PROBS_DIFF_MAX`` and
  ``PROBS_DIFF_MEAN``: the weights, the chat template and the masks agree between sampler and
  trainer.
- **peak memory**: verl's own per-phase peaks (the training process's allocator after the
  critic's and after the actor's update) and, on a GPU, the whole card's (``nvidia-smi``, vLLM
  included) against the preflight's estimate of the same run (:mod:`agentrl.verl.preflight`):
  FAIL where a phase used more than estimated (the estimate is what the preflight fits the
  job's micro-batches to).
- **constrained**: ``constraint_violations`` 0 in every step's records and the probabilities'
  gap no larger than unconstrained (:func:`~agentrl.verl.doctor_rows.constrained_row`).
- **use_remove_padding**: the first constrained batch (saved by the trainer's probe,
  :data:`agentrl.verl.returns.PROBE_ENV`) through verl's engine with the masks, packed (on)
  and padded (off): the masked probabilities must agree (``LAYOUT_PROBS_DIFF`` of
  :mod:`agentrl.verl.doctor_rows`; the check: :mod:`agentrl.verl.layout_check`). Packing needs
  flash-attn's varlen attention, so a GPU.
- **cut episodes**: over the legacy run's steps, at the last model token of each episode the
  budget cut, the critic's value, the reward and the GAE return; the return must be the reward
  (a cut episode ends where it is cut, nothing bootstrapped: :mod:`agentrl.verl.returns`).
- **v1 windows**: the V1 trainer ran 2 steps, more rows than episodes (one per turn), its
  probabilities' gap within the limits.

On a CPU (``hardware=cpu-verl``, vLLM's CPU build from ``bash env_setup.sh --verl-cpu``) the
rows that need a GPU say so: SKIP with the reason. The rows are :mod:`agentrl.verl.doctor_rows`;
tests/verl/test_cpu_trainer.py checks its runs with them, tests/verl/test_doctor.py that each
row fails when its check does.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.verl.doctor_rows import (
    FAIL,
    Row,
    StageResult,
    constrained_row,
    cut_episodes_row,
    legacy_row,
    logprobs_row,
    memory_row,
    read_json,
    render,
    v1_row,
)

OUT = Path("runs/doctor")
STAGE_NAMES = ("legacy", "constrained", "v1")
"""The doctor's trainings (:func:`stages`), in the order they run; ``--stages`` picks some."""
STAGE_TIMEOUT_S = 900
SOKOBAN = "quickSokobanAgent"
"""Two answer-only turns of up to 48 tokens: with a response budget of 64 the first
observation never fits, so every episode not won on its first reply is cut."""
WINDOWED = "tightBlocksworldTurnsAgent"
"""One move a turn, each turn its own chat (``context: state``): a row per turn on V1."""


@dataclasses.dataclass(frozen=True)
class Stage:
    """One short training of the doctor."""

    name: str
    steps: int
    overrides: tuple[str, ...]
    probe: bool = False
    """The legacy trainer's probe (cut episodes' values, the first batch) into ``probe/``."""



# -- the stages ------------------------------------------------------------------------------------
def group_num(config: Any) -> int:
    """Groups of 4 episodes a step: the fewest whose episodes split over the GPUs and the
    agent-loop workers (verl asserts both)."""
    v = config.verl
    return math.lcm(v.nnodes * v.n_gpus_per_node, v.agent_workers, 4) // 4


def stages(config: Any, out: Path) -> list[Stage]:
    """The doctor's three trainings for ``config`` (the user's composed config)."""
    from agentrl.verl.overrides import hydra_value, worker_env_key
    from agentrl.verl.returns import PROBE_ENV

    groups = group_num(config)
    common = ("val.test_freq=0", "val.before_train=false", "trainer.logger=[console]",
              "trainer.plot=false", "trainer.log_episodes=0", f"train.group_num={groups}",
              "train.group_size=4", "actor.ppo_mini_batch_size=null", "resume=never")
    extra = [*config.verl.overrides, "trainer.save_freq=-1"]  # no checkpoint: minutes saved

    def verl_overrides(probe: Path | None) -> str:
        given = [*extra, *([f"{worker_env_key(PROBE_ENV)}={hydra_value(str(probe))}"]
                           if probe else [])]
        return "verl.overrides=[" + ",".join(f"'{item}'" for item in given) + "]"

    sokoban = (f"train.presets=[{SOKOBAN}]", f"val.presets=[{SOKOBAN}]",
               "verl.max_response_length=64", "rollout.max_new_tokens=48")
    made = []
    for name, steps, more in (
            ("legacy", 3, (*sokoban, "verl.trainer=legacy", "rollout.constrained_actions=false")),
            ("constrained", 2, (*sokoban, "verl.trainer=legacy",
                                "rollout.constrained_actions=true")),
            ("v1", 2, ("verl.trainer=v1", f"train.presets=[{WINDOWED}]",
                       f"val.presets=[{WINDOWED}]", f"agents.{WINDOWED}.max_turns=3",
                       "verl.max_prompt_length=1024", "verl.max_response_length=256",
                       "rollout.max_new_tokens=64",
                       "algorithm.lam=1.0", "rollout.constrained_actions=true"))):
        probe = out / name / "probe" if name != "v1" else None
        made.append(Stage(name, steps, (*common, *more, f"run_dir={out / name}",
                                        f"train.total_steps={steps}", verl_overrides(probe)),
                          probe=probe is not None))
    return made


def episodes_per_step(config: Any) -> int:
    return group_num(config) * 4


class GpuPeak:
    """The largest ``memory.used`` of any of this node's GPUs (``nvidia-smi``, once a second)
    while it runs, in GB; None without nvidia-smi."""

    def __init__(self) -> None:
        self.peak_mib: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> GpuPeak:
        if shutil.which("nvidia-smi"):
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _poll(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError, ValueError, subprocess.SubprocessError):
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used",
                                      "--format=csv,noheader,nounits"], capture_output=True,
                                     text=True, timeout=10, check=False).stdout
                used = max(float(x) for x in out.split())
                self.peak_mib = max(self.peak_mib or 0.0, used)
            self._stop.wait(1.0)

    @property
    def gb(self) -> float | None:
        return None if self.peak_mib is None else self.peak_mib * 1024 ** 2 / 1e9


def run_stage(stage: Stage, user_overrides: Sequence[str], out: Path, python: str) -> None:
    """``agentrl train`` for ``stage`` as a child run; its log, run folder and status
    (``<name>.json``: minutes, GPU peak, error) under ``out``."""
    from agentrl.verl import child_run
    from agentrl.verl.returns import PROBE_ENV

    run_dir, log = out / stage.name, out / f"{stage.name}.log"
    shutil.rmtree(run_dir, ignore_errors=True)
    command = [python, "-m", "agentrl.cli", "train", *user_overrides, *stage.overrides]
    env = {PROBE_ENV: str(run_dir / "probe")} if stage.probe else {}
    print(f"doctor: {stage.name}: {stage.steps} steps (log: {log})", flush=True)
    started, error = time.monotonic(), ""
    with GpuPeak() as peak:
        try:
            child_run.finish(child_run.start(command, log, env=env), log, STAGE_TIMEOUT_S)
        except child_run.ChildRunError as failed:
            why = str(failed).splitlines()[0].split("; its last lines:")[0]
            error = f"{why}: {last_error(log.read_text(errors='replace'))}"
    minutes = (time.monotonic() - started) / 60
    status = {"minutes": round(minutes, 2), "gpu_peak_gb": peak.gb, "error": error,
              "command": command}
    (out / f"{stage.name}.json").write_text(json.dumps(status, indent=1))
    print(f"doctor: {stage.name}: {'failed: ' + error if error else 'done'} in "
          f"{minutes:.1f} min", flush=True)


def last_error(output: str) -> str:
    """The last line of ``output`` naming an exception (``ValueError: ...``), else its last
    line: what a failed run died of."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    named = [line for line in lines if re.match(r"^[\w.]*(Error|Exception)\b", line)]
    return (named or lines or ["(no output)"])[-1][:300]


# -- the command -----------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="hydra overrides of configs/base.yaml: the job's hardware and "
                             "model (e.g. hardware=a100 model=qwen_3b)")
    parser.add_argument("--out", type=Path, default=OUT,
                        help=f"folder of the doctor's runs (default {OUT}; replaced)")
    parser.add_argument("--check", type=Path, metavar="DIR",
                        help="print the table from an earlier doctor's folder; runs nothing")
    parser.add_argument("--stages", type=stage_names, default=STAGE_NAMES, metavar="NAMES",
                        help=f"comma-separated stages to run (default {','.join(STAGE_NAMES)});"
                             " the rows of the others say SKIP")


def stage_names(text: str) -> tuple[str, ...]:
    """``--stages``: a comma-separated subset of :data:`STAGE_NAMES`, in their order."""
    asked = {name.strip() for name in text.split(",") if name.strip()}
    if not asked or asked - set(STAGE_NAMES):
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: comma-separated names of "
                                         f"{', '.join(STAGE_NAMES)}")
    return tuple(name for name in STAGE_NAMES if name in asked)


def trainer_python(config: Any) -> tuple[str | None, str]:
    """The interpreter that runs verl here, or None and why not."""
    if config.device != "cpu":
        return sys.executable, ""
    from agentrl.verl.child_run import verl_cpu_python

    python = verl_cpu_python()
    return python, ("" if python else "needs vLLM's CPU build: `bash env_setup.sh --verl-cpu`")


def has_module(python: str, module: str) -> bool:
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True,
                          check=False).returncode == 0


def rows_for(out: Path, overrides: Sequence[str], config: Any,
             logprobs: Mapping[str, Any] | None, logprobs_skipped: str) -> list[Row]:
    """The table's rows from the stages' folders under ``out``."""
    from agentrl.config import compose_config
    from agentrl.verl import preflight

    legacy, constrained, v1 = (StageResult.read(out, name)
                               for name in ("legacy", "constrained", "v1"))
    stage = next(s for s in stages(config, out) if s.name == "legacy")
    legacy_config = compose_config([*overrides, *stage.overrides])
    estimate, why = None, ""
    try:
        fitted, _ = preflight.fit(legacy_config)
        card = preflight.card_memory_gb(fitted)
        estimate = preflight.estimate_memory(fitted, card) if card else None
        if estimate is None:
            why = f"the preflight has no estimate for model.name={config.model.name!r}"
    except ValueError as error:
        why = f"the preflight refuses the run: {error}"
    return [legacy_row(legacy, 3), memory_row(legacy, estimate, config.device, why),
            constrained_row(constrained, 2, legacy), logprobs_row(logprobs, logprobs_skipped),
            cut_episodes_row(legacy, 3), v1_row(v1, 2, episodes_per_step(config))]


def remove_padding_check(out: Path, config: Any, rerun: bool
                         ) -> tuple[dict[str, Any] | None, str]:
    """The use_remove_padding row's comparison (``rerun``: computed again, else as an earlier
    doctor saved it), or None and why it was skipped."""
    from agentrl.verl.launch import model_path
    from agentrl.verl.returns import PROBE_BATCH_FILE

    if config.device == "cpu":
        return None, ("needs a GPU: packed rows (use_remove_padding=true) need flash-attn's "
                      "varlen attention; a CPU run pads them (use_remove_padding=false)")
    if not has_module(sys.executable, "flash_attn"):
        return None, ("flash-attn is not installed: verl runs padded (use_remove_padding=false)"
                      "; install it to train packed")
    batch = out / "constrained" / "probe" / PROBE_BATCH_FILE
    if not batch.exists():
        return None, f"no batch from the constrained run ({batch})"
    result = read_json(out / "logprobs.json")
    if not result or rerun:
        try:  # verl's actor divides by the rollout's temperature
            from agentrl.verl.layout_check import run_remove_padding_check

            result = run_remove_padding_check(batch, model_path(config),
                                              float(config.rollout.temperature) or 1.0)
        except Exception as error:  # noqa: BLE001 -- the row says what failed
            result = {"error": f"{type(error).__name__}: {error}"}
        (out / "logprobs.json").write_text(json.dumps(result, indent=1))
    return result, ""


def run(args: argparse.Namespace) -> int:
    from agentrl.config import compose_config

    out = args.check or args.out
    if args.check:
        saved = read_json(out / "doctor.json")
        if not saved:
            raise ValueError(f"--check {out}: no doctor.json there (not a doctor's folder)")
        overrides = saved["overrides"]
    else:
        overrides = list(args.overrides)
    config = compose_config(overrides)
    if config.backend != "verl":
        raise ValueError(f"backend={config.backend!r}: the doctor checks the verl backend; "
                         "name a verl hardware preset (hardware=a100|h100|l40|cpu-verl)")
    started = time.monotonic()
    if not args.check:
        out.mkdir(parents=True, exist_ok=True)
        (out / "doctor.json").write_text(json.dumps({"overrides": overrides}, indent=1))
        python, why = trainer_python(config)
        for stage in stages(config, out):
            if stage.name not in args.stages:
                reason = f"not asked (--stages {','.join(args.stages)})"
            elif python is None:
                reason = why
            elif stage.name == "v1" and not has_module(python, "transfer_queue"):
                reason = ("verl.trainer=v1 needs TransferQueue (`pip install TransferQueue`, "
                          "as env_setup.sh does)")
            else:
                reason = ""
            if reason:
                (out / f"{stage.name}.log").unlink(missing_ok=True)
                (out / f"{stage.name}.skipped").write_text(reason)
                continue
            (out / f"{stage.name}.skipped").unlink(missing_ok=True)
            run_stage(stage, overrides, out, python)
    logprobs, skipped = remove_padding_check(out, config, rerun=not args.check)
    rows = rows_for(out, overrides, config, logprobs, skipped)
    print(render(rows))
    if not args.check:
        print(f"doctor: {(time.monotonic() - started) / 60:.1f} min; logs and runs in {out}")
    return 1 if any(r.status == FAIL for r in rows) else 0
