"""Run tracking: run ids, the metrics history across resumes, WandB modes, secrets, plots."""

from __future__ import annotations

import json
import logging
import re
from datetime import datetime

import pytest

from agentrl.trainers import tracking
from agentrl.trainers.plots import plot_learning_curves
from agentrl.trainers.tracking import (
    RunTracker,
    new_run_id,
    public_config,
    read_metrics,
    resolve_wandb_mode,
    summary_line,
)

SENTINEL_KEY = "sentinel0key0that0must0never0be0written00"


@pytest.fixture(autouse=True)
def no_wandb_environment(monkeypatch):
    """Tests decide the WandB settings themselves; a developer's environment must not leak in."""
    for name in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)


def tracker(run_dir, **kwargs) -> RunTracker:
    kwargs = {"project": "agentrl-tests", "experiment": "sokoban ppo", "use_wandb": False,
              "console": False, **kwargs}
    return RunTracker(run_dir, **kwargs)


def steps(run_dir) -> list[int]:
    return [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")]


def test_one_record_per_step_with_the_metrics(tmp_path):
    with tracker(tmp_path) as run:
        for step in (1, 2, 3):
            run.log(step, {"train/a/success": step / 4, "actor/entropy": float("nan")})
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert [r["train/a/success"] for r in records] == [0.25, 0.5, 0.75]
    assert records[0]["actor/entropy"] is None  # strict JSON: NaN becomes null
    assert all(isinstance(r["time"], float) for r in records)


def test_resume_drops_the_steps_after_the_checkpoint(tmp_path):
    """A run killed after logging step 5 but checkpointed at step 3 redoes steps 4 and 5."""
    with tracker(tmp_path) as run:
        first_id = run.run_id
        for step in range(1, 6):
            run.log(step, {"loss": float(step)})
    with open(tmp_path / "metrics.jsonl", "a") as file:
        file.write('{"step": 6, "lo')  # killed while writing step 6

    with tracker(tmp_path, resume_step=3) as run:
        assert (run.run_id, run.last_step) == (first_id, 3)
        for step in (4, 5, 6):
            run.log(step, {"loss": 10.0 * step})
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in records] == [1, 2, 3, 40, 50, 60]


def test_resume_after_a_last_line_without_its_newline(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "loss": 2.0}')
    with tracker(tmp_path, resume_step=2) as run:
        run.log(3, {"loss": 3.0})
    assert steps(tmp_path) == [1, 2, 3]


def test_a_fresh_start_in_the_same_folder_drops_the_old_history(tmp_path):
    with tracker(tmp_path) as run:
        run.log(1, {"loss": 1.0})
    with tracker(tmp_path) as run:
        assert run.last_step is None
        run.log(1, {"loss": 2.0})
    assert [r["loss"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [2.0]


def test_a_step_is_logged_once(tmp_path):
    with tracker(tmp_path) as run:
        run.log(2, {"loss": 1.0})
        with pytest.raises(ValueError, match="step 2 is not after the last logged step 2"):
            run.log(2, {"val/a/success": 1.0})
    assert steps(tmp_path) == [2]


@pytest.mark.parametrize(("metrics", "error", "message"), [
    ({"loss": "high"}, TypeError, "metric 'loss' must be a number"),
    ({"step": 1.0}, ValueError, "metric name 'step' is reserved"),
])
def test_bad_metrics_are_named(tmp_path, metrics, error, message):
    with tracker(tmp_path) as run, pytest.raises(error, match=message):
        run.log(1, metrics)


def test_a_broken_line_inside_the_history_is_an_error(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"ste\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON object"):
        read_metrics(tmp_path / "metrics.jsonl")


def test_run_id_is_made_once_and_reused(tmp_path):
    run_id = new_run_id("sokoban ppo/qwen:0.5b", now=datetime(2025, 3, 4, 5, 6, 7))
    assert re.fullmatch(r"sokoban-ppo-qwen-0\.5b-20250304-050607-[0-9a-f]{4}", run_id)
    with tracker(tmp_path / "run") as run:
        made = run.run_id
    assert json.loads((tmp_path / "run" / "run.json").read_text())["run_id"] == made
    with tracker(tmp_path / "run", experiment="other") as run:
        assert run.run_id == made


def test_wandb_mode_resolution(monkeypatch):
    assert resolve_wandb_mode() == "offline"
    monkeypatch.setenv("WANDB_API_KEY", SENTINEL_KEY)
    assert resolve_wandb_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "dryrun")
    assert resolve_wandb_mode() == "offline"
    assert resolve_wandb_mode("disabled") == "disabled"
    with pytest.raises(ValueError, match="wandb_mode='on': allowed values are online, offline"):
        resolve_wandb_mode("on")
    monkeypatch.setenv("WANDB_MODE", "cloud")
    with pytest.raises(ValueError, match="WANDB_MODE='cloud'"):
        resolve_wandb_mode()


def test_public_config_redacts_secret_names_and_values(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefgh12345")
    config = {"wandb": {"api_key": "k1234567", "project": "p"}, "hf_token": "hf_x",
              "max_response_tokens": 128, "pad_token": "<pad>",
              "notes": ["uses hf_abcdefgh12345 for downloads"], "password": 1234}
    assert public_config(config) == {
        "wandb": {"api_key": "<redacted>", "project": "p"}, "hf_token": "<redacted>",
        "max_response_tokens": 128, "pad_token": "<pad>", "notes": ["<redacted>"],
        "password": "<redacted>"}


def test_summary_line_shows_the_watched_metrics():
    metrics = {"train/simpleSokobanAgent/success": 0.25, "val/simpleSokobanAgent/success": 0.5,
               "actor/pg_loss": -0.0123, "actor/entropy": 1.5, "timing/generate_s": 9.0}
    line = summary_line(7, metrics, total_steps=20)
    assert line.startswith("step 7/20 | ")
    for text in ("success simpleSokobanAgent 0.25", "val simpleSokobanAgent 0.5",
                 "pg_loss -0.0123", "entropy 1.5"):
        assert text in line
    assert "generate" not in line


def test_console_prints_one_summary_per_step(tmp_path, capsys):
    with tracker(tmp_path, console=True) as run:
        run.log(1, {"actor/pg_loss": 0.5})
        run.log(2, {"actor/pg_loss": 0.25})
    printed = capsys.readouterr().out.splitlines()
    assert [line for line in printed if line.startswith("step ")] == [
        "step 1 | pg_loss 0.5", "step 2 | pg_loss 0.25"]


def test_offline_wandb_writes_a_local_run_and_never_the_key(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("WANDB_API_KEY", SENTINEL_KEY)
    config = {"trainer": {"lr": 1e-6}, "wandb": {"api_key": SENTINEL_KEY},
              "note": f"key={SENTINEL_KEY}"}
    with tracker(tmp_path, use_wandb=True, wandb_mode="offline", config=config,
                 console=True) as run:
        assert run.wandb_run is not None
        run.log(1, {"train/a/success": 1.0})
        run_id = run.run_id
    assert list((tmp_path / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    captured = capfd.readouterr()
    assert SENTINEL_KEY not in captured.out + captured.err
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert SENTINEL_KEY.encode() not in path.read_bytes(), path


def test_a_failing_wandb_start_is_a_warning_not_an_error(tmp_path, monkeypatch, caplog):
    import wandb

    def refuse(**kwargs):
        raise RuntimeError(f"cannot reach the server with key {SENTINEL_KEY}")

    monkeypatch.setenv("WANDB_API_KEY", SENTINEL_KEY)
    monkeypatch.setattr(wandb, "init", refuse)
    with (caplog.at_level(logging.WARNING, logger=tracking.__name__),
          tracker(tmp_path, use_wandb=True, wandb_mode="online") as run):
        run.log(1, {"loss": 1.0})
    assert run.wandb_run is None and steps(tmp_path) == [1]
    assert "WandB disabled for this run: RuntimeError" in caplog.text
    assert SENTINEL_KEY not in caplog.text


def test_learning_curves_png_from_a_run(tmp_path):
    import matplotlib.image

    with tracker(tmp_path) as run:
        for step in range(1, 9):
            metrics = {f"train/{p}/success": step / 8 for p in ("sokoban", "tetris")}
            metrics |= {"actor/pg_loss": 1 / step, "critic/vf_loss": 2 / step,
                        "actor/ppo_kl": 0.01 * step, "actor/entropy": 2 - step / 8}
            if step % 4 == 0:
                metrics["val/sokoban/success"] = step / 10
            run.log(step, metrics)
    full = plot_learning_curves(tmp_path / "metrics.jsonl", tmp_path / "curves.png", title="run")
    (tmp_path / "one.jsonl").write_text('{"step": 1, "actor/entropy": 1.0}\n')
    single = plot_learning_curves(tmp_path / "one.jsonl", tmp_path / "plots" / "one.png")
    (tmp_path / "none.jsonl").write_text("")
    empty = plot_learning_curves(tmp_path / "none.jsonl", tmp_path / "none.png")

    images = [matplotlib.image.imread(p) for p in (full, single, empty)]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in (full, single, empty))
    assert images[0].shape[1] > images[1].shape[1]  # five panels are wider than one
    assert images[0].std() > 0 and images[1].std() > 0  # something was drawn
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["curves.png", "none.png"]


def test_validation_success_has_a_95_percent_band(tmp_path):
    import matplotlib.image

    from agentrl.evaluation.stats import wilson_interval
    from agentrl.trainers.plots import success_band

    lines = [{"step": s, "val/sokoban/success": s / 8} for s in (0, 4, 8)]
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in lines))
    banded = tmp_path / "banded.jsonl"
    banded.write_text("".join(json.dumps({**r, "val/sokoban/episodes": 32}) + "\n"
                              for r in lines))
    steps, low, high = success_band(read_metrics(banded), "val/sokoban/success")
    assert steps == [0, 4, 8]
    assert list(zip(low, high)) == [wilson_interval(32 * s / 8, 32) for s in steps]
    assert success_band(read_metrics(plain), "val/sokoban/success") == ([], [], [])
    images = [matplotlib.image.imread(plot_learning_curves(path, tmp_path / f"{path.stem}.png"))
              for path in (plain, banded)]
    assert images[0].shape == images[1].shape
    assert (images[0] != images[1]).any(axis=-1).mean() > 0.01  # the band is drawn


def test_validation_panel_draws_random_and_oracle_reference_lines(tmp_path):
    import matplotlib.image

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "val/sokoban/success": 0.5}) + "\n"
                            for s in (0, 4, 8)))
    bare = matplotlib.image.imread(plot_learning_curves(path, tmp_path / "bare.png"))
    lined = matplotlib.image.imread(plot_learning_curves(
        path, tmp_path / "lined.png", references={"sokoban": {"random": 0.18, "oracle": 1.0}}))
    changed_rows = (bare != lined).any(axis=-1).any(axis=-1)
    assert changed_rows.mean() > 0.02  # lines across the panel at other heights than 0.5


def test_references_are_played_on_the_validation_seeds_once_per_run(tmp_path):
    from agentrl.trainers.plots import REFERENCES_FILE, reference_success

    first = reference_success(tmp_path, ["tightSokobanAgent"], groups=8)
    assert first["tightSokobanAgent"]["oracle"] == 1.0
    assert 0.0 <= first["tightSokobanAgent"]["random"] < 1.0
    stored = json.loads((tmp_path / REFERENCES_FILE).read_text())
    stored["presets"]["tightSokobanAgent"]["random"] = 0.123  # a resumed run reads the file
    (tmp_path / REFERENCES_FILE).write_text(json.dumps(stored))
    assert reference_success(tmp_path, ["tightSokobanAgent"], groups=8)[
        "tightSokobanAgent"]["random"] == 0.123
    assert reference_success(tmp_path, ["tightSokobanAgent"], groups=4)[
        "tightSokobanAgent"]["random"] != 0.123  # other seeds: played again
