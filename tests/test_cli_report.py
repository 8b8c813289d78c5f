"""`agentrl report` of what `agentrl sft` writes: its output folder, or a run folder holding
only the warm start, gives a page of the warm start (held-out success before and after, the
loss, the settings)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from agentrl import cli


def _evaluation(label: str, success: float) -> dict:
    row = {"episodes": 2, "success": success, "return": success, "turns": 1.0,
           "action_is_valid": 1.0, "format_error": 1.0 - success, "response_length": 5.0,
           "success_ci95": [0.0, 1.0]}
    return {"policy": label, "split": "val", "seeds": [1_000_000, 1_000_001], "group_size": 1,
            "presets": {"banditAgent": row}}


def _sft_folder(run_dir: Path) -> Path:
    """An `agentrl sft` output folder as the trainer leaves it (`<run_dir>/sft`)."""
    from agentrl.config import compose_config

    folder = run_dir / "sft"
    checkpoint = folder / "checkpoints" / "step_000004"
    checkpoint.mkdir(parents=True)
    config = compose_config(["model=tiny", "sft.presets=[banditAgent]",
                             "val.presets=[banditAgent]", "val.group_num=2"]).to_dict()
    (checkpoint / "config.yaml").write_text(yaml.safe_dump(config))
    (folder / "sft_summary.json").write_text(json.dumps({
        "checkpoint": str(checkpoint), "demonstrations": 8, "tokens_per_epoch": 40,
        "updates": 4, "seconds": {"train": 2.0}, "first_loss": 2.5, "last_loss": 0.75,
        "before": _evaluation("before SFT", 0.5), "after": _evaluation("after SFT", 1.0)}))
    return folder


def _page_data(html: str) -> dict:
    found = re.search(r'<script type="application/json" id="data">(.*?)</script>', html, re.S)
    return json.loads(found.group(1).replace("<\\/", "</"))


@pytest.mark.parametrize("which", ["sft folder", "run folder", "summary"])
def test_the_report_of_an_sft_output_shows_the_warm_start(tmp_path, capsys, which):
    folder = _sft_folder(tmp_path / "run")
    source = {"sft folder": folder, "run folder": folder.parent,
              "summary": folder / "sft_summary.json"}[which]
    assert cli.main(["report", str(source), "--no-play-references"]) == 0
    page = (folder.parent if which == "run folder" else folder) / "report.html"
    assert f"wrote {page}" in capsys.readouterr().out
    data = _page_data(page.read_text())
    assert data["title"].startswith("agentrl sft")
    success = data["series"]["val/banditAgent/success"]
    assert success == [[0, 0.5], [4, 1.0]]  # before the first update and after the last
    assert data["series"]["sft/loss"] == [[1, 2.5], [4, 0.75]]
    titles = [chart["title"] for chart in data["charts"]]
    assert "success: banditAgent" in titles and "SFT loss" in titles
    row = data["table"][0]
    assert row["preset"] == "banditAgent" and row["val_success"] == 1.0
    summary = dict(map(tuple, data["config"]["summary"]))
    assert summary["held-out success before -> after"] == "banditAgent 50.0% -> 100.0%"
    assert summary["demonstrations"] == "8" and summary["model.name"] == "tiny"


def test_the_report_of_an_sft_output_plays_the_reference_lines(tmp_path, capsys):
    folder = _sft_folder(tmp_path / "run")
    assert cli.main(["report", str(folder)]) == 0
    data = _page_data((folder / "report.html").read_text())
    assert set(data["references"]["banditAgent"]) == {"random", "oracle"}
    assert data["table"][0]["oracle"] == 1.0


def test_a_summary_with_every_updates_loss_draws_the_whole_curve(tmp_path):
    folder = _sft_folder(tmp_path / "run")
    summary = json.loads((folder / "sft_summary.json").read_text())
    summary["losses"] = [2.5, 1.5, 1.0, 0.75]
    (folder / "sft_summary.json").write_text(json.dumps(summary))
    assert cli.main(["report", str(folder), "--no-play-references"]) == 0
    data = _page_data((folder / "report.html").read_text())
    assert data["series"]["sft/loss"] == [[1, 2.5], [2, 1.5], [3, 1.0], [4, 0.75]]
