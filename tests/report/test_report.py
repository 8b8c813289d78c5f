"""`agentrl report`: one self-contained HTML page, checked in headless Chromium: curves drawn,
one table row per preset, an episode's turns shown after a scripted click, the same held-out
game at two steps side by side; also for an `agentrl eval --out` file."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.report import render_page, write_report
from agentrl.report.browser import chromium, dump_dom, screenshot
from agentrl.report.data import spread
from agentrl.trainers.episode_log import EpisodeLog

PRESETS = ("simpleSokobanAgent", "tetrisType1Agent")
SEEDS = (1_000_000, 1_000_001)
ATTACK = "</script><script>document.title='pwned'</script><img src=x onerror=alert(1)>"

needs_chromium = pytest.mark.skipif(
    chromium() is None, reason="Chromium not found: `apt-get install -y chromium` "
                               "(scripts/test.sh installs it where it can)")


def board(step: int, turn: int) -> str:
    return f"Room:\n#####\n#_P_#\n#X_O#\n##### step{step}-turn{turn}"


def record(step: int, split: str, preset: str, seed: int, turns: int = 3) -> dict:
    return {"step": step, "split": split, "preset": preset, "seed": seed,
            "success": step > 1, "return": 0.1 * step, "num_turns": turns, "turns_left_out": 0,
            "turns": [{"observation": board(step, t), "reply": f"<answer>Up</answer> s{step}t{t} "
                       + (ATTACK if t == 2 else ""),
                       "actions": [{"action": "Up", "valid": True},
                                   {"action": "Jump", "valid": False}],
                       "reward": -0.1, "format_error": t == 3, "cut_by_length": False,
                       "dropped_context": False} for t in range(1, turns + 1)]}


def synthetic_run(run_dir: Path, steps: int = 3) -> Path:
    """metrics.jsonl and episodes of a small run, in the trainers' formats."""
    run_dir.mkdir(parents=True)
    lines = []
    for step in range(steps + 1):
        metrics = {"step": step, "time": 0.0}
        for preset in PRESETS:
            metrics[f"val/{preset}/success"] = step / steps
            metrics[f"val/{preset}/return"] = step - 1.0
            if step:
                metrics[f"train/{preset}/success"] = 0.5 * step / steps
                metrics["actor/pg_loss"] = 0.1 / step
        lines.append(json.dumps(metrics))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (run_dir / "run.json").write_text(json.dumps({"run_id": "synthetic-run"}))
    log = EpisodeLog(run_dir)
    for step in range(steps + 1):
        log.write(step, [record(step, "val", p, s) for p in PRESETS for s in SEEDS]
                  + ([record(step, "train", PRESETS[0], 7)] if step else []))
    return run_dir


@pytest.fixture
def page(tmp_path):
    run_dir = synthetic_run(tmp_path / "run")
    reference = tmp_path / "random.json"
    reference.write_text(json.dumps({"policy": "random", "presets": {
        PRESETS[0]: {"success": 0.25, "return": -1.0}}}))
    return write_report(run_dir, reference_files=[reference], play_references=False)


def test_the_page_needs_no_network_and_model_text_cannot_escape_its_data(page):
    html = page.read_text()
    assert page.name == "report.html" and page.parent.name == "run"
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)  # nothing fetched
    assert html.count("</script>") == 2  # the data's and the code's: the reply's is escaped
    assert "document.title='pwned'" in html.replace("<\\/", "</")  # still there, as text


@needs_chromium
def test_chromium_draws_curves_table_and_an_episode_after_a_click(page, tmp_path):
    # pick step 3, val, Tetris, the second seed, compare with step 1; then click 'turn >'
    fragment = (f"step=3&split=val&preset={PRESETS[1]}&seed={SEEDS[1]}&turn=1&compare=1"
                "&click=next")
    dom = dump_dom(page, fragment)
    assert 'data-ready="1"' in dom, dom[-2000:]
    curves = dom[dom.index('id="curves"'):dom.index('id="table-section"')]
    drawn = re.findall(r'<polyline[^>]*class="line"[^>]*points="([^"]+)"', curves)
    assert len(drawn) >= len(PRESETS) * 2 + 1  # train + val success per preset, pg_loss, ...
    assert all(len(points.split()) >= 3 for points in drawn)
    assert 'class="reference"' in curves  # the random line from the reference file
    assert dom.count('class="preset-row"') == len(PRESETS)
    assert ">25.0<" in dom  # random success of the first preset, in the table

    pane_a = dom[dom.index('id="pane-a"'):dom.index('id="pane-b"')]
    pane_b = dom[dom.index('id="pane-b"'):]
    assert "turn 2 of 3" in pane_a  # the click moved from turn 1 to turn 2
    assert f"seed {SEEDS[1]}" in pane_a and PRESETS[1] in pane_a and "step3-turn2" in pane_a
    assert "step1-turn2" in pane_b and "step 1 · val" in pane_b  # the same game at step 1
    assert 'class="action invalid">Jump' in pane_a and 'class="action valid">Up' in pane_a
    assert "&lt;/script&gt;&lt;script&gt;document.title='pwned'" in pane_a  # shown, not run
    assert "<title>agentrl run synthetic-run</title>" in dom  # not 'pwned'

    shot = screenshot(page, tmp_path / "report.png", fragment)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


@needs_chromium
def test_an_eval_file_gets_a_page_with_its_episodes(tmp_path):
    out = tmp_path / "oracle.json"
    done = subprocess.run([sys.executable, "-m", "agentrl.cli", "eval", "--policy", "oracle",
                           "--presets", "simpleSokobanAgent", "--groups", "2", "--no-progress",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    episodes = json.loads(out.read_text())["episodes"]
    assert len(episodes) == 2 and all(e["success"] and e["turns"] for e in episodes)
    made = subprocess.run([sys.executable, "-m", "agentrl.cli", "report", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    dom = dump_dom(out.with_suffix(".html"))
    assert dom.count('class="preset-row"') == 1 and "100.0" in dom
    pane = dom[dom.index('id="pane-a"'):dom.index('id="pane-b"')]
    assert "SOLVED" in pane and "turn 1 of" in pane and 'class="action valid"' in pane


def test_a_folder_that_is_no_run_is_named(tmp_path):
    with pytest.raises(ValueError, match="not a run folder"):
        write_report(tmp_path)


def test_episode_steps_are_spread_with_the_first_and_the_last():
    assert spread(list(range(1001)), 5) == [0, 250, 500, 750, 1000]
    assert spread([3, 1, 2], 10) == [1, 2, 3]
    assert render_page({"x": "</script>"}).count("</script>") == 2


def test_reference_lines_are_the_oracle_and_random_on_the_validation_seeds(tmp_path):
    from agentrl.report.data import run_data

    data = run_data(synthetic_run(tmp_path / "run"), play_references=True)
    for preset in PRESETS:
        oracle, random = (data["references"][preset][p]["success"] for p in ("oracle", "random"))
        assert oracle == 1.0 and 0.0 <= random <= 1.0
    assert data["references"][PRESETS[0]]["random"]["success"] < 1.0  # Sokoban: random fails
    row = data["table"][0]
    assert row["oracle"] == 1.0 and row["val_success"] == 1.0 and row["best_step"] == 3


def test_the_summary_names_the_best_checkpoint_the_run_folder_stands_for(tmp_path):
    from agentrl.report.data import run_data
    from agentrl.trainers.checkpoint import BestRecord, save_checkpoint, write_best

    run_dir = synthetic_run(tmp_path / "run")
    rows = dict(run_data(run_dir, play_references=False)["config"]["summary"])
    assert rows["best checkpoint"] == "none recorded (the run folder stands for its newest)"
    save_checkpoint(run_dir, 2, config={"val": {"presets": list(PRESETS)}})
    write_best(run_dir, BestRecord(step=2, val_success=0.625))
    rows = dict(run_data(run_dir, play_references=False)["config"]["summary"])
    assert rows["best checkpoint"] == ("step 2, held-out success 62.5% (checkpoints/best.json; "
                                       "eval and play take it)")
    (run_dir / "checkpoints" / "best.json").write_text("{")
    rows = dict(run_data(run_dir, play_references=False)["config"]["summary"])
    assert rows["best checkpoint"].startswith("unreadable: ")
