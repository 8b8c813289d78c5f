"""scripts/bench/quick_train.py on a synthetic run folder: the summary's numbers, the JSON's shape
(that of docs/results/quick_train_2026-11-26.json), the plot, where quick_train.sh's run writes,
and the errors that name what is missing. Nothing here trains or runs quick_train.sh."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from agentrl.evaluation.stats import wilson_interval

EVIDENCE = Path(__file__).resolve().parents[2] / "docs/results/quick_train_2026-11-26.json"
PRESET = "tightBlocksworldTurnsAgent"
START = 1_795_708_568.0  # unix seconds of run.json's "created"


@pytest.fixture(scope="module")
def bench(load_script):
    return load_script("scripts/bench/quick_train.py")


def val(success: float, games: int = 32) -> dict:
    return {f"val/{PRESET}/success": success, f"val/{PRESET}/episodes": float(games)}


@pytest.fixture
def run(tmp_path) -> Path:
    """Step 0 validated; 3 warm-start steps (the last validated); 2 PPO steps (the last
    validated); 10 minutes from run.json's start to the last row."""
    rows = [
        {"step": 0, **val(0.09375)},
        *({"step": s, "sft/loss": 1.0 / s, "sft/rows": 18, "timing/sft_s": t, "timing/step_s": t}
          for s, t in ((1, 30.0), (2, 40.0))),
        {"step": 3, "sft/loss": 0.3, "timing/sft_s": 50.0, "timing/step_s": 50.0, **val(0.34375)},
        {"step": 4, f"train/{PRESET}/success": 0.375, f"train/{PRESET}/episodes": 8.0,
         "actor/entropy": 0.06, "timing/rollout_s": 40.0, "timing/step_s": 60.0},
        {"step": 5, f"train/{PRESET}/success": 0.5, f"train/{PRESET}/episodes": 8.0,
         "actor/entropy": 0.05, "timing/step_s": 90.0, **val(0.28125)},
    ]
    folder = tmp_path / "runs" / "agentrl" / "quick"
    folder.mkdir(parents=True)
    times = [START + 60 * i for i in range(len(rows) - 1)] + [START + 600]
    (folder / "metrics.jsonl").write_text(
        "".join(json.dumps({"time": t, **row}) + "\n" for t, row in zip(times, rows)))
    (folder / "run.json").write_text(json.dumps(
        {"run_id": "quick-x", "experiment": "quick",
         "created": datetime.datetime.fromtimestamp(START).isoformat()}))
    return folder


def test_summary_numbers_come_from_the_metrics(bench, run):
    summary = bench.summarize(run, what="w", name="n", machine="m")
    assert [(v["step"], v["wins"], v["games"]) for v in summary["val"]] == [
        (0, 3, 32), (3, 11, 32), (5, 9, 32)]
    for v in summary["val"]:
        assert v["wins"] == round(v["success"] * v["games"])
        assert v["ci95"][0] < v["success"] < v["ci95"][1]
        assert v["ci95"] == [round(b, 3) for b in wilson_interval(v["wins"], v["games"])]
    assert summary["val"][0]["ci95"] == [0.032, 0.242]  # as in the 2026-11-26 evidence
    assert summary["warm_start_end"] == 3
    assert summary["ppo_steps"] == [
        {"step": 4, "success": 0.375, "entropy": 0.06, "step_s": 60.0},
        {"step": 5, "success": 0.5, "entropy": 0.05, "step_s": 90.0}]
    assert summary["warm_start_step_minutes"] == 2.0  # (30 + 40 + 50) s
    assert summary["ppo_step_minutes"] == 2.5  # (60 + 90) s
    assert summary["wall_minutes"] == 10.0
    assert summary["seed"] is None  # no checkpoint to read it from
    assert summary["held_out"].startswith("32 val games")


def test_from_run_writes_the_evidence_shape_and_a_plot(bench, run, tmp_path):
    out = tmp_path / "out" / "quick.json"
    result = bench.main(["--from-run", str(run), "--out", str(out), "--machine", "2-core test"])
    assert json.loads(out.read_text()) == result
    evidence = json.loads(EVIDENCE.read_text())
    assert list(result) == list(evidence)
    (summary,), (reference,) = result["runs"], evidence["runs"]
    assert list(summary) == list(reference)
    assert list(summary["val"][0]) == list(reference["val"][0])
    assert list(summary["ppo_steps"][0]) == list(reference["ppo_steps"][0])
    assert summary["machine"] == "2-core test" and summary["name"] == "quick"
    assert result["date"] == datetime.date.fromtimestamp(START + 600).isoformat()
    assert out.with_suffix(".png").stat().st_size > 0


def test_a_verl_runs_folder_is_summarized_from_its_rows_of_each_step(bench, tmp_path):
    """A verl run logs a step in several rows (its rollouts', verl's own with ``timing_s/step``,
    validation's) and keeps its config, seed included, in the run folder."""
    import yaml

    run = tmp_path / "verl_run"
    (run / "checkpoints" / "global_step_2" / "actor").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"seed": 7}))
    rows = [{"step": 0, **val(0.125)},
            *({"step": step, f"train/{PRESET}/success": success,
               f"train/{PRESET}/episodes": 8.0} for step, success in ((1, 0.25), (2, 0.5))),
            *({"step": step, "timing_s/step": seconds, "actor/entropy": 0.3,
               "training/global_step": step} for step, seconds in ((1, 120.0), (2, 60.0))),
            {"step": 2, **val(0.375)}]
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"time": START + 60 * i, **row}) + "\n" for i, row in enumerate(rows)))
    summary = bench.summarize(run, what="w", name="n", machine="m")
    assert [(v["step"], v["wins"]) for v in summary["val"]] == [(0, 4), (2, 12)]
    assert [(p["step"], p["success"], p["step_s"], p["entropy"])
            for p in summary["ppo_steps"]] == [(1, 0.25, 120.0, 0.3), (2, 0.5, 60.0, 0.3)]
    assert summary["ppo_step_minutes"] == 3.0 and summary["seed"] == 7


def test_an_existing_evidence_file_is_not_overwritten(bench, run, tmp_path):
    out = tmp_path / "quick.json"
    out.write_text("{}")
    with pytest.raises(SystemExit, match="--force"):
        bench.main(["--from-run", str(run), "--out", str(out)])
    assert out.read_text() == "{}"
    bench.main(["--from-run", str(run), "--out", str(out), "--force"])
    assert json.loads(out.read_text())["runs"]


def test_a_folder_without_metrics_is_named(bench, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--from-run", str(tmp_path / "empty"), "--out", str(tmp_path / "x.json")])
    assert exit_info.value.code == 2
    assert f"--from-run {tmp_path / 'empty'}: no metrics.jsonl there" in capsys.readouterr().err


def test_metrics_without_validation_are_named(bench, run, tmp_path):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({k: v for k, v in row.items() if not k.startswith("val/")}) + "\n"
        for row in rows))
    with pytest.raises(SystemExit, match=f"{run / 'metrics.jsonl'} has no validation rows"):
        bench.main(["--from-run", str(run), "--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()


def test_run_folder_follows_positional_arguments_and_overrides(bench, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert bench.run_folder([]) == tmp_path / "runs" / "agentrl" / "quick"
    args = ["0", "", "", "", "", "", "", "", "proj", "exp", "embedded", "4"]
    assert bench.run_folder(args) == tmp_path / "runs" / "proj" / "exp"
    assert bench.run_folder([*args, "experiment=other"]) == tmp_path / "runs" / "proj" / "other"
    assert bench.run_folder(["0", "run_dir=somewhere", "threads=1"]) == tmp_path / "somewhere"
    assert bench.run_folder(["run_dir=a", "run_dir=null"]) == tmp_path / "runs/agentrl/quick"


def test_a_run_folder_it_would_resume_is_refused_before_training(bench, run, monkeypatch):
    monkeypatch.chdir(run.parents[2])
    monkeypatch.setattr(bench.subprocess, "run", lambda *a, **k: pytest.fail("trained"))
    with pytest.raises(SystemExit, match=f"{run / 'metrics.jsonl'} exists"):
        bench.main(["--out", "x.json"])
