"""`agentrl doctor` (agentrl/cli/doctor.py; its rows: agentrl/verl/doctor_rows.py): each row
passes on a healthy record and fails on the record of the defect it checks; the table and exit
status from a doctor's folder; the stages' configs pass verl's own checks on every GPU preset
and on the CPU; use_remove_padding's comparison through verl's engine fails when one layout's
masks are misplaced; the whole doctor on this CPU (verl's real trainers, ~5 min) passes its CPU
rows. tests/verl/test_cpu_trainer.py also checks its runs with the rows."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from agentrl.cli import doctor
from agentrl.verl import layout_check
from agentrl.verl.doctor_rows import (
    CUT_TOLERANCE,
    FAIL,
    PASS,
    SKIP,
    Row,
    StageResult,
    constrained_row,
    cut_episodes_row,
    legacy_row,
    logprobs_row,
    memory_row,
    v1_row,
)
from agentrl.verl.preflight import MemoryEstimate


def step(top: float = 1e-3, mean: float = 1e-4, **more: float) -> dict[str, float]:
    return {"training/rollout_probs_diff_max": top, "training/rollout_probs_diff_mean": mean,
            **more}


def stage(name: str, steps: dict, **fields) -> StageResult:
    return StageResult(name, ran=True, steps=steps, **fields)


def violations(*counts: float) -> list[dict]:
    return [{"step": s, "train/quickSokobanAgent/constraint_violations": c}
            for s, c in enumerate(counts, 1)]


# -- the rows --------------------------------------------------------------------------------------
def test_the_legacy_row_fails_on_a_sampler_off_the_trainer_or_a_missing_step():
    assert legacy_row(stage("legacy", {1: step(), 2: step(), 3: step()}), 3).status == PASS
    off = legacy_row(stage("legacy", {1: step(), 2: step(top=0.9, mean=0.05), 3: step()}), 3)
    assert off.status == FAIL and "another distribution" in off.detail
    missing = legacy_row(stage("legacy", {1: step(), 2: step()}), 3)
    assert missing.status == FAIL and "expected 1..3" in missing.detail
    unlogged = legacy_row(stage("legacy", {1: {}, 2: {}}), 2)
    assert unlogged.status == FAIL and "not logged" in unlogged.detail


def test_the_legacy_row_reports_a_run_that_failed_or_was_not_started():
    failed = StageResult("legacy", ran=True, error="agentrl train exited 1")
    assert legacy_row(failed, 3) == Row(legacy_row(failed, 3).name, FAIL,
                                        "agentrl train exited 1")
    assert legacy_row(StageResult("legacy", ran=False, error="no vLLM"), 3).status == SKIP


def test_the_constrained_row_fails_on_a_violation_or_a_wider_gap_than_unconstrained():
    reference = stage("legacy", {1: step(mean=1e-3), 2: step(mean=1e-3)})
    clean = stage("constrained", {1: step(mean=1.5e-3), 2: step(mean=1e-3)},
                  records=violations(0, 0))
    assert constrained_row(clean, 2, reference).status == PASS
    violated = stage("constrained", clean.steps, records=violations(0, 1))
    row = constrained_row(violated, 2, reference)
    assert row.status == FAIL and "1 replies left their masks" in row.detail
    wider = stage("constrained", {1: step(mean=9e-3), 2: step()}, records=violations(0, 0))
    row = constrained_row(wider, 2, reference)
    assert row.status == FAIL and "the trainer's masks are not the sampler's" in row.detail
    assert constrained_row(wider, 2, None).status == PASS  # the limits alone
    unrecorded = stage("constrained", clean.steps, records=[{"step": 1}, {"step": 2}])
    assert "constraint_violations recorded for steps []" in constrained_row(
        unrecorded, 2, reference).detail


def test_the_cut_episode_row_fails_on_a_bootstrapped_return():
    ended = [{"step": s, "rows": [{"value": 0.3 * s, "reward": -1.0, "return": -1.0}]}
             for s in (1, 2, 3)]
    row = cut_episodes_row(stage("legacy", {}, cut=ended), 3)
    assert row.status == PASS and "step 3: V +0.900" in row.detail
    # the old rule: the return at the last model token was r_T + V_T
    bootstrapped = [{"step": s, "rows": [{"value": v, "reward": -1.0, "return": -1.0 + v}]}
                    for s, v in ((1, 0.2), (2, -0.8), (3, -1.7))]
    row = cut_episodes_row(stage("legacy", {}, cut=bootstrapped), 3)
    assert row.status == FAIL and "bootstrapped" in row.detail
    uncut = [{"step": s, "rows": []} for s in (1, 2, 3)]
    assert "no episode was cut" in cut_episodes_row(stage("legacy", {}, cut=uncut), 3).detail
    assert cut_episodes_row(stage("legacy", {}, cut=[]), 3).status == FAIL


def test_the_memory_row_fails_above_the_estimate_and_skips_on_a_cpu():
    estimate = MemoryEstimate(update=30.0, no_grad=20.0, rollout=60.0, critic=25.0)
    gib = 1e9 / 1024 ** 3  # verl logs GiB
    healthy = stage("legacy", {s: step(**{"critic/perf/max_memory_reserved_gb": 18 * gib,
                                          "actor/perf/max_memory_reserved_gb": 28 * gib})
                               for s in (1, 2)}, gpu_peak_gb=55.0)
    row = memory_row(healthy, estimate, "cuda")
    assert row.status == PASS and "after the actor's update 28.0 GB (estimate 30.0)" in row.detail
    over = stage("legacy", {1: healthy.steps[1], 2: step(
        **{"actor/perf/max_memory_reserved_gb": 33 * gib})}, gpu_peak_gb=55.0)
    row = memory_row(over, estimate, "cuda")
    assert row.status == FAIL and "after the actor's update" in row.detail
    card = stage("legacy", healthy.steps, gpu_peak_gb=71.0)
    assert "whole GPU" in memory_row(card, estimate, "cuda").detail.split(":")[0]
    assert memory_row(healthy, estimate, "cpu").status == SKIP
    assert memory_row(healthy, None, "cuda", "no sizes").status == SKIP
    unlogged = stage("legacy", {1: step(), 2: step()})
    assert memory_row(unlogged, estimate, "cuda").status == FAIL


def test_the_v1_row_needs_the_v1_trainer_and_a_row_per_turn():
    rows = {"perf/total_num_tokens": 1000.0, "prompt_length/mean": 100.0,
            "response_length/mean": 25.0}  # 8 rows
    log = "(TaskRunnerV1 pid=1) ..."
    assert v1_row(stage("v1", {1: step(**rows), 2: step(**rows)}, log=log), 2, 4).status == PASS
    one_row_each = stage("v1", {1: step(**rows), 2: step(**rows)}, log=log)
    assert v1_row(one_row_each, 2, 8).status == FAIL
    legacy = stage("v1", {1: step(**rows), 2: step(**rows)}, log="(TaskRunner pid=1)")
    assert "TaskRunnerV1" in v1_row(legacy, 2, 4).detail


def test_the_logprob_row_fails_when_the_layouts_disagree():
    check = {"max_abs_diff": 2e-3, "max_abs_logprob_diff": 4e-3, "tokens": 40, "rows": 4,
             "masked": 4}
    assert logprobs_row(check).status == PASS
    assert logprobs_row({**check, "max_abs_diff": 0.3}).status == FAIL
    assert logprobs_row({**check, "max_abs_diff": float("nan")}).status == FAIL
    assert logprobs_row(None, "needs a GPU").status == SKIP


# -- the command -----------------------------------------------------------------------------------
def write_stage(folder: Path, name: str, steps: dict, records=(), cut=(), log_extra: str = ""):
    lines = [f"step:{s} - " + " - ".join(f"{k}:{v}" for k, v in values.items())
             for s, values in steps.items()]
    (folder / f"{name}.log").write_text(log_extra + "\n" + "\n".join(lines) + "\n")
    (folder / f"{name}.json").write_text(json.dumps({"minutes": 1.0, "error": ""}))
    (folder / name / "probe").mkdir(parents=True)
    (folder / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / name / "probe" / "cut_episodes.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in cut))


def doctor_folder(folder: Path, violation: float) -> Path:
    """A doctor's folder as a CPU run leaves it, with ``violation`` replies outside their
    masks at the constrained run's second step."""
    folder.mkdir()
    (folder / "doctor.json").write_text(json.dumps(
        {"overrides": ["hardware=cpu-verl", "model=tiny_vllm"]}))
    cut = [{"step": s, "rows": [{"value": 0.1, "reward": 0.0, "return": 0.0}]} for s in (1, 2, 3)]
    write_stage(folder, "legacy", {s: step() for s in (1, 2, 3)}, cut=cut)
    write_stage(folder, "constrained", {s: step() for s in (1, 2)},
                records=violations(0, violation))
    windows = {"perf/total_num_tokens": 1200.0, "prompt_length/mean": 100.0,
               "response_length/mean": 20.0}
    write_stage(folder, "v1", {s: step(**windows) for s in (1, 2)}, log_extra="TaskRunnerV1")
    return folder


@pytest.mark.parametrize(("violation", "status"), [(0.0, 0), (1.0, 1)])
def test_the_table_from_a_doctors_folder_fails_on_a_constraint_violation(tmp_path, capsys,
                                                                          violation, status):
    folder = doctor_folder(tmp_path / "doctor", violation)
    args = argparse.Namespace(overrides=[], out=None, check=folder)
    assert doctor.run(args) == status
    table = capsys.readouterr().out
    lines = {line.split("  ")[0].strip(): line for line in table.splitlines()}
    assert "PASS" in lines["legacy trainer, 3 steps"]
    assert ("FAIL" if violation else "PASS") in lines["constrained actions"]
    assert "SKIP    needs a GPU" in lines["peak memory per phase"]
    assert "SKIP    needs a GPU" in lines["use_remove_padding on/off"]
    assert "PASS" in lines["cut episodes: critic at last token"]
    assert "PASS" in lines["V1 trainer, windowed, 2 steps"]
    assert f"{4 - int(violation)} passed, {int(violation)} failed, 2 skipped" in table


def test_check_of_a_folder_that_is_not_a_doctors_names_it(tmp_path):
    with pytest.raises(ValueError, match="no doctor.json"):
        doctor.run(argparse.Namespace(overrides=[], out=None, check=tmp_path))


def test_a_stage_not_started_says_why(tmp_path):
    folder = doctor_folder(tmp_path / "doctor", 0.0)
    for suffix in ("log", "json"):
        (folder / f"v1.{suffix}").unlink()
    (folder / "v1.skipped").write_text("verl.trainer=v1 needs TransferQueue")
    row = v1_row(StageResult.read(folder, "v1"), 2, 4)
    assert row.status == SKIP and "TransferQueue" in row.detail


@pytest.mark.parametrize("user", [["hardware=a100", "model=qwen_3b"],
                                  ["hardware=l40", "model=qwen_halfb", "verl.nnodes=2"],
                                  ["hardware=cpu-verl", "model=tiny_vllm"]])
def test_every_stage_passes_verls_checks_and_the_preflight(user, tmp_path, capsys):
    """What the doctor starts on a GPU node, checked here as --dry-run checks a job: verl's own
    config checks and the dispatch arithmetic on the composed config."""
    from agentrl.config import compose_config
    from agentrl.verl.launch import launch

    config = compose_config(user)
    made = doctor.stages(config, tmp_path)
    assert tuple(s.name for s in made) == doctor.STAGE_NAMES == ("legacy", "constrained", "v1")
    gpus = config.verl.nnodes * config.verl.n_gpus_per_node
    assert doctor.episodes_per_step(config) % gpus == 0
    for each in made:
        assert launch(compose_config([*user, *each.overrides]), dry_run=True) == 0
        out = capsys.readouterr().out
        assert "    trainer.save_freq=-1 \\" in out  # no checkpoint: minutes saved
        assert ("AGENTRL_PROBE_DIR" in out) == (each.name != "v1")


# -- use_remove_padding, through verl's engine -----------------------------------------------------
def probe_batch(tokenizer):
    """A legacy batch of 3 rows of different lengths (prompts left-padded, responses
    right-padded, an observation of mask 0 in one), the first with constrained masks."""
    from verl import DataProto

    from agentrl.engines.constrained import TokenMask
    from agentrl.verl.constrained import MASKS_FIELD, RowMasks

    prompts = [tokenizer.encode(t) for t in ("Push the box.", "A longer prompt: go up and then "
                                              "left", "Hi")]
    responses = [tokenizer.encode(t) for t in ("<answer>Up</answer>", "Left, then down",
                                               "Right")]
    width_p, width_r = max(map(len, prompts)), max(map(len, responses))
    rows = {k: [] for k in ("prompts", "responses", "response_mask", "attention_mask")}
    for p, r in zip(prompts, responses):
        rows["prompts"].append([0] * (width_p - len(p)) + p)
        rows["responses"].append(r + [0] * (width_r - len(r)))
        mask = [1] * len(r)
        if len(r) > 3:
            mask[2] = 0  # an observation token
        rows["response_mask"].append(mask + [0] * (width_r - len(r)))
        rows["attention_mask"].append([0] * (width_p - len(p)) + [1] * (len(p) + len(r))
                                      + [0] * (width_r - len(r)))
    tensors = {k: torch.tensor(v) for k, v in rows.items()}
    tensors["input_ids"] = torch.cat([tensors["prompts"], tensors["responses"]], dim=1)
    tensors["position_ids"] = (tensors["attention_mask"].cumsum(1) - 1).clamp(min=0)
    data = DataProto.from_dict(tensors=tensors)
    first = responses[0]
    masks = [TokenMask((first[0], first[0] + 1), True), TokenMask((5,), False)]
    data.non_tensor_batch[MASKS_FIELD] = np.array(
        [RowMasks.pack(masks + [None] * (len(first) - 2)), None, None], dtype=object)
    return data


class Varlen(torch.nn.Module):
    """The model, with packed input as flash-attn's varlen attention runs it: each sequence
    (a run of position ids from 0) attends only to itself."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, position_ids=None, **kwargs):
        from types import SimpleNamespace

        if input_ids.shape[0] != 1 or position_ids is None or kwargs.get("attention_mask") \
                is not None:
            return self.model(input_ids=input_ids, position_ids=position_ids, **kwargs)
        starts = (position_ids[0] == 0).nonzero().flatten().tolist() + [input_ids.shape[1]]
        logits = [self.model(input_ids=input_ids[:, a:b]).logits
                  for a, b in zip(starts, starts[1:])]
        return SimpleNamespace(logits=torch.cat(logits, dim=1))


@pytest.mark.usefixtures("one_torch_thread")
def test_packed_and_padded_masked_logprobs_agree_and_fail_on_a_misplaced_mask(tiny,
                                                                              monkeypatch):
    from agentrl.verl import masked_engine

    model, tokenizer = tiny
    batch = probe_batch(tokenizer)
    check = layout_check.compare_remove_padding(Varlen(model), batch, temperature=1.0)
    assert check["rows"] == 3 and check["masked"] == 1
    assert logprobs_row(check).status == PASS, check
    # the constrained first row's masked distribution differs from the free one
    masked = layout_check.masked_logprobs(Varlen(model), batch, False, 1.0)
    free = batch.select(batch_keys=list(layout_check.PROBE_COLUMNS), non_tensor_batch_keys=[])
    assert (masked[0, 0] - layout_check.masked_logprobs(model, free, False, 1.0)[0, 0]).abs() > 1e-3
    # packed rows' masks one position late: the engine's packed offsets off verl's slice
    ends = masked_engine._sequence_ends

    def late_when_packed(micro_batch, logits):
        found, responses = ends(micro_batch, logits)
        return ([end + 1 for end in found] if logits.shape[0] == 1 else found), responses

    monkeypatch.setattr(masked_engine, "_sequence_ends", late_when_packed)
    row = logprobs_row(layout_check.compare_remove_padding(Varlen(model), batch, 1.0))
    assert row.status == FAIL and "the layouts disagree" in row.detail


# -- examples/check_gpu.sh -------------------------------------------------------------------------
FAKE_NVIDIA_SMI = """#!/usr/bin/env bash
case "$*" in
  -L) for i in 0 1 2 3; do echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: GPU-$i)"; done ;;
  *query-gpu=name*) echo "NVIDIA H100 80GB HBM3" ;;
  *query-gpu=memory.total*) echo 81559 ;;
  *) exit 1 ;;
esac
"""


@pytest.mark.parametrize("gpu", [False, True])
def test_the_script_runs_the_doctor_on_this_nodes_preset(tmp_path, gpu):
    """What examples/check_gpu.sh hands `agentrl doctor`: the preset of the node's GPU (a fake
    nvidia-smi of 4 H100s), its memory and GPU count, the model, the caller's overrides last;
    without a GPU, the CPU rows' preset."""
    import os
    import subprocess

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text('#!/usr/bin/env bash\necho "$@"\n')
    if gpu:
        (bin_dir / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "OUT": str(tmp_path / "d")}
    done = subprocess.run(["bash", "examples/check_gpu.sh", "qwen_3b", "verl.nnodes=1"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    args = done.stdout.split()
    assert args[:5] == ["-m", "agentrl.cli", "doctor", "--out", str(tmp_path / "d")]
    expected = (["hardware=h100", "model=qwen_3b", "hardware.gpu_memory_gb=85.5",
                 "verl.n_gpus_per_node=4"] if gpu else ["hardware=cpu-verl", "model=qwen_3b"])
    assert args[5:] == [*expected, "verl.nnodes=1"]
    help_text = subprocess.run(["bash", "examples/check_gpu.sh", "--help"], cwd=root,
                               capture_output=True, text=True, timeout=60).stdout
    assert "at most 10 minutes" in help_text


def test_a_failed_stage_names_the_exception_it_died_of():
    log = ("step:1 - x:1\nTraceback (most recent call last):\n  File 'a.py'\n"
           "ray.exceptions.RayTaskError(AttributeError): ray::TaskRunnerV1.run()\n"
           "AttributeError: 'LinkedList' object has no attribute 'tolist'\n\n"
           "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n")
    assert doctor.last_error(log) == "AttributeError: 'LinkedList' object has no attribute 'tolist'"
    assert doctor.last_error("only this\n") == "only this"


@pytest.mark.slow
def test_the_doctor_on_this_cpu_passes_its_cpu_rows_on_verls_real_trainers(tmp_path):
    """`agentrl doctor hardware=cpu-verl model=tiny_vllm --stages legacy,constrained`, as a user
    without a GPU runs it: verl's legacy trainer, plain and constrained, briefly; every row a CPU
    can check passes on what the runs left, the rows that need a GPU say so. The V1 stage (4
    of the doctor's 9 minutes here) is left out: its row is checked on test_cpu_trainer.py's
    V1 run (the same preset, windowed and constrained), its config by verl's checks above.
    The cut-episode row on a real run: every Sokoban episode not won on its first reply is cut
    by the response budget, and at each one's last model token verl's GAE return is its
    reward, so the critic's target there has a fixed point (a bootstrapped return would be
    reward + value)."""
    import subprocess

    from verl_runs import cpu_verl_python

    cpu_verl_python()   # the doctor's stages run on it
    out = tmp_path / "doctor"
    done = subprocess.run([sys.executable, "-m", "agentrl.cli", "doctor", "hardware=cpu-verl",
                           "model=tiny_vllm", "--stages", "legacy,constrained", "--out", str(out)],
                          capture_output=True, text=True, timeout=2 * doctor.STAGE_TIMEOUT_S)
    print(done.stdout[-3000:])
    lines = {line.split("  ")[0].strip(): line for line in done.stdout.splitlines()}
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    for row in ("legacy trainer, 3 steps", "constrained actions",
                "cut episodes: critic at last token"):
        assert "PASS" in lines[row], row
    v1 = lines["V1 trainer, windowed, 2 steps"]
    assert "SKIP    not asked (--stages legacy,constrained)" in v1, v1
    for row in ("peak memory per phase", "use_remove_padding on/off"):
        assert "SKIP    needs a GPU" in lines[row], row
    cut = StageResult.read(out, "legacy").cut
    assert sorted(int(r["step"]) for r in cut) == [1, 2, 3]
    for record in cut:   # cut episodes at every step, each return its reward
        assert record["rows"] and all(abs(r["return"] - r["reward"]) < CUT_TOLERANCE
                                      for r in record["rows"])


def test_only_the_stages_asked_for_run_and_the_others_rows_say_so(tmp_path, monkeypatch,
                                                                 capsys):
    ran = []
    monkeypatch.setattr(doctor, "trainer_python", lambda config: (sys.executable, ""))
    monkeypatch.setattr(doctor, "run_stage", lambda stage, *rest: ran.append(stage.name))
    args = argparse.Namespace(overrides=["hardware=cpu-verl", "model=tiny_vllm"],
                              out=tmp_path / "d", check=None,
                              stages=doctor.stage_names("legacy"))
    doctor.run(args)
    assert ran == ["legacy"]
    lines = {line.split("  ")[0].strip(): line for line in capsys.readouterr().out.splitlines()}
    for row in ("constrained actions", "V1 trainer, windowed, 2 steps"):
        assert "SKIP    not asked (--stages legacy)" in lines[row]


def test_stages_names_only_the_doctors_stages():
    assert doctor.stage_names("v1, legacy") == ("legacy", "v1")
    for bad in ("", "legacy,gpu"):
        with pytest.raises(argparse.ArgumentTypeError, match="allowed: .*legacy, constrained, v1"):
            doctor.stage_names(bad)
