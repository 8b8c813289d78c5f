"""Bad inputs on the command line: each gets exit code 2 and one message naming what was wrong
and what is allowed, never a traceback, and before anything slow starts.

The commands run in-process through :func:`agentrl.cli.main` (argparse's ``error`` exits 2 with
``agentrl <command>: error: <message>`` on stderr); the files they read are made here.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from agentrl import cli


def _fixtures(root: Path) -> dict[str, str]:
    """Files and folders the bad inputs point at, by name (``{name}`` in the table)."""
    (root / "empty").mkdir()
    (root / "a_file").write_text("not a folder\n")
    (root / "not_json").write_text("{ this is not json\n")
    (root / "presets_list").write_text(json.dumps({"presets": ["a", "b"]}))
    (root / "presets_null").write_text(json.dumps({"presets": None}))
    (root / "no_presets").write_text(json.dumps({"policy": "random", "success": 0.5}))
    (root / "bad_yaml").write_text("simpleAgent: {game: Sokoban\n  - : [\n")
    run = root / "run_no_step"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"val/x/success": 0.5}) + "\n")
    run_ok = root / "run_ok"
    run_ok.mkdir()
    (run_ok / "metrics.jsonl").write_text(json.dumps({"step": 1, "val/x/success": 0.5}) + "\n")
    (root / "other_preset").write_text(json.dumps({"policy": "random", "presets": {
        "simpleSokobanAgent": {"success": 0.1}}}))
    sft_run = root / "sft_run" / "sft" / "checkpoints" / "step_000001"
    sft_run.mkdir(parents=True)  # a run folder whose only checkpoint has no marker: damaged
    (sft_run / "actor").mkdir()
    return {name: str(root / name) for name in
            ("empty", "a_file", "not_json", "presets_list", "presets_null",
             "no_presets", "bad_yaml", "run_no_step", "run_ok", "sft_run", "other_preset")} | {
        "missing": str(root / "missing")}


NO_VLLM = importlib.util.find_spec("vllm") is None
"""This Python lacks vLLM (the tests hide the venv of ``env_setup.sh --verl-cpu``)."""

# (command line, a fragment the message must hold)
CASES = [
    # agentrl eval
    ("eval --model {empty}", "--model"),
    ("eval --model {missing}", "--model"),
    ("eval --model {sft_run}", "no intact checkpoint"),
    ("eval --model {a_file}", "--model"),
    ("eval --out {empty} --policy random --presets banditAgent --groups 1", "--out"),
    ("eval --out {a_file}/x/y.json --policy random --presets banditAgent --groups 1",
     "--out"),
    ("eval --policy random --temperature -1", "--temperature"),
    ("eval --model tiny --device cuda", "--device cuda"),
    ("eval --model nosuch/model/x", "--model"),
    ("eval --policy random --compare enable_think=true --plot {a_file}/x.png", "--plot"),
    ("eval --policy random --temperature nan", "--temperature"),
    ("eval --presets nosuchAgent", "allowed"),
    ("eval --groups 0", "--groups"),
    ("eval --compare enable_think", "KEY=VALUE"),
    ("eval --policy random --groups 1 --seed -1", "--seed"),
    # agentrl play
    ("play sokoban --seed -5", "--seed"),
    ("play sokoban --oracle --delay -1", "--delay"),
    ("play sokoban --preset nosuch", "preset"),
    ("play chess", "allowed"),
    ("play sokoban --model tiny --temperature -2", "--temperature"),
    ("play sokoban --model tiny --max-new-tokens 0", "--max-new-tokens"),
    ("play sokoban --model {empty}", "--model"),
    ("play sokoban --model tiny --device cuda", "--device cuda"),
    # agentrl report
    ("report {missing}", "no such run folder"),
    ("report {empty}", "not a run folder"),
    ("report {not_json}", "not_json"),
    ("report {presets_list}", "presets"),
    ("report {presets_null}", "presets"),
    ("report {run_no_step} --no-play-references", "step"),
    ("report {run_ok} --no-play-references --reference {missing}", "--reference"),
    ("report {run_ok} --no-play-references --reference {no_presets}", "presets"),
    ("report {run_ok} --no-play-references --reference {not_json}", "not_json"),
    ("report {run_ok} --no-play-references --reference {other_preset}", "--reference"),
    ("report {presets_list} --out {a_file}/x/r.html", "--out"),
    ("report {presets_list} --screenshot {empty}", "--screenshot"),
    *([("report {run_ok} --no-play-references --screenshot {empty}/shot.png", "Chromium")]
      if __import__("agentrl.report.browser", fromlist=["x"]).chromium() is None else []),
    # agentrl train / sft / make-data (config)
    ("train --print-config agents_file={bad_yaml}", "agents_file"),
    ("train --print-config agents_file={missing}", "agents_file"),
    ("train --print-config run_dir={a_file}", "run_dir"),
    ("train --print-config model={missing}", "model"),
    ("train --print-config model={empty}", "model"),
    ("train --print-config model={sft_run}", "no intact checkpoint"),
    ("train --print-config model=nosuchpreset", "allowed model presets"),
    ("train --print-config resume={missing}", "resume"),
    ("train --print-config resume_config_changes=maybe", "resume_config_changes"),
    ("train --print-config train.total_steps=-1", "train.total_steps"),
    ("train --print-config train.grop_num=3", "unknown key 'train.grop_num'"),
    ("train --dry-run backend=verl hardware=a100 model=qwen_halfb "
     "\"verl.overrides=['actor_rollout_ref.actor.ppo_epochs=abc']\"", "ppo_epochs"),
    ("train --dry-run backend=verl hardware=a100 model=qwen_halfb "
     "\"verl.overrides=['actor_rollout_ref.actor.use_dynamic_bsz=3']\"", "true or false"),
    ("sft --print-config \"verl.overrides=['trainer.total_epochs=2']\"", "verl.overrides"),
    ("sft --print-config sft.output_dir={a_file}/x", "sft.output_dir"),
    ("train --print-config hardware=cpu-verl verl.max_response_length=16",
     "verl.max_response_length"),
    ("train --print-config rollout.max_context_tokens=50", "error: rollout.max_context_tokens=50"),
    # the first prompt is measured with the model's tokenizer before the model loads
    ("train model=tiny rollout.max_context_tokens=200 train.total_steps=1",
     "rollout.max_context_tokens=200"),
    ("sft model=tiny rollout.max_context_tokens=200 sft.episodes=1",
     "rollout.max_context_tokens=200"),
    # verl's multi-turn SFT data holds whole episodes: a history window is refused, as train's
    # legacy verl trainer refuses it
    ("sft --dry-run hardware=cpu-verl agents.tightSokobanAgent.history_window=1 "
     "'sft.presets=[tightSokobanAgent]'", "agents.tightSokobanAgent.history_window=1"),
    ("make-data --sft --out {empty}/sft agents.tightSokobanAgent.history_window=1 "
     "'sft.presets=[tightSokobanAgent]' sft.episodes=2",
     "agents.tightSokobanAgent.history_window=1"),
    *([("train --dry-run hardware=cpu-verl model=tiny_vllm", "bash env_setup.sh --verl-cpu")]
      if NO_VLLM else []),  # the venv env_setup.sh makes is out of reach in these tests
    ("make-data --out {a_file}/x/data train.total_steps=1 train.group_num=1", "--out"),
    ("make-data --out {a_file} train.total_steps=1 train.group_num=1", "--out"),
    # agentrl bench (each benchmark's own options)
    ("bench nosuchbench", "allowed"),
    ("bench generate --model {missing}", "--model"),
    ("bench dagger --model {missing}", "--model"),
    ("bench generate --batch-sizes 0", "--batch-sizes"),
    ("bench learn_verl", "part of another benchmark"),
    ("bench learn_verl --help", "part of another benchmark"),
    ("bench quick_train --from-run {empty} --out {empty}/q.json", "--from-run"),
    ("bench learn --recipes verl --minutes 5", "--minutes"),  # on any machine, venv or not
    ("bench learn --recipes verl --steps 0", "--steps"),
    *([("bench learn --recipes verl --steps 1", "vLLM")]
      if NO_VLLM else []),  # where this Python has vLLM's CPU build the recipe runs
    # the others
    ("nosuchcommand", "invalid choice"),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_inputs")
    return _fixtures(root)


@pytest.mark.parametrize("line, fragment", CASES, ids=[c[0][:60] for c in CASES])
def test_a_bad_input_exits_2_with_one_message(line, fragment, files, capsys, monkeypatch,
                                              tmp_path):
    import shlex

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.delenv("AGENTRL_VERL_CPU_PYTHON", raising=False)  # no re-run in another Python
    monkeypatch.setenv("AGENTRL_VERL_CPU_VENV", str(tmp_path / "no-venv"))
    with pytest.raises(SystemExit) as stopped:
        cli.main(shlex.split(line.format(**files)))
    err = capsys.readouterr().err
    assert stopped.value.code == 2, err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "refused after work started"
    message = err.strip().splitlines()[-1]
    assert "error:" in message and fragment in message, err
    if not line.startswith("bench "):  # a benchmark's own parser prints its usage first
        assert len(err.strip().splitlines()) == 1, err  # the message, not a usage dump


def test_overrides_after_a_flag_are_overrides(capsys, monkeypatch, tmp_path):
    """``key=value`` on either side of a flag (train, sft, make-data take them anywhere)."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "model=tiny", "--print-config", "train.total_steps=3"]) == 0
    printed = capsys.readouterr().out
    assert "total_steps: 3" in printed and "name: tiny" in printed


def test_run_files_are_readable_by_the_group_like_any_other_file(tmp_path):
    """Atomic writes (run.json, metrics.jsonl, episodes/*.jsonl) and the learning-curve PNG
    take the umask's mode, not mkstemp's 0600."""
    from agentrl.trainers.plots import plot_learning_curves
    from agentrl.trainers.tracking import write_text_atomic

    old = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "run.json", "{}")
        (tmp_path / "metrics.jsonl").write_text('{"step": 1, "actor/entropy": 1.0}\n')
        png = plot_learning_curves(tmp_path / "metrics.jsonl", tmp_path / "learning_curves.png")
    finally:
        os.umask(old)
    for path in (tmp_path / "run.json", png):
        assert path.stat().st_mode & 0o777 == 0o644, (path, oct(path.stat().st_mode))
