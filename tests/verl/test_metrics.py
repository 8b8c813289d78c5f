"""Our metrics on verl (``agentrl.verl.metrics``): padding copies left out, resumed steps logged
once, WandB fed into verl's step. The manager's end-to-end test is in test_agent_loop.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from agentrl.rollout import EpisodeOutcome
from agentrl.trainers.tracking import read_metrics
from agentrl.verl import child_run
from agentrl.verl.metrics import EpisodeMetricsLog, batch_metrics, episode_outcomes

ROOT = Path(__file__).resolve().parents[2]


def info(preset: str, seed: int, success: bool, index: int | None, **metrics) -> dict:
    outcome = EpisodeOutcome(preset, seed, success, 1.0 if success else -1.0, 2,
                             {"format_errors": 0.0, **metrics}, {"generate_s": 0.5})
    return {**outcome.to_dict(), "index": index}


def test_episodes_past_n_per_row_are_padding_copies():
    a, b = info("p", 1, True, 0), info("p", 2, False, 1)
    a2 = info("p", 1, False, 0)  # the second sample of row 0
    outcomes = episode_outcomes([a, a2, b, None, b, a, a2], per_row=2)  # None: another loop
    assert [(o.seed, o.success) for o in outcomes] == [(1, True), (1, False), (2, False),
                                                       (2, False)]
    # rows without an index are told apart by preset and seed
    unindexed = [info("p", 1, True, None), info("q", 1, True, None), info("p", 1, True, None)]
    assert [o.preset for o in episode_outcomes(unindexed, per_row=1)] == ["p", "q"]
    with pytest.raises(ValueError, match="per_row=0"):
        episode_outcomes([a], per_row=0)


def test_a_bad_outcome_names_what_is_wrong():
    record = info("p", 1, True, 0)
    del record["num_turns"]
    with pytest.raises(ValueError, match="lacks.*num_turns"):
        episode_outcomes([record], per_row=1)
    with pytest.raises(ValueError, match="not a number"):
        episode_outcomes([{**info("p", 1, True, 0), "episode_return": float("nan")}], per_row=1)


def test_batch_metrics_use_the_local_names_and_leave_timings_out_of_validation():
    outcomes = episode_outcomes([info("p", 1, True, 0), info("p", 2, False, 1)], per_row=1)
    train = batch_metrics(outcomes, "train")
    assert train["train/p/success"] == 0.5 and train["timing/generate_s"] == 0.5
    val = batch_metrics(outcomes, "val")
    assert val["val/p/success"] == 0.5 and not any(k.startswith("timing/") for k in val)
    with pytest.raises(ValueError, match="allowed: train, val"):
        batch_metrics(outcomes, "test")


def test_a_resumed_run_replaces_the_steps_it_redoes(tmp_path):
    path = tmp_path / "metrics.jsonl"
    old = [{"step": s, "time": 0, "train/p/success": 0.1} for s in (1, 2, 3)]
    old += [{"step": s, "time": 0, "val/p/success": 0.2} for s in (0, 2)]
    path.write_text("".join(json.dumps(r) + "\n" for r in old))
    log = EpisodeMetricsLog(tmp_path, use_wandb=False, console=False)
    # resumed from the step-2 checkpoint: validation before training runs at step 2
    log.log(2, "val", {"val/p/success": 0.9})
    log.log(3, "train", {"train/p/success": 0.8})
    log.log(3, "val", {"val/p/success": 1.0})  # later records of a split append
    records = [(r["step"], next(k for k in r if "/" in k), r[next(k for k in r if "/" in k)])
               for r in read_metrics(path)]
    assert records == [(1, "train/p/success", 0.1), (2, "train/p/success", 0.1),
                       (0, "val/p/success", 0.2), (2, "val/p/success", 0.9),
                       (3, "train/p/success", 0.8), (3, "val/p/success", 1.0)]


def test_wandb_gets_the_metrics_in_verls_step_uncommitted(tmp_path, monkeypatch):
    calls = []
    run = SimpleNamespace(log=lambda values, **kwargs: calls.append((values, kwargs)))
    monkeypatch.setitem(sys.modules, "wandb", SimpleNamespace(run=run))
    log = EpisodeMetricsLog(tmp_path, use_wandb=True, console=False)
    log.log(4, "train", {"train/p/success": 0.5, "train/p/return": float("inf")})
    assert calls == [({"train/p/success": 0.5}, {"step": 4, "commit": False})]  # inf dropped
    monkeypatch.setitem(sys.modules, "wandb", SimpleNamespace(run=None))  # no run: nothing
    log.log(5, "train", {"train/p/success": 0.5})
    assert len(calls) == 1


def test_log_batch_reads_step_and_split_from_verls_meta_info(tmp_path, capsys):
    config = OmegaConf.create({"trainer": {"default_local_dir": str(tmp_path / "ckpt"),
                                           "logger": ["console"]}})
    log = EpisodeMetricsLog.for_verl(config)
    assert log.path == tmp_path / "metrics.jsonl" and log.console and not log.use_wandb
    infos = [info("p", 1, True, 0), info("p", 1, False, 0)]  # the second: a padding copy
    logged = log.log_batch(infos, {"global_steps": 7, "validate": True}, per_row=1)
    assert logged["val/p/success"] == 1.0 and logged["val/p/return"] == 1.0
    assert log.log_batch(infos, {"validate": True}, per_row=1) == {}  # no step: not logged
    assert log.log_batch(None, {"global_steps": 8}, per_row=1) == {}  # no episodes of ours
    (record,) = read_metrics(log.path)
    assert record["step"] == 7 and record["val/p/success"] == 1.0
    assert "agentrl val step 7 | val p 1" in capsys.readouterr().out


def test_a_training_batch_reports_its_uniform_groups_as_the_local_engine_does(tmp_path):
    """A task row's episodes are its agent group: row 0 all won alike, row 1 all lost alike,
    row 2 split; validation compares nothing and reports none."""
    log = EpisodeMetricsLog(tmp_path, use_wandb=False, console=False)
    infos = [info("p", 1, True, 0), info("p", 1, True, 0), info("p", 2, False, 1),
             info("p", 2, False, 1), info("p", 3, True, 2), info("p", 3, False, 2),
             info("p", 1, False, 0)]  # the last: a padding copy past the row's 2
    logged = log.log_batch(infos, {"global_steps": 3}, per_row=2)
    assert logged["train/uniform_groups"] == pytest.approx(2 / 3)
    assert logged["train/uniform_groups_won"] == pytest.approx(1 / 3)
    val = log.log_batch(infos, {"global_steps": 3, "validate": True}, per_row=2)
    assert not any("uniform" in key for key in val)


def verl_line(step: int, **data) -> str:
    """One line of verl's ``file`` logger (``verl.utils.tracking.FileLogger``)."""
    return json.dumps({"step": step, "data": data}) + "\n"


def test_verls_own_metrics_reach_the_metrics_file_under_verls_names(tmp_path):
    """verl's log of a step (its losses, explained variance, timings) is copied into
    metrics.jsonl before the next batch is logged; strings and NaN left out, a half-written
    line left for later."""
    from agentrl.verl.metrics import record_kind, verl_log_path

    verl_log = verl_log_path(tmp_path)
    verl_log.parent.mkdir(parents=True)
    verl_log.write_text(verl_line(0, **{"val-core/p/reward/mean@1": 0.5})
                        + verl_line(1, **{"training/global_step": 1, "actor/pg_loss": -0.25,
                                          "critic/vf_explained_var": 0.1, "note": "x",
                                          "actor/kl": float("nan")})
                        + '{"step": 2, "da')
    log = EpisodeMetricsLog(tmp_path, use_wandb=False, console=False, verl_log=verl_log)
    log.log_batch([info("p", 1, True, 0)], {"global_steps": 2}, per_row=1)
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["step"], record_kind(r)) for r in records] == [(0, "verl-val"), (1, "verl"),
                                                               (2, "train")]
    assert records[1]["actor/pg_loss"] == -0.25 and records[1]["critic/vf_explained_var"] == 0.1
    assert "note" not in records[1] and "actor/kl" not in records[1]
    with verl_log.open("a") as file:  # the rest of the line, and step 2's own
        file.write('ta": {"training/global_step": 2, "actor/pg_loss": 0.5}}\n')
    assert [r["step"] for r in log.follow_verl()] == [2]
    assert log.follow_verl() == []


def test_verls_metrics_of_a_resumed_run_replace_the_steps_it_redoes(tmp_path):
    from agentrl.verl.metrics import verl_log_path

    path = tmp_path / "metrics.jsonl"
    old = [{"step": 0, "time": 0, "val-core/p/reward/mean@1": 0.1}]
    old += [{"step": s, "time": 0, "training/global_step": s, "actor/pg_loss": 0.1}
            for s in (1, 2, 3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in old))
    verl_log = verl_log_path(tmp_path)
    verl_log.parent.mkdir(parents=True)
    # resumed from checkpoint 2: validation before training at step 2, then step 3 again
    verl_log.write_text(verl_line(2, **{"val-core/p/reward/mean@1": 0.9})
                        + verl_line(3, **{"training/global_step": 3, "actor/pg_loss": 0.7}))
    EpisodeMetricsLog(tmp_path, use_wandb=False, console=False, verl_log=verl_log).follow_verl()
    assert [(r["step"], r.get("actor/pg_loss"), r.get("val-core/p/reward/mean@1"))
            for r in read_metrics(path)] == [(0, None, 0.1), (1, 0.1, None), (2, 0.1, None),
                                             (2, None, 0.9), (3, 0.7, None)]


def test_the_launch_adds_what_verl_logged_last_and_removes_its_log(tmp_path):
    """After verl exits (or before a launch, what a killed one left): the records the metrics
    file lacks are added in step order, the ones it has are not repeated."""
    from agentrl.verl.metrics import ingest_verl_log, verl_log_path

    path = tmp_path / "metrics.jsonl"
    ours = [{"step": s, "time": 0, "train/p/success": 0.5} for s in (1, 2)]
    logged = {"step": 1, "time": 0, "training/global_step": 1, "actor/pg_loss": 0.1}
    path.write_text("".join(json.dumps(r) + "\n" for r in [ours[0], logged, ours[1]]))
    assert ingest_verl_log(tmp_path) == 0  # no verl log: nothing to do
    verl_log = verl_log_path(tmp_path)
    verl_log.parent.mkdir(parents=True)
    verl_log.write_text(verl_line(1, **{"training/global_step": 1, "actor/pg_loss": 0.1})
                        + verl_line(2, **{"training/global_step": 2, "actor/pg_loss": 0.2}))
    assert ingest_verl_log(tmp_path) == 1
    assert [(r["step"], r.get("actor/pg_loss")) for r in read_metrics(path)] == [
        (1, None), (1, 0.1), (2, None), (2, 0.2)]
    assert not verl_log.exists()


def test_for_verl_follows_verls_file_logger_when_it_is_on(tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "verl" / "tracking.jsonl"))
    config = OmegaConf.create({"trainer": {"default_local_dir": str(tmp_path / "ckpt"),
                                           "logger": ["console", "file"]}})
    assert EpisodeMetricsLog.for_verl(config).verl_log == tmp_path / "verl" / "tracking.jsonl"
    config.trainer.logger = ["console"]
    assert EpisodeMetricsLog.for_verl(config).verl_log is None


TEARDOWN_SCRIPT = """
import atexit, gc, sys
held = []
atexit.register(lambda: (held.clear(), gc.collect()))  # Ray's exit hook: the actor's garbage
from verl.utils.tracking import Tracking
from agentrl.verl.metrics import EpisodeMetricsLog

def fit():  # verl's legacy fit: its Tracking lives in the frame, here kept by a cycle
    tracking = Tracking("p", "e", default_backend=["console", "wandb"], config={"trainer": {}})
    cycle = [tracking]
    cycle.append(cycle)
    held.append(cycle)
    if sys.argv[1] != "verl":
        EpisodeMetricsLog(None, use_wandb=True, console=False).log(1, "train", {"train/p/x": 1})
    tracking.log({"actor/pg_loss": 0.5}, step=1)
    if sys.argv[1] == "fails":
        raise RuntimeError("the step failed")
    if sys.argv[2] == "v1":  # V1's TaskRunner finishes the run; its Ray actor's exit has
        tracking.finish()    # ended WandB's service by the time the exit hooks run
        from wandb.sdk import wandb_setup
        wandb_setup.singleton()._connection._proc._process.kill()

fit()
"""


def test_a_run_whose_tracking_outlives_wandb_ends_without_a_traceback(tmp_path):
    """verl's Tracking finishes WandB's run only when collected; collected after WandB's own
    exit hook (as in a Ray actor), its ``wandb.finish`` fails on the closed service; under V1
    (the run finished, the actor's WandB service gone at exit) WandB's own exit hook fails:
    a successful run ends on a traceback either way. Once our metrics reached the run, it is
    finished and WandB shut down at exit first: no traceback; a failing run prints its own."""
    script = tmp_path / "run.py"
    script.write_text(TEARDOWN_SCRIPT)
    env = {**child_run.child_env(), "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path),
           "WANDB_SILENT": "true", "PYTHONPATH": str(ROOT)}  # its own WandB service, as verl's

    def run(mode: str, trainer: str = "legacy") -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(script), mode, trainer], capture_output=True,
                              text=True, env=env, cwd=tmp_path, timeout=300)

    verl_alone = run("verl")  # the defect (V1's, WandB's hook on a gone service, is a race)
    assert verl_alone.returncode == 0 and "Tracking.__del__" in verl_alone.stderr
    for trainer in ("legacy", "v1"):
        ours = run("ours", trainer)
        assert ours.returncode == 0, ours.stderr[-3000:]
        assert "Traceback" not in ours.stderr and "Exception ignored" not in ours.stderr, \
            ours.stderr[-3000:]
    failed = run("fails")
    assert failed.returncode == 1 and "RuntimeError: the step failed" in failed.stderr
    assert "Exception ignored" not in failed.stderr, failed.stderr[-3000:]


def test_agentrl_report_reads_a_verl_run_folder_like_a_local_one(tmp_path):
    """The folder as a verl run writes it (our records, verl's copied from its file logger,
    the last step's added by the launch, episodes) gives the report the local engine's
    curves: per-preset training and held-out success, and the trainer's health panels."""
    from agentrl.report.data import run_data
    from agentrl.verl.episodes import VerlEpisodeLog
    from agentrl.verl.metrics import ingest_verl_log, verl_log_path

    verl_log = verl_log_path(tmp_path)
    verl_log.parent.mkdir(parents=True)
    metrics = EpisodeMetricsLog(tmp_path, use_wandb=False, console=False, verl_log=verl_log)
    episodes = VerlEpisodeLog(tmp_path, 2, use_wandb=False, console=False)
    turn = {"observation": "o", "reply": "r", "actions": ["a"], "reward": 1.0,
            "format_error": False, "cut_by_length": False, "dropped_context": False}
    for step in (1, 2):
        infos = [info("p", 1, step == 2, 0), info("p", 2, True, 1)]
        records = [{"split": "", "preset": "p", "seed": seed, "success": True, "return": 1.0,
                    "num_turns": 1, "turns_left_out": 0, "turns": [turn]} for seed in (1, 2)]
        for validate in (False, True):
            meta = {"global_steps": step, "validate": validate}
            metrics.log_batch(infos, meta, per_row=1)
            episodes.log_batch(records, infos, meta, per_row=1)
        with verl_log.open("a") as file:  # verl's log of the step, after our batches
            file.write(verl_line(step, **{"training/global_step": step, "actor/pg_loss": 0.1,
                                          "critic/vf_explained_var": 0.2 * step,
                                          "timing_s/step": 9.0}))
    ingest_verl_log(tmp_path)  # the launch, once verl has exited
    data = run_data(tmp_path, play_references=False)
    series = data["series"]
    for key in ("train/p/success", "val/p/success", "actor/pg_loss",
                "critic/vf_explained_var", "timing_s/step"):
        assert [step for step, _ in series[key]] == [1, 2], key
    assert series["train/p/success"] == [[1, 0.5], [2, 1]]
    assert data["presets"] == ["p"] and sorted(data["episodes"]) == ["1", "2"]
    assert {r["split"] for r in data["episodes"]["2"]} == {"train", "val"}


def test_verls_tracking_is_finished_right_after_it_logs_the_last_step(tmp_path, monkeypatch):
    """The legacy trainer's Tracking, finished when it logs the run's last step (its
    ``__del__`` then does nothing), not when the TaskRunner's actor is torn down."""
    from verl.utils.tracking import FileLogger, Tracking

    from agentrl.verl.metrics import finish_tracking_after

    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "tracking.jsonl"))
    monkeypatch.setattr(Tracking, "log", Tracking.log)  # the class as it was, after the test
    finished = []
    monkeypatch.setattr(FileLogger, "finish", lambda self: finished.append(True))
    finish_tracking_after(3)
    finish_tracking_after(2)  # called again (a second manager): one wrapper, the last bound
    tracking = Tracking("p", "e", default_backend=["file"], config={})
    tracking.log({"actor/pg_loss": 0.5}, step=1)
    assert not getattr(tracking, "_finished", False) and finished == []
    tracking.log({"actor/pg_loss": 0.4}, step=2)
    assert tracking._finished and finished == [True]
    tracking.__del__()  # collected later: nothing more
    assert finished == [True]
    logged = [json.loads(line)["step"] for line in (tmp_path / "tracking.jsonl").open()]
    assert logged == [1, 2]
