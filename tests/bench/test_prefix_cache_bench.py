"""scripts/bench/prefix_cache.py on the tiny model: the cached run reads fewer tokens and plays
the same greedy episodes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "prefix_cache.py"


@pytest.mark.slow  # the bench in a subprocess; tests/engines/test_prefix_cache.py is quick
def test_cached_run_reads_fewer_tokens_and_plays_the_same_episodes(tmp_path):
    out = tmp_path / "prefix.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--model", "tiny", "--groups", "1",
                          "--group-size", "2", "--repeats", "1", "--max-new-tokens", "8",
                          "--threads", "1", "--out", str(out)],
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    off, on = result["rows"]["off"], result["rows"]["on"]
    assert off["prompt_tokens"] == on["prompt_tokens"] and off["turns"] == on["turns"] > 2
    assert on["prefill_tokens"] < off["prefill_tokens"] / 2
    assert off["prefill_tokens"] < off["prompt_tokens"]  # the group's twin prompts, read once
    assert result["episodes_differing"] == 0 and result["episodes"] == 2
    assert "speed-up" in run.stdout
