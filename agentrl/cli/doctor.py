"""`agentrl doctor [key=value ...]`: a first-run check of the verl backend on this node, before a
long job: a table of PASS, FAIL and SKIP rows, exit 0 when nothing failed.

    agentrl doctor hardware=a100 model=qwen_3b        # a GPU node: <= 10 minutes
    agentrl doctor hardware=cpu-verl model=tiny_vllm  # the rows a CPU can run (~6 min, 2 cores)
    agentrl doctor --check runs/doctor                # the table again from a doctor's folder
    bash examples/check_gpu.sh qwen_7b                # the same with this node's preset and GPUs

It runs verl's own trainer three times, briefly, with the overrides given (the hardware and
model of the job to come), each a child ``agentrl train`` in a session of its own, into
``--out`` (default ``runs/doctor``): ``legacy`` (the legacy trainer, 3 steps of a Sokoban
preset whose episodes the response budget cuts after the first reply), ``constrained`` (the
same, 2 steps, with ``rollout.constrained_actions=true``) and ``v1`` (``verl.trainer=v1``, 2
steps of a windowed preset: a row per turn). The rows:

- **legacy steps**: every step logged, ``training/rollout_probs_diff_max`` and ``_mean`` (vLLM's
  probabilities against the actor's recompute of the same tokens) within
  :data:`PROBS_DIFF_MAX` and :data:`PROBS_DIFF_MEAN`: the weights, the chat template and the
  masks agree between sampler and trainer.
- **peak memory**: verl's own per-phase peaks (the training process's allocator after the
  critic's and after the actor's update) and, on a GPU, the whole card's (``nvidia-smi``, vLLM
  included) against the preflight's estimate of the same run (:mod:`agentrl.verl.preflight`):
  FAIL where a phase used more than estimated (the estimate is what the preflight fits the
  job's micro-batches to).
- **constrained**: ``constraint_violations`` 0 in every step's records and the probabilities'
  gap no larger than unconstrained (:func:`constrained_row`).
- **use_remove_padding**: the first constrained batch (saved by the trainer's probe,
  :data:`agentrl.verl.returns.PROBE_ENV`) through verl's engine with the masks, packed (on)
  and padded (off): the masked probabilities must agree (:data:`LAYOUT_PROBS_DIFF`). Packing needs
  flash-attn's varlen attention, so a GPU.
- **cut episodes**: over the legacy run's steps, at the last model token of each episode the
  budget cut, the critic's value, the reward and the GAE return; the return must be the reward
  (a cut episode ends where it is cut, nothing bootstrapped: :mod:`agentrl.verl.returns`).
- **v1 windows**: the V1 trainer ran 2 steps, more rows than episodes (one per turn), its
  probabilities' gap within the limits.

On a CPU (``hardware=cpu-verl``, vLLM's CPU build from ``bash env_setup.sh --verl-cpu``) the
rows that need a GPU say so: SKIP with the reason. tests/verl/test_cpu_trainer.py checks its
runs with these rows; tests/verl/test_doctor.py that each row fails when its check does.
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

OUT = Path("runs/doctor")
STAGE_TIMEOUT_S = 900
PROBS_DIFF_MAX = 0.5
"""Largest allowed ``training/rollout_probs_diff_max`` of a step: bf16 sampler and trainer
differ by up to ~0.1-0.3 on a few tokens; a sampler on other weights, another template or
other masks differs by most of a probability."""
PROBS_DIFF_MEAN = 0.01
"""Largest allowed ``training/rollout_probs_diff_mean`` of a step (healthy runs: ~1e-3 and less)."""
CONSTRAINED_SLACK = 0.005
"""The constrained run's mean gap may exceed the unconstrained one's by this (or be 2x it)."""
LAYOUT_PROBS_DIFF = 0.05
"""Largest |packed - padded| masked probability of one token. bf16 kernels move a token's
probability by ~1e-3 (a few 1e-2 at most); a mask on the wrong row of one layout moves it by
most of a probability."""
CUT_TOLERANCE = 1e-4
"""Largest |return - reward| at a cut episode's last model token."""
GIB_TO_GB = 1024 ** 3 / 1e9
PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"

SOKOBAN = "quickSokobanAgent"
"""Two answer-only turns of up to 48 tokens: with a response budget of 64 the first
observation never fits, so every episode not won on its first reply is cut."""
WINDOWED = "tightBlocksworldTurnsAgent"
"""One move a turn, each turn its own chat (``context: state``): a row per turn on V1."""


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    status: str
    detail: str


@dataclasses.dataclass(frozen=True)
class Stage:
    """One short training of the doctor."""

    name: str
    steps: int
    overrides: tuple[str, ...]
    probe: bool = False
    """The legacy trainer's probe (cut episodes' values, the first batch) into ``probe/``."""


@dataclasses.dataclass
class StageResult:
    """What a stage left: its console's steps, its metrics file's records, its probe."""

    name: str
    ran: bool
    error: str = ""
    steps: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)
    records: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    cut: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    log: str = ""
    gpu_peak_gb: float | None = None
    minutes: float | None = None

    @classmethod
    def read(cls, folder: Path, name: str) -> StageResult:
        """The result of stage ``name`` from ``folder`` (``<name>.log``, ``<name>/``)."""
        from agentrl.verl.child_run import console_steps
        from agentrl.verl.returns import CUT_EPISODES_FILE

        log_path, run_dir = folder / f"{name}.log", folder / name
        skipped = folder / f"{name}.skipped"
        if skipped.exists():
            return cls(name, ran=False, error=skipped.read_text())
        if not log_path.exists():
            return cls(name, ran=False, error=f"not run (no {log_path})")
        log = log_path.read_text(errors="replace")
        status = _read_json(folder / f"{name}.json")
        return cls(name, ran=True, error=status.get("error", ""), steps=console_steps(log),
                   records=_jsonl(run_dir / "metrics.jsonl"),
                   cut=_jsonl(run_dir / "probe" / CUT_EPISODES_FILE), log=log,
                   gpu_peak_gb=status.get("gpu_peak_gb"), minutes=status.get("minutes"))


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def _jsonl(path: Path) -> list[dict[str, Any]]:
    records = []
    if path.exists():
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                records.append(json.loads(line))
    return records


# -- the rows --------------------------------------------------------------------------------------
def _not_run(name: str, result: StageResult) -> Row | None:
    if not result.ran:
        return Row(name, SKIP, result.error)
    if result.error:
        return Row(name, FAIL, result.error)
    return None


def _probs_gaps(steps: Mapping[int, Mapping[str, float]]) -> tuple[float, float]:
    """The largest ``rollout_probs_diff_max`` and ``_mean`` over the steps (NaN: not logged)."""
    gaps = [(s.get("training/rollout_probs_diff_max", math.nan),
             s.get("training/rollout_probs_diff_mean", math.nan)) for s in steps.values()]
    return (max((g[0] for g in gaps), default=math.nan),
            max((g[1] for g in gaps), default=math.nan))


def _probs_problem(steps: Mapping[int, Mapping[str, float]], expected: int) -> str:
    """Why the steps fail the probabilities' check ('' when they pass)."""
    if sorted(steps) != list(range(1, expected + 1)):
        return f"steps logged {sorted(steps)}, expected 1..{expected}"
    top, mean = _probs_gaps(steps)
    if math.isnan(top) or math.isnan(mean):
        return "training/rollout_probs_diff_* not logged (no rollout log-probs)"
    if top > PROBS_DIFF_MAX or mean > PROBS_DIFF_MEAN:
        return (f"rollout_probs_diff_max {top:.3g} (limit {PROBS_DIFF_MAX}), mean {mean:.3g} "
                f"(limit {PROBS_DIFF_MEAN}): vLLM sampled from another distribution than the "
                "actor recomputes")
    return ""


def legacy_row(result: StageResult, expected: int) -> Row:
    name = f"legacy trainer, {expected} steps"
    if (row := _not_run(name, result)) is not None:
        return row
    problem = _probs_problem(result.steps, expected)
    top, mean = _probs_gaps(result.steps)
    return Row(name, FAIL if problem else PASS, problem or
               f"rollout_probs_diff_max {top:.3g}, mean {mean:.3g} over {expected} steps")


def constrained_row(result: StageResult, expected: int, reference: StageResult | None) -> Row:
    """Every step's records say 0 violations, and the probabilities' gap is the unconstrained
    run's (``reference``; without one, the limits alone)."""
    name = "constrained actions"
    if (row := _not_run(name, result)) is not None:
        return row
    problem = _probs_problem(result.steps, expected)
    counts = [v for r in result.records for k, v in r.items()
              if k.startswith("train/") and k.endswith("/constraint_violations")]
    steps = sorted({r["step"] for r in result.records
                    if any(k.endswith("/constraint_violations") for k in r)})
    violations = sum(counts)
    if not problem and steps != list(range(1, expected + 1)):
        problem = f"constraint_violations recorded for steps {steps}, expected 1..{expected}"
    if not problem and violations:
        problem = (f"{violations:g} replies left their masks: vLLM's logits processor was not "
                   "applied to them")
    top, mean = _probs_gaps(result.steps)
    compared = "no unconstrained run to compare"
    if reference is not None and reference.ran and reference.steps:
        ref_top, ref_mean = _probs_gaps(reference.steps)
        allowed = max(2 * ref_mean, ref_mean + CONSTRAINED_SLACK)
        compared = f"unconstrained mean {ref_mean:.3g}"
        if not problem and not mean <= allowed:
            problem = (f"rollout_probs_diff_mean {mean:.3g} against {ref_mean:.3g} "
                       f"unconstrained (allowed {allowed:.3g}): the trainer's masks are not the "
                       "sampler's")
    return Row(name, FAIL if problem else PASS, problem or
               f"constraint_violations 0 in {expected} steps; rollout_probs_diff_max "
               f"{top:.3g}, mean {mean:.3g} ({compared})")


def memory_row(result: StageResult, estimate: Any, device: str, why_no_estimate: str = "") -> Row:
    """verl's logged peaks (GiB, in GB here) and the card's against the preflight's estimate
    (:class:`agentrl.verl.preflight.MemoryEstimate`) of the same run."""
    name = "peak memory per phase"
    if device == "cpu":
        return Row(name, SKIP, "needs a GPU: on a CPU verl reports no device memory (0 GB)"
                   + (f" and {why_no_estimate}" if why_no_estimate else ""))
    if (row := _not_run(name, result)) is not None:
        return row
    if estimate is None:
        return Row(name, SKIP, why_no_estimate or "the preflight has no estimate for this model")
    first = result.steps.get(1, {})
    measured = {
        "after the critic's update": (first.get("critic/perf/max_memory_reserved_gb"),
                                      max(estimate.no_grad, estimate.critic)),
        "after the actor's update": (max((s.get("actor/perf/max_memory_reserved_gb", math.nan)
                                          for s in result.steps.values()), default=None),
                                     max(estimate.no_grad, estimate.critic, estimate.update)),
        "whole GPU (nvidia-smi)": (result.gpu_peak_gb, estimate.peak),
    }
    parts, over = [], []
    for phase, (used, planned) in measured.items():
        if used is None or (isinstance(used, float) and math.isnan(used)):
            parts.append(f"{phase}: not measured")
            continue
        used_gb = used * (GIB_TO_GB if "nvidia" not in phase else 1.0)
        parts.append(f"{phase} {used_gb:.1f} GB (estimate {planned:.1f})")
        if used_gb > planned:
            over.append(phase)
    if len([p for p in parts if "not measured" not in p]) == 0:
        return Row(name, FAIL, "verl logged no */perf/max_memory_reserved_gb")
    detail = "; ".join(parts)
    if over:
        return Row(name, FAIL, f"above the preflight's estimate {', '.join(over)}: {detail}")
    return Row(name, PASS, detail)


def cut_episodes_row(result: StageResult, expected: int) -> Row:
    """At each step, every cut episode's return at its last model token is its reward there."""
    name = "cut episodes: critic at last token"
    if (row := _not_run(name, result)) is not None:
        return row
    steps = {int(r["step"]): r["rows"] for r in result.cut}
    if sorted(steps) != list(range(1, expected + 1)):
        return Row(name, FAIL, f"the probe recorded steps {sorted(steps)}, expected "
                               f"1..{expected} (was {_probe_name()} set in the TaskRunner?)")
    if not all(steps.values()):
        empty = [s for s, rows in steps.items() if not rows]
        return Row(name, FAIL, f"no episode was cut at step(s) {empty}: nothing to check")
    worst = max(abs(r["return"] - r["reward"]) for rows in steps.values() for r in rows)
    values = ", ".join(f"step {s}: V {_mean([r['value'] for r in rows]):+.3f}, "
                       f"return {_mean([r['return'] for r in rows]):+.3f} ({len(rows)} cut)"
                       for s, rows in sorted(steps.items()))
    if worst > CUT_TOLERANCE:
        return Row(name, FAIL, f"a cut episode's return differs from its reward by {worst:.3g} "
                               f"at its last model token (bootstrapped): {values}")
    return Row(name, PASS, f"return = reward at every cut episode's last model token; {values}")


def v1_row(result: StageResult, expected: int, episodes: int) -> Row:
    name = f"V1 trainer, windowed, {expected} steps"
    if (row := _not_run(name, result)) is not None:
        return row
    if "TaskRunnerV1" not in result.log:
        return Row(name, FAIL, "the log names no TaskRunnerV1: not the V1 trainer")
    problem = _probs_problem(result.steps, expected)
    rows = [s["perf/total_num_tokens"] / (s["prompt_length/mean"] + s["response_length/mean"])
            for s in result.steps.values() if "perf/total_num_tokens" in s]
    if not problem and (len(rows) != expected or min(rows) <= episodes):
        problem = (f"rows per step {[round(r, 1) for r in rows]}, expected more than the "
                   f"{episodes} episodes (a row per turn)")
    top, mean = _probs_gaps(result.steps)
    return Row(name, FAIL if problem else PASS, problem or
               f"rows per step {', '.join(f'{r:.1f}' for r in rows)} from {episodes} episodes; "
               f"rollout_probs_diff_max {top:.3g}, mean {mean:.3g}")


def logprobs_row(check: Mapping[str, Any] | None, why_skipped: str = "") -> Row:
    """The packed-against-padded comparison of :func:`compare_remove_padding`."""
    name = "use_remove_padding on/off"
    if check is None:
        return Row(name, SKIP, why_skipped)
    if check.get("error"):
        return Row(name, FAIL, check["error"])
    gap = check["max_abs_diff"]
    detail = (f"max |packed - padded| masked probability {gap:.3g} (log-prob "
              f"{check.get('max_abs_logprob_diff', math.nan):.3g}) over {check['tokens']} model "
              f"tokens of {check['rows']} rows ({check['masked']} constrained)")
    if "max_abs_diff_rollout" in check:
        detail += f"; padded against vLLM's {check['max_abs_diff_rollout']:.3g}"
    if not gap <= LAYOUT_PROBS_DIFF:
        return Row(name, FAIL, f"{detail} (limit {LAYOUT_PROBS_DIFF}): the layouts disagree")
    return Row(name, PASS, detail)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _probe_name() -> str:
    from agentrl.verl.returns import PROBE_ENV

    return PROBE_ENV


def render(rows: Sequence[Row]) -> str:
    """The table: one line a row, status first."""
    width = max(len(r.name) for r in rows)
    lines = [f"{'check':<{width}}  result  detail", f"{'-' * width}  ------  ------"]
    lines += [f"{r.name:<{width}}  {r.status:<6}  {r.detail}" for r in rows]
    failed = sum(r.status == FAIL for r in rows)
    skipped = sum(r.status == SKIP for r in rows)
    lines.append(f"{len(rows) - failed - skipped} passed, {failed} failed, {skipped} skipped")
    return "\n".join(lines)


# -- use_remove_padding on and off, on one batch ---------------------------------------------------
def bare_engine(cls: type) -> Any:
    """verl's engine class without its model or process group: what its
    ``prepare_model_inputs`` and ``prepare_model_outputs`` read (one rank, no padding to a
    bucket), as the actor's micro-batch passes through them."""
    from types import SimpleNamespace

    from verl.utils.torch_functional import entropy_from_logits

    engine = object.__new__(cls)
    engine.pad_to_length, engine.pad_to_length_bucket = False, 0
    engine.use_ulysses_sp, engine.ulysses_sequence_parallel_size = False, 1
    engine.compute_entropy_from_logits = entropy_from_logits
    engine.engine_config = SimpleNamespace(entropy_checkpointing=False,
                                           entropy_from_logits_with_chunking=False)
    return engine


def masked_logprobs(model: Any, batch: Any, remove_padding: bool, temperature: float) -> Any:
    """The masked engine's log-probs of ``batch`` (a legacy ``DataProto``) in one micro-batch,
    packed (``remove_padding``) or padded, as ``(rows, response width)``."""
    from types import SimpleNamespace

    import torch
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    from agentrl.verl.masked_engine import MaskedLMEngine

    batch.meta_info["temperature"] = temperature
    data = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(data, use_remove_padding=remove_padding, calculate_entropy=False)
    engine = bare_engine(MaskedLMEngine)
    with torch.no_grad():
        inputs, args = engine.prepare_model_inputs(data)
        logits = model(**inputs).logits.float()
        out = engine.prepare_model_outputs(SimpleNamespace(logits=logits), args, data, None)
    return no_padding_2_padding(out["log_probs"], data)


PROBE_COLUMNS = ("prompts", "responses", "response_mask", "input_ids", "attention_mask",
                 "position_ids")


def compare_remove_padding(model: Any, batch: Any, temperature: float) -> dict[str, Any]:
    """Masked log-probs of one batch with ``use_remove_padding`` on and off (and against the
    rollout's, when the batch has them and the model is the one that sampled)."""
    from agentrl.verl.constrained import MASKS_FIELD

    keys = [*PROBE_COLUMNS, *(["rollout_log_probs"] if "rollout_log_probs" in batch.batch.keys()
                              else [])]
    batch = batch.select(batch_keys=keys, non_tensor_batch_keys=[
        k for k in (MASKS_FIELD,) if k in batch.non_tensor_batch])
    mask = batch.batch["response_mask"].bool()
    padded = masked_logprobs(model, batch, False, temperature)
    packed = masked_logprobs(model, batch, True, temperature)
    masks = batch.non_tensor_batch.get(MASKS_FIELD)
    result = {"max_abs_diff": float((packed.exp() - padded.exp())[mask].abs().max()),
              "max_abs_logprob_diff": float((packed - padded)[mask].abs().max()),
              "tokens": int(mask.sum()), "rows": int(mask.shape[0]),
              "masked": int(sum(m is not None for m in masks)) if masks is not None else 0}
    if "rollout_log_probs" in batch.batch.keys():
        rollout = batch.batch["rollout_log_probs"]
        result["max_abs_diff_rollout"] = float((padded.exp() - rollout.exp())[mask].abs().max())
    return result


def run_remove_padding_check(probe_batch: Path, model_path: str, temperature: float
                             ) -> dict[str, Any]:
    """:func:`compare_remove_padding` on a GPU, with the model as verl's actor loads it for
    packing (flash-attn 2)."""
    import torch
    from transformers import AutoModelForCausalLM
    from verl import DataProto

    batch = DataProto.load_from_disk(str(probe_batch))
    model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.bfloat16,
                                                 attn_implementation="flash_attention_2")
    model = model.to("cuda").eval()
    batch = batch.to("cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return compare_remove_padding(model, batch, temperature)


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
    result = _read_json(out / "logprobs.json")
    if not result or rerun:
        try:  # verl's actor divides by the rollout's temperature
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
        saved = _read_json(out / "doctor.json")
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
            if python is None or (stage.name == "v1" and not has_module(python,
                                                                        "transfer_queue")):
                reason = why or ("verl.trainer=v1 needs TransferQueue (`pip install "
                                 "TransferQueue`, as env_setup.sh does)")
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
