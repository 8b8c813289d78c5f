"""examples/learn_gpu.sh, the learning benchmark at a peer's scale on one GPU, run on a CPU at a
tiny size: its positional arguments reach the benchmark, the peer-scale step (64 episodes)
is what it asks for, and a caller's overrides after them win."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_gpu_command_runs_the_benchmark_at_a_tiny_size(tmp_path):
    out = tmp_path / "learn_gpu.json"
    done = subprocess.run(
        ["bash", "examples/learn_gpu.sh", "1", "1", "1", "model=tiny", "device=cpu", "threads=1",
         "train.group_num=2", "train.group_size=2", "rollout.max_batch=4",
         "--val-groups", "2", "--sft-episodes", "4"],
        cwd=ROOT, env={**os.environ, "OUT": str(out)}, capture_output=True, text=True,
        timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["recipes"] == ["sft", "sft_ppo"] and result["seeds"] == 1
    assert result["steps"] == 1 and result["minutes"] == 1 and result["val_games"] == 2
    assert result["episodes_per_step"] == 4  # the caller's overrides win over the script's 64
    assert "device=cuda" in result["overrides"] and result["overrides"][-1] == "rollout.max_batch=4"
    assert out.with_suffix(".png").is_file()


def test_the_gpu_command_asks_for_a_peers_scale():
    """The defaults: >= 64 episodes a step, >= 100 steps, 128 held-out games, on CUDA."""
    script = (ROOT / "examples/learn_gpu.sh").read_text()
    assert "train.group_num=16 train.group_size=4" in script and "device=cuda" in script
    assert "STEPS=${2:-100}" in script and "--val-groups 128" in script
