"""`agentrl bench`: lists the benchmarks of scripts/bench/ and runs one with its own options."""

from __future__ import annotations

import json

import pytest

from agentrl import cli
from agentrl.cli.bench import BENCH_DIR


def test_without_a_name_it_lists_every_benchmark_with_its_summary(capsys):
    assert cli.main(["bench"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = [line.split()[0] for line in lines]
    scripts = sorted(path.stem for path in BENCH_DIR.glob("*.py"))
    assert names == [name for name in scripts if name != "learn_verl"]  # a part of learn.py
    assert any(line.startswith("prefix_cache") and "prefix cache" in line for line in lines)


def test_a_benchmark_runs_with_its_own_options(tmp_path, capsys):
    out = tmp_path / "envs.json"
    assert cli.main(["bench", "envs", "--games", "Bandit", "--resets", "3", "--steps", "3",
                     "--out", str(out)]) == 0
    assert "Bandit" in json.dumps(json.loads(out.read_text()))
    assert "Bandit" in capsys.readouterr().out


def test_an_unknown_benchmark_names_the_allowed_ones(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "nope"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "unknown benchmark 'nope'; allowed: " in error
    allowed = error.split("allowed: ", 1)[1].strip().split(", ")
    assert allowed == sorted(allowed) and {"busy", "envs", "generate", "learn"} <= set(allowed)


def test_quick_train_from_run_states_the_runs_decoding(load_script, tmp_path, capsys):
    """``bench quick_train --from-run``: the summary says how the run's validation decoded,
    from the resolved config its checkpoint stores."""
    import json

    import yaml

    bench = load_script("scripts/bench/quick_train.py")
    run = tmp_path / "run"
    (run / "checkpoints" / "step_000001").mkdir(parents=True)
    (run / "checkpoints" / "step_000001" / "config.yaml").write_text(yaml.safe_dump(
        {"backend": "local", "rollout": {"constrained_actions": None, "max_new_tokens": 96},
         "val": {"presets": ["banditAgent"], "max_new_tokens": None}}))
    (run / "metrics.jsonl").write_text(json.dumps(
        {"step": 1, "time": 1.0, "val/banditAgent/success": 0.5,
         "val/banditAgent/episodes": 4.0}) + "\n")
    result = bench.main(["--from-run", str(run), "--out", str(tmp_path / "q.json")])
    stated = "validation decoding: greedy, constrained to valid actions, replies up to 96 tokens"
    assert result["runs"][0]["what"] == f"the run in {run}; {stated}"
    assert stated in capsys.readouterr().out
