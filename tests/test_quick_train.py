"""quick_train.sh end to end with the tiny model: positional arguments, outputs, reload."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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


@pytest.fixture
def checkout_without_setup(tmp_path):
    """quick_train.sh and its helpers in a folder whose env_setup.sh only leaves a mark, so a
    test sees whether set-up ran (and never waits for the real one)."""
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    for name in ("quick_train.sh", "scripts/positional_args.sh"):
        (root / name).write_text((ROOT / name).read_text())
    (root / "configs").symlink_to(ROOT / "configs")
    (root / "env_setup.sh").write_text('touch "$PWD/setup-ran"\n')
    return root


def run_script(root: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(root / "quick_train.sh"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args, message", [
    (["0", "1", "1", "1", "1", "[a]", "[b]", "1", "p", "e", "tiny", "1", "0", "extra"],
     "too many arguments: 'extra' is argument 14"),
    (["0", "two"], "GROUP_NUM must be a whole number"),
    (["--gpus", "2"], "unknown option '--gpus'"),
])
def test_bad_arguments_stop_before_set_up(checkout_without_setup, tmp_path, args, message):
    done = run_script(checkout_without_setup, *args, cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (checkout_without_setup / "setup-ran").exists()


def test_help_prints_the_header_and_runs_nothing(checkout_without_setup, tmp_path):
    done = run_script(checkout_without_setup, "0", "--help", cwd=tmp_path)
    assert done.returncode == 0 and "Positional arguments" in done.stdout
    assert not (checkout_without_setup / "setup-ran").exists()


def test_a_cpu_dry_run_previews_the_local_run_in_the_callers_folder(checkout_without_setup,
                                                                       tmp_path):
    caller = tmp_path / "caller"
    caller.mkdir()
    done = run_script(checkout_without_setup, "--dry-run", "0", "4", "4", "32", "1",
                      "[simpleSokobanAgent]", "[largeSokobanAgent]", "1", "agentrl", "sokoban",
                      "tiny", "20", "0", "run_dir=here", cwd=caller)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (checkout_without_setup / "setup-ran").exists()  # in the checkout, not the caller's
    printed = yaml.safe_load(done.stdout)
    assert printed["backend"] == "local" and printed["run_dir"] == str(caller / "here")
    assert printed["train"]["group_num"] == 4 and printed["val"]["group_num"] == 32
