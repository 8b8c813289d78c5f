"""quick_train.sh end to end with the tiny model: positional arguments, outputs, reload."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def quick_train(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled"}
    return subprocess.run(["bash", str(ROOT / "quick_train.sh"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_quick_train_runs_and_its_checkpoint_loads(tmp_path):
    run_dir = tmp_path / "run"
    done = quick_train("0", "1", "2", "1", "1", "[banditAgent]", "[banditAgent]", "0", "agentrl",
                       "smoke", "tiny", "2", "1", f"run_dir={run_dir}", "rollout.max_new_tokens=8",
                       "sft.episodes=2", "threads=1", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    checkpoint = run_dir / "checkpoints" / "step_000003"  # 1 warm-start step, then 2 of PPO
    assert f"checkpoint: {checkpoint}" in done.stdout
    assert (run_dir / "metrics.jsonl").is_file() and (run_dir / "learning_curves.png").is_file()
    config = (checkpoint / "config.yaml").read_text()
    assert "group_size: 2" in config and "total_steps: 3" in config and "banditAgent" in config
    assert "sft_steps: 1" in config

    evaluated = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "eval", "--model", str(checkpoint), "--presets",
         "banditAgent", "--groups", "1", "--max-new-tokens", "8", "--out", str(tmp_path / "e.json")],
        capture_output=True, text=True, timeout=600)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert (tmp_path / "e.json").is_file()


def test_quick_train_rejects_a_bad_positional_argument(tmp_path):
    bad = quick_train("0", "two", cwd=tmp_path)
    assert bad.returncode == 2 and "GROUP_NUM must be a whole number" in bad.stderr
