"""The learning-curve picture explains the run: what each panel shows is read back from the
matplotlib Figure the PNG is drawn from (titles, axis labels, lines, marks), and from the
report's chart list (the same panels in the HTML page)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from agentrl.trainers import plots

PRESET = "tightBlocksworldTurnsAgent"
RUN_ID = "quick-20261128-000000-abcd"
SFT_STEPS = 1


def short_run(run_dir: Path) -> Path:
    """A 3-step local run: a validation before training, 1 warm-start (SFT) step, 2 PPO steps;
    the KL to the rollout policy 0 on every step (one pass), the critic's loss far above the
    actor's."""
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"run_id": RUN_ID, "experiment": "quick"}))
    config = {"backend": "local", "model": {"name": "tiny"},
              "train": {"presets": [PRESET], "sft_steps": SFT_STEPS},
              "val": {"presets": [PRESET], "group_num": 32}}
    checkpoint = run_dir / "checkpoints" / "step_000003"
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.yaml").write_text(yaml.safe_dump(config))
    records = [{"step": 0, f"val/{PRESET}/success": 0.25, f"val/{PRESET}/episodes": 32,
                f"val/{PRESET}/format_error": 0.0}]
    records.append({"step": 1, "sft/loss": 0.8, f"train/{PRESET}/success": 0.3,
                    f"val/{PRESET}/success": 0.5, f"val/{PRESET}/episodes": 32,
                    f"val/{PRESET}/format_error": 0.0})
    for step, (vf, ev) in zip((2, 3), ((31.0, -0.2), (12.0, 0.35))):
        records.append({"step": step, f"train/{PRESET}/success": 0.4 + 0.1 * step,
                        "actor/pg_loss": 0.01 * step, "critic/vf_loss": vf,
                        "critic/vf_explained_var": ev, "actor/pg_clipfrac": 0.0,
                        "actor/ppo_kl": 0.0, "actor/approx_kl": 0.002 * step,
                        "actor/entropy": 0.4 - 0.05 * step,
                        f"val/{PRESET}/success": 0.5 + 0.1 * step,
                        f"val/{PRESET}/episodes": 32, f"val/{PRESET}/format_error": 0.0})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


@pytest.fixture
def figure(tmp_path, monkeypatch):
    """The Figure ``plot_learning_curves`` writes for :func:`short_run`, as the trainer calls
    it (no title given: the run folder tells it)."""
    run_dir = short_run(tmp_path / "run")
    drawn = []
    save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append(fig) or save(fig, path))
    png = plots.plot_learning_curves(run_dir / "metrics.jsonl", run_dir / "learning_curves.png",
                                     references={PRESET: {"random": 0.2, "oracle": 1.0}})
    assert png.read_bytes().startswith(b"\x89PNG")
    return drawn[0]


def panels(figure) -> dict[str, object]:
    return {axes.get_title(): axes for axes in figure.axes}


def labels(axes) -> list[str]:
    return [line.get_label() for line in axes.get_lines()]


def test_the_title_names_run_model_preset_and_engine(figure):
    title = figure._suptitle.get_text()
    for part in (RUN_ID, "tiny", PRESET, "local"):
        assert part in title, title


def test_held_out_success_has_its_interval_and_the_random_and_oracle_lines(figure):
    axes = next(a for title, a in panels(figure).items() if title.startswith("held-out success"))
    assert "32 games" in axes.get_title() and "95%" in axes.get_title()
    names = labels(axes)
    assert PRESET in names
    assert any("random" in n for n in names) and any("oracle" in n for n in names)
    assert axes.collections, "no interval band"
    assert axes.get_ylim()[0] >= -0.05 and axes.get_ylim()[1] <= 1.05
    assert "success" in axes.get_ylabel()


def test_health_panels_each_on_their_own_axes_and_no_all_zero_kl(figure):
    by_title = panels(figure)
    expected = {"critic explained variance": "critic/vf_explained_var",
                "clip fraction": "actor/pg_clipfrac", "KL": "actor/approx_kl",
                "entropy per choice": "actor/entropy", "value loss": "critic/vf_loss",
                "policy loss": "actor/pg_loss", "SFT loss": "sft/loss"}
    for title, key in expected.items():
        assert title in by_title, sorted(by_title)
        assert key in labels(by_title[title]), (title, labels(by_title[title]))
    for axes in figure.axes:  # vf_loss (12-31) never shares a scale with pg_loss or sft/loss
        names = labels(axes)
        assert not ("critic/vf_loss" in names and ({"actor/pg_loss", "sft/loss"} & set(names)))
        assert "actor/ppo_kl" not in names  # 0 on every step: no line, no panel
    assert "actor/ppo_kl" in figure._supxlabel.get_text()  # said, though: 0 at every step
    clip = by_title["clip fraction"]
    assert clip.get_ylim()[0] == 0 and clip.get_ylim()[1] >= 0.05  # a flat 0 rate sits at 0


def test_the_warm_start_is_marked_on_every_panel_and_steps_are_integers(figure):
    for axes in figure.axes:
        marks = [line for line in axes.get_lines() if "warm start" in line.get_label()]
        assert marks, axes.get_title()
        assert list(marks[0].get_xdata()) == [SFT_STEPS + 0.5] * 2
        ticks = axes.get_xticks()
        assert all(float(t).is_integer() for t in ticks), (axes.get_title(), ticks)
        assert axes.get_xlabel() == "step"
    legend = panels(figure)
    assert any("train.sft_steps=1" in line.get_label()
               for axes in legend.values() for line in axes.get_lines())


def test_the_report_draws_the_same_panels_with_honest_ranges(tmp_path):
    from agentrl.report.data import run_data

    data = run_data(short_run(tmp_path / "run"), play_references=False)
    charts = {chart["title"]: chart for chart in data["charts"]}
    assert data["warm_start"] == SFT_STEPS
    for part in (RUN_ID, "tiny", PRESET, "local"):
        assert part in data["subtitle"], data["subtitle"]
    keys = {title: [line["key"] for line in chart["lines"]] for title, chart in charts.items()}
    for title in ("critic explained variance", "clip fraction", "KL", "entropy per choice",
                  "value loss", "policy loss", "SFT loss"):
        assert title in charts, sorted(charts)
    assert keys["value loss"] == ["critic/vf_loss"] and keys["KL"] == ["actor/approx_kl"]
    assert not any("actor/ppo_kl" in k for k in keys.values())  # 0 on every step
    assert charts["format error"]["y"] == [0, 1]  # a flat 0 rate, not -1..1
    assert charts["clip fraction"]["y"][0] == 0
    success = charts[f"success: {PRESET}"]
    assert success["y"] == [0, 1] and {"train", "val"} <= {line["split"] for line in
                                                           success["lines"]}
    assert all(chart["ylabel"] for chart in charts.values())


NODE_DOM = """
class N { constructor(tag) { Object.assign(this, {tag, attrs: {}, children: [], style: {},
  textContent: ""}); }
  setAttribute(k, v) { this.attrs[k] = v; } append(...c) { this.children.push(...c); }
  replaceChildren(...c) { this.children = c; } addEventListener() {} click() {} }
const nodes = {};
Object.assign(global, {Node: N, location: {hash: ""}, history: {replaceState() {}},
  performance: {now: () => 1}, document: {body: new N("body"), title: "",
  createElement: t => new N(t), createElementNS: (n, t) => new N(t),
  createTextNode: t => Object.assign(new N("#text"), {textContent: t}),
  getElementById: id => nodes[id] || (nodes[id] = Object.assign(new N("div"),
    {textContent: id === "data" ? DATA_TEXT : ""}))}});
"""
NODE_WALK = """
const charts = [];
(function walk(n, chart) {
  if (n.attrs && n.attrs["data-title"]) charts.push(chart = {title: n.attrs["data-title"], texts: []});
  if (chart && n.tag === "text") chart.texts.push(n.textContent);
  if (chart && n.attrs && n.attrs.class === "warm-start") chart.warm = true;
  (n.children || []).forEach(c => walk(c, chart));
})(nodes["curves"]);
console.log(JSON.stringify(charts));
"""


@pytest.mark.skipif(__import__("shutil").which("node") is None, reason="needs node")
def test_the_page_script_draws_each_chart_on_its_range(tmp_path):
    """The page's own script, run by node on a stub DOM: the y-axis ends it writes."""
    import re
    import subprocess

    from agentrl.report import write_report

    html = write_report(short_run(tmp_path / "run"), play_references=False).read_text()
    data = re.search(r'<script type="application/json" id="data">(.*?)</script>', html,
                     re.S).group(1)
    code = html.rsplit("<script>", 1)[1].split("</script>")[0]
    script = tmp_path / "page.js"
    script.write_text(f"const DATA_TEXT = {json.dumps(data)};\n{NODE_DOM}\n"
                      f"{code.replace(chr(34) + 'use strict' + chr(34) + ';', '')}\n{NODE_WALK}")
    done = subprocess.run(["node", str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    drawn = {chart["title"]: chart for chart in json.loads(done.stdout)}
    # the axis texts: y low, y high, x low, x high, "step"
    assert drawn["format error"]["texts"][:2] == ["0", "1"]  # a flat 0 rate: 0..1, not -1..1
    assert drawn["clip fraction"]["texts"][0] == "0"
    assert all(chart["texts"][2:5] == ["0", "3", "step"] for chart in drawn.values())
    assert all(chart.get("warm") for chart in drawn.values())  # the warm start on each
