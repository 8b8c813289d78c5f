"""scripts/bench/learn.py's ``verl`` recipe without verl: a stand-in interpreter plays
``agentrl sft`` and ``agentrl train`` (it checks the recipe's keys, writes the folders verl
writes and prints verl's console lines), so the stage's wiring, caching, evaluation of the
actor's model folder and timings are checked in seconds; the token budget on the real preset
and tokenizer; verl's folders and console read as verl 0.9.1 writes them. Slow: one real
tiny run through verl's trainers (vLLM's CPU build, ~10 GiB)."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from agentrl import cli
from agentrl.config import compose_config
from agentrl.verl.child_run import verl_cpu_python

PRESET = "tightBlocksworldTurnsAgent"
FAKE_PYTHON = f"""#!{sys.executable}
# a stand-in for `python -m agentrl.cli sft|train ...` of verl's CPU venv
import json, os, shutil, sys
from pathlib import Path

command, keys = sys.argv[3], dict(arg.split("=", 1) for arg in sys.argv[4:])
if os.environ.get("FAKE_VERL_FAILS") == command:
    sys.exit("verl: out of memory")
assert sys.argv[1:3] == ["-m", "agentrl.cli"], sys.argv
assert keys["hardware"] == "cpu-verl" and keys["rollout.constrained_actions"] == "true", keys
assert keys["agents.{PRESET}.history_window"] == "0", keys
run_dir = Path(keys["run_dir"])
if command == "sft":
    from agentrl.models import load_model
    model, tokenizer = load_model("tiny-vllm")
    for step in (2, 10):   # the newest by number, not by name
        folder = Path(keys["sft.output_dir"]) / "verl" / f"global_step_{{step}}" / "huggingface"
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    print("sft done", keys["sft.episodes"], keys["sft.epochs"])
else:
    assert command == "train" and keys["model.name"].endswith("global_step_10/huggingface")
    steps = int(keys["train.total_steps"])
    run_dir.mkdir(parents=True)
    with open(run_dir / "metrics.jsonl", "w") as metrics:
        for step in range(1, steps + 1):
            print(f"(TaskRunner pid=1) step:{{step}} - timing_s/gen:np.float64({{10.0 * step}}) "
                  f"- timing_s/update_actor:2.5 - timing_s/step:{{10.0 * step + 3}}")
            metrics.write(json.dumps({{"step": step, "train/{PRESET}/success": 0.25}}) + "\\n")
    actor = run_dir / "checkpoints" / f"global_step_{{steps}}" / "actor" / "huggingface"
    shutil.copytree(keys["model.name"], actor)
"""


@pytest.fixture(scope="module")
def bench(load_script):
    return load_script("scripts/bench/learn.py")


@pytest.fixture
def fake_verl(tmp_path, monkeypatch):
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text(FAKE_PYTHON)
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("AGENTRL_VERL_CPU_PYTHON", str(python))
    return python


def recipe_args(tmp_path, *extra):
    return ["--recipes", "verl", "--seeds", "1", "--steps", "2", "--val-groups", "2",
            "--sft-episodes", "8", "--sft-epochs", "1", "--run-dir", str(tmp_path / "runs"),
            "--out", str(tmp_path / "learn.json"), *extra, "model=tiny_vllm", "threads=1"]


def test_the_verl_recipe_trains_through_child_runs_and_evaluates_the_actors_folder(
        bench, fake_verl, tmp_path, capsys, one_torch_thread):
    result = bench.main(recipe_args(tmp_path))
    assert [row["label"] for row in result["summary"]] == ["verl (history_window=0)"]
    run = json.loads(json.dumps(result["runs"]["verl (history_window=0)"][0]))  # as stored
    stage = run["stages"][0]
    assert stage["settings"]["engine"] == "verl"
    assert f"agents.{PRESET}.history_window=0" in stage["settings"]["overrides"]
    # the local evaluator played the actor's folder on the held-out games, constrained
    assert run["after"]["episodes"] == 2 and run["after"]["format_error"] == 0
    assert run["before"]["episodes"] == 2 and run["steps"] == 2
    # verl's timings per step, the means leaving out the first (it starts the workers)
    assert stage["timings"]["per_step"]["1"] == {"timing_s/gen": 10.0,
                                                 "timing_s/update_actor": 2.5,
                                                 "timing_s/step": 13.0}
    assert stage["timings"]["mean"] == {"timing_s/gen": 20.0, "timing_s/update_actor": 2.5,
                                        "timing_s/step": 23.0}
    assert stage["ppo_step_minutes"] == pytest.approx(36 / 60)
    assert stage["train_curve"] == [[1, 0.25], [2, 0.25]]
    folder = tmp_path / "runs" / "verl" / "seed_0"
    assert (folder / "ppo.log").read_text().count(" - timing_s/gen") == 2
    assert "sft done 8 1" in (folder / "sft.log").read_text()
    assert not (folder / "ppo" / "checkpoints").exists()   # pruned after the evaluation
    assert (tmp_path / "runs" / "verl" / "untrained" / "constrained" / "stage.json").is_file()
    assert "verl (history_window=0)" in capsys.readouterr().out

    fake_verl.write_text("#!/bin/sh\nexit 1\n")   # a finished stage is read back, not rerun
    assert bench.main(recipe_args(tmp_path))["runs"] == json.loads(json.dumps(result["runs"]))


def test_a_failed_verl_run_stops_the_recipe_and_a_rerun_keeps_its_finished_sft(
        bench, fake_verl, tmp_path, monkeypatch, one_torch_thread):
    monkeypatch.setenv("FAKE_VERL_FAILS", "train")
    with pytest.raises(RuntimeError, match="train exited 1(.|\n)*verl: out of memory"):
        bench.main(recipe_args(tmp_path))
    monkeypatch.setenv("FAKE_VERL_FAILS", "sft")   # the finished SFT run is not run again,
    stage = bench.main(recipe_args(tmp_path, "--steps", "3"))  # with other PPO steps too
    stage = stage["runs"]["verl (history_window=0)"][0]["stages"][0]
    assert stage["steps"] == 3 and stage["sft_minutes"] > 0
    monkeypatch.setenv("FAKE_VERL_FAILS", "sft")   # another plan: its own SFT run
    with pytest.raises(RuntimeError, match="sft exited 1"):
        bench.main(recipe_args(tmp_path, "--seeds", "2", "--only-seed", "1"))


def test_a_failed_evaluation_keeps_the_finished_verl_runs(bench, fake_verl, tmp_path,
                                                         monkeypatch, one_torch_thread):
    """verl's PPO finished but the evaluation after it failed: a rerun evaluates the kept actor
    from the runs' records and consoles, training nothing again."""
    def broken(config):
        raise RuntimeError("evaluation failed")

    real = bench.evaluate_model
    monkeypatch.setattr(bench, "evaluate_model", lambda config: (
        real(config) if config.model.name in ("tiny_vllm", "tiny-vllm") else broken(config)))
    with pytest.raises(RuntimeError, match="evaluation failed"):
        bench.main(recipe_args(tmp_path))
    folder = tmp_path / "runs" / "verl" / "seed_0"
    assert json.loads((folder / "ppo" / "finished.json").read_text())["plan"]["steps"] == 2
    monkeypatch.setattr(bench, "evaluate_model", real)
    fake_verl.write_text("#!/bin/sh\nexit 1\n")   # neither verl run may start again
    stage = bench.main(recipe_args(tmp_path))["runs"]["verl (history_window=0)"][0]["stages"][0]
    assert stage["steps"] == 2 and stage["timings"]["per_step"]["2"]["timing_s/step"] == 23.0
    assert stage["after"]["episodes"] == 2


def test_the_recipe_is_asked_for_and_refuses_a_deadline(bench, capsys):
    assert "verl" not in bench.parse_args([]).recipes
    with pytest.raises(SystemExit):
        bench.parse_args(["--recipes", "verl", "--minutes", "5"])
    assert "--minutes does not cap the verl recipe" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--recipes", "verl", "--lever", "hot=rollout.temperature=2"])
    assert "not verl" in capsys.readouterr().err


def test_a_whole_episode_must_fit_verls_row(bench, tmp_path):
    verl = bench.VERL
    plan = verl.Plan(preset=PRESET, seed=0, steps=1, sft_episodes=8, sft_epochs=1,
                     val_groups=2, overrides=verl.full_history(PRESET))
    config = compose_config(verl.shared_keys(plan))
    seeds = list(range(8))
    bounds = verl.check_lengths(config, PRESET, seeds)
    # 6 turns: a first prompt of ~120 tokens (brief rules, compact states), then ~80 tokens of
    # feedback and state and a reply of at most 32 per turn; a 512-token response would cut
    # the longest episodes
    assert 100 < bounds["prompt"] <= verl.MAX_PROMPT_LENGTH
    assert 512 < bounds["response"] <= verl.MAX_RESPONSE_LENGTH
    short = compose_config([*verl.shared_keys(plan), "verl.max_response_length=512"])
    with pytest.raises(ValueError, match=r"verl.max_response_length=512 is too small .* "
                                         r"allowed: an integer >= \d+"):
        verl.check_lengths(short, PRESET, seeds)
    windowed = verl.Plan(**{**plan._asdict(), "overrides": ()})  # the preset's chat a turn
    with pytest.raises(ValueError, match="context='state' is not allowed with "
                                         "verl.trainer='legacy'"):
        compose_config(verl.shared_keys(windowed))


def test_verls_folders_are_found_or_named(bench, tmp_path):
    verl = bench.VERL
    for step in (9, 10):
        (tmp_path / "sft" / "verl" / f"global_step_{step}" / "huggingface").mkdir(parents=True)
    assert verl.sft_model(tmp_path).parent.name == "global_step_10"
    with pytest.raises(FileNotFoundError, match="no global_step_"):
        verl.sft_model(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="no actor model at .*global_step_3"):
        verl.actor_model(tmp_path, 3)


def test_local_timings_average_the_local_stages_steps_as_verls(bench):
    records = [{"step": 0, "val/x/success": 0.1},
               {"step": 1, "timing/step_s": 40.0, "timing/rollout_s": 30.0},
               {"step": 2, "timing/step_s": 20.0, "timing/rollout_s": 12.0},
               {"step": 3, "timing/step_s": 30.0, "timing/rollout_s": 14.0}]
    assert bench.VERL.local_timings(records) == {"timing/step_s": 25.0,
                                                 "timing/rollout_s": 13.0}


@pytest.mark.skipif(verl_cpu_python() is None, reason="a cpu-verl dry run needs vLLM's CPU "
                    "build: bash env_setup.sh --verl-cpu")
@pytest.mark.slow
def test_the_commands_pass_verls_config_checks(bench, tmp_path, capsys):
    verl = bench.VERL
    plan = verl.Plan(preset=PRESET, seed=0, steps=4, sft_episodes=64, sft_epochs=1,
                     val_groups=64, overrides=(*verl.full_history(PRESET), "model=tiny_vllm"))
    ppo = verl.ppo_command(sys.executable, tmp_path, plan, "tiny-vllm")
    assert cli.main([ppo[3], "--dry-run", *ppo[4:]]) == 0
    printed = capsys.readouterr().out
    assert "hf_model" in printed and "max_response_length: 1024" in printed
    sft = verl.sft_command(sys.executable, tmp_path, plan)
    assert cli.main([sft[3], "--dry-run", *sft[4:]]) == 0
    assert "max_length: 1536" in capsys.readouterr().out


@pytest.mark.slow  # Ray, vLLM's CPU build and two verl runs of the tiny model: ~5 min, ~10 GiB
def test_a_real_tiny_verl_recipe_run(bench, tmp_path, one_torch_thread):
    if verl_cpu_python() is None:
        pytest.skip("the verl recipe needs vLLM's CPU build: bash env_setup.sh --verl-cpu")
    result = bench.main(["--recipes", "verl", "--seeds", "1", "--steps", "1", "--val-groups",
                         "2", "--sft-episodes", "8", "--sft-epochs", "1", "--preset",
                         "banditAgent", "--run-dir", str(tmp_path / "runs"),
                         "--out", str(tmp_path / "learn.json"), "model=tiny_vllm",
                         "threads=1"])
    stage = result["runs"]["verl (history_window=0)"][0]["stages"][0]
    assert stage["steps"] == 1 and stage["timings"]["per_step"]["1"]["timing_s/step"] > 0
    assert stage["after"]["format_error"] == 0   # constrained, from verl's actor folder
    assert not list((tmp_path / "runs").glob("verl/seed_0/ppo/checkpoints"))
    assert Path(result["plot"]).stat().st_size > 0
