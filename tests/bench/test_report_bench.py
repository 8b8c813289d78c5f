"""scripts/bench/report.py on a short synthetic run: the page holds a bounded sample of the
episode files and (with Chromium) draws its curves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from agentrl.report.browser import chromium

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "report.py"
ROOT = SCRIPT.parents[2]


def test_report_bench_measures_a_bounded_page(tmp_path):
    out = tmp_path / "report.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--steps", "60", "--max-episode-steps",
                          "10", "--out", str(out)], capture_output=True, text=True, timeout=300,
                         check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["steps"] == 60 and result["page_bytes"] < result["episode_files_bytes"]
    if chromium():
        assert result["polylines"] > 10 and result["page_load_ms"] is not None
