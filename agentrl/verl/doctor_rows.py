"""The first-run check's rows (``agentrl doctor``, :mod:`agentrl.cli.doctor`): each a PASS,
FAIL or SKIP with its reason, read from what a short training left (:class:`StageResult`). A
row fails when its check does: tests/verl/test_doctor.py feeds each one a run that should.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    status: str
    detail: str


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
        status = read_json(folder / f"{name}.json")
        return cls(name, ran=True, error=status.get("error", ""), steps=console_steps(log),
                   records=_jsonl(run_dir / "metrics.jsonl"),
                   cut=_jsonl(run_dir / "probe" / CUT_EPISODES_FILE), log=log,
                   gpu_peak_gb=status.get("gpu_peak_gb"), minutes=status.get("minutes"))


def read_json(path: Path) -> dict[str, Any]:
    """A doctor's JSON file; ``{}`` when it is not there (a stage not run)."""
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
    """The packed-against-padded comparison
    (:func:`agentrl.verl.layout_check.compare_remove_padding`)."""
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
