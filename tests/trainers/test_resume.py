"""Interrupted runs: a run killed mid-step resumes from its newest checkpoint, and the metrics
history ends with every step exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.trainers.checkpoint import latest_checkpoint, list_checkpoints
from agentrl.trainers.tracking import read_metrics

STEPS = 3


BASE = {"model": "tiny", "train.total_steps": STEPS, "train.group_num": 1, "train.group_size": 2,
        "train.presets": "[banditAgent]", "val.presets": "[banditAgent]", "val.group_num": 1,
        "val.test_freq": 1, "rollout.max_new_tokens": 8, "threads": 1, "trainer.save_freq": 1,
        "trainer.keep_last": 5, "trainer.logger": "[]", "trainer.plot": "false"}


def train_command(run_dir: Path, **changes) -> list[str]:
    overrides = {**BASE, "run_dir": run_dir, **{k.replace("__", "."): v for k, v in changes.items()}}
    return [sys.executable, "-m", "agentrl.cli", "train", *(f"{k}={v}" for k, v in overrides.items())]


@pytest.mark.slow
def test_killed_mid_step_resumes_without_lost_or_repeated_steps(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "WANDB_MODE": "disabled"}
    first = subprocess.Popen(train_command(run_dir), env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while latest_checkpoint(run_dir) is None:  # step 1 saved: step 2 is under way
        assert first.poll() is None, f"the run ended early: {first.stderr.read()[-2000:]}"
        assert time.time() < deadline, "no checkpoint within 300 s"
        time.sleep(0.05)
    run_record = (run_dir / "run.json").read_text()
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert first.returncode == -signal.SIGKILL
    interrupted_at = [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")]
    assert interrupted_at and max(interrupted_at) < STEPS

    second = subprocess.run(train_command(run_dir), env=env, capture_output=True, text=True,
                            timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    steps = [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")]
    assert steps == list(range(0, STEPS + 1)), steps  # 0 = validation before training
    assert [int(p.name.split("_")[1]) for p in list_checkpoints(run_dir)] == list(range(1, STEPS + 1))
    assert (run_dir / "run.json").read_text() == run_record  # the same run id goes on
    assert "resumed from" in second.stderr


@pytest.mark.slow  # two training runs in subprocesses
def test_a_finished_run_is_not_trained_again(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "WANDB_MODE": "disabled"}
    command = train_command(run_dir, train__total_steps=1, val__before_train="false",
                            val__test_freq=0, rollout__max_new_tokens=4)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")] == [1]
