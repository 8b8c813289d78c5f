"""scripts/bench/learn.py with the tiny model: two recipes, one seed, one PPO step; the JSON's
and the table's shape, a second call that reuses the finished runs, and refused settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.trainers.checkpoint import save_checkpoint

SUMMARY_KEYS = {"label", "variant", "lever", "recipe", "runs", "before", "after_mean", "after_min", "after_max", "after_std",
                "gain", "format_error_after", "train_minutes", "wall_minutes", "steps"}


ONE_SMALL_GROUP = ("train.group_num=1", "train.group_size=2")
"""PPO steps of 2 episodes, not the CPU preset's 32: what these tests check is the benchmark's
bookkeeping, not what a step learns."""


@pytest.fixture(scope="module")
def bench(load_script):
    return load_script("scripts/bench/learn.py")


def smoke_args(tmp_path, *extra):
    return ["--recipes", "untrained", "sft_ppo", "--seeds", "1", "--steps", "1",
            "--val-groups", "2", "--sft-episodes", "2", "--sft-epochs", "1",
            "--run-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "learn.json"),
            *extra, "model=tiny", "threads=1", *ONE_SMALL_GROUP]


@pytest.mark.slow
def test_two_recipes_write_json_table_and_plot_and_resume(bench, tmp_path, capsys,
                                                          one_torch_thread):
    bench.main(smoke_args(tmp_path))
    result = json.loads((tmp_path / "learn.json").read_text())
    assert [row["recipe"] for row in result["summary"]] == ["untrained", "sft_ppo"]
    for row in result["summary"]:
        ppo = ({"health", "explained_variance_steps_5_20", "explained_variance_pooled_steps_5_20"}
               if row["recipe"] == "sft_ppo" else set())
        assert set(row) == SUMMARY_KEYS | ppo and row["runs"] == 1
        assert 0 <= row["after_min"] <= row["after_mean"] <= row["after_max"] <= 1
    health = result["summary"][1]["health"]  # the PPO run's health, from its metrics.jsonl
    assert set(health) == set(bench.HEALTH)
    assert health["critic/vf_explained_var"] is not None and health["actor/entropy"] > 0
    assert result["summary"][1]["explained_variance_steps_5_20"] is None  # one step: none there
    assert set(result["references"]) == {"random", "oracle"}
    assert result["references"]["oracle"]["success"] == 1.0
    run = result["runs"]["sft_ppo"][0]
    assert run["steps"] == 1 and [s["settings"].get("steps") for s in run["stages"]] == [None, 1]
    sft_config, ppo_config = (s["settings"]["config"] for s in run["stages"])
    assert sft_config["sft"]["episodes"] == 2 and "critic" not in sft_config
    assert ppo_config["train"]["group_size"] == 2 and "total_steps" not in ppo_config["train"]
    assert run["after"]["episodes"] == 2 and len(run["after"]["success_ci95"]) == 2
    # constrained decoding (both recipes): the tiny random model makes no format error
    assert run["before"]["format_error"] == 0 and run["after_sft"]["format_error"] == 0
    assert Path(result["plot"]).stat().st_size > 0
    table = capsys.readouterr().out
    for label in ("untrained", "sft_ppo", "random policy", "oracle policy", "before", "gain",
                  "RL health", "explained var."):
        assert label in table
    assert not list((tmp_path / "runs").glob("*/seed_*/checkpoints"))  # all trained, pruned

    bench.main(smoke_args(tmp_path))  # the finished stages are read back, not run again
    again = json.loads((tmp_path / "learn.json").read_text())
    assert again["runs"] == result["runs"]
    assert "eval after SFT" not in capsys.readouterr().err

    with pytest.raises(ValueError, match="other settings"):
        bench.main(smoke_args(tmp_path, "--sft-epochs", "2"))

    # the folder moved (committed, another machine): a new lever re-runs the pruned warm start
    # elsewhere, and the finished PPO stage that started from the old one still reads back
    (tmp_path / "runs").rename(tmp_path / "moved")
    moved = [str(tmp_path / "moved") if a == str(tmp_path / "runs") else a
             for a in smoke_args(tmp_path)]
    bench.main([*moved, "--lever", "hot=rollout.temperature=2.0"])
    assert bench.main(moved)["runs"]["sft_ppo"][0]["after"] == run["after"]
    stage = json.loads((tmp_path / "moved" / "sft_ppo" / "seed_0" / "stage.json").read_text())
    assert stage["settings"]["start_from"] == "sft/seed_0/checkpoints/step_000001"


@pytest.mark.slow
def test_a_lever_changes_the_ppo_stage_alone(bench, tmp_path, one_torch_thread):
    result = bench.main(smoke_args(tmp_path, "--lever", "hot=rollout.temperature=2.0"))
    assert [row["label"] for row in result["summary"]] == ["untrained", "sft_ppo",
                                                           "sft_ppo @hot"]
    plain, hot = result["runs"]["sft_ppo"][0], result["runs"]["sft_ppo @hot"][0]
    assert hot["stages"][0] == plain["stages"][0]  # one SFT stage, shared
    assert hot["stages"][1]["settings"]["lever"] == ["rollout.temperature=2.0"]
    assert "lever" not in plain["stages"][1]["settings"]
    assert (tmp_path / "runs" / "sft_ppo@hot" / "seed_0" / "stage.json").is_file()

    alone = tmp_path / "alone"  # --lever-only: the lever's row, without the plain PPO run
    args = [str(alone) if a == str(tmp_path / "runs") else a
            for a in smoke_args(tmp_path, "--lever", "hot=rollout.temperature=2.0")]
    result = bench.main([*args, "--lever-only"])
    assert [row["label"] for row in result["summary"]] == ["untrained", "sft_ppo @hot"]
    assert (alone / "sft" / "seed_0" / "stage.json").is_file()
    assert not (alone / "sft_ppo").exists()


def test_levers_are_checked(bench, capsys):
    for bad in ("hot", "hot=", "two words=rollout.temperature=2", "hot=temperature"):
        with pytest.raises(SystemExit):
            bench.parse_args(["--lever", bad])
        assert "--lever" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--recipes", "sft", "--lever", "hot=rollout.temperature=2"])
    assert "needs a recipe with a PPO stage" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--lever-only"])
    assert "--lever-only needs a --lever" in capsys.readouterr().err
    assert bench.parse_args(["--lever", "a=x.y=1,x.z=2"]).levers == {"a": ["x.y=1", "x.z=2"]}


def test_recipes_and_budgets_are_checked(bench, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--preset", bench.BANDIT, "--recipes", "sft"])
    assert "allows --recipes untrained ppo" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--recipes", "dpo"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--minutes", "0"])
    assert bench.parse_args([]).recipes == bench.LOCAL_RECIPES
    with pytest.raises(SystemExit):
        bench.parse_args(["--seeds", "3", "--only-seed", "3"])
    assert "0..2" in capsys.readouterr().err
    assert bench.parse_args(["--only-seed", "2", "--only-seed", "1"]).only_seed == [2, 1]


@pytest.mark.slow
def test_val_every_records_a_held_out_curve_per_seed(bench, tmp_path, one_torch_thread):
    args = ["--recipes", "ppo_constrained", "--seeds", "2", "--steps", "2", "--val-every", "1",
            "--val-groups", "2", "--run-dir", str(tmp_path / "runs"),
            "--out", str(tmp_path / "learn.json"), "model=tiny", "threads=1", *ONE_SMALL_GROUP]
    only = bench.main([*args, "--only-seed", "1"])  # a benchmark split over processes
    assert [run["seed"] for run in only["runs"]["ppo_constrained"]] == [1]
    result = bench.main(args)  # seed 1 is read back, seed 0 runs
    as_read = json.loads(json.dumps(only["runs"]["ppo_constrained"][0]))  # tuples as lists
    assert result["runs"]["ppo_constrained"][1] == as_read
    runs = result["runs"]["ppo_constrained"]
    before = result["summary"][0]["before"]
    for run in runs:
        curve = run["stages"][-1]["val_curve"]
        assert [step for step, _ in curve] == [0, 1, 2]
        assert curve[0][1] == before and curve[-1][1] == run["after"]["success"]
    assert Path(result["plot"]).stat().st_size > 0


def test_pruning_leaves_the_checkpoints_of_stages_it_did_not_train(bench, tmp_path):
    """A process deletes the checkpoints of the stages it trained, not those it read back (the
    warm start a lever shares, another lever's kept run: of the same seed) nor those of a
    process still training another seed in the same --run-dir."""
    bench.TRAINED_STAGES.clear()
    trained = tmp_path / "sft_ppo@hot" / "seed_1"
    read_back = [tmp_path / "sft" / "seed_1", tmp_path / "sft_ppo@warm" / "seed_1",
                 tmp_path / "ppo_constrained" / "seed_0"]
    for folder in (trained, *read_back):
        (folder / "checkpoints" / "step_000002").mkdir(parents=True)
        (folder / "checkpoints" / "step_000002" / "model.safetensors").write_bytes(b"weights")
    bench.save_stage(trained, {"steps": 2}, {"checkpoint": None})
    bench.prune_checkpoints(bench.TRAINED_STAGES)
    assert not (trained / "checkpoints").exists()
    for folder in read_back:
        assert (folder / "checkpoints" / "step_000002" / "model.safetensors").read_bytes() == \
            b"weights"


def test_a_finished_ppo_stage_goes_on_to_more_steps_only_from_its_checkpoint(bench, tmp_path):
    folder = tmp_path / "runs" / "sft_ppo" / "seed_0"
    settings = {"preset": "p", "steps": 4, "minutes": None}
    record = bench.save_stage(folder, settings,
                              {"checkpoint": "sft_ppo/seed_0/checkpoints/step_000004"})
    more = {**settings, "steps": 8, "val_every": 4}
    with pytest.raises(ValueError, match="its checkpoint is gone"):
        bench.cached_stage(folder, more, extends=True)
    save_checkpoint(folder, 4, tensors={"trainer_state": {"step": 4}})
    assert bench.cached_stage(folder, more, extends=True) is None  # the trainer resumes
    assert bench.cached_stage(folder, settings, extends=True) == record
    for other in ({**settings, "steps": 2}, {**more, "preset": "q"}):
        with pytest.raises(ValueError, match="other settings"):
            bench.cached_stage(folder, other, extends=True)
    with pytest.raises(ValueError, match="other settings"):  # an SFT stage never goes on
        bench.cached_stage(folder, more)


def test_a_stage_made_under_another_default_is_refused_naming_the_key(bench, tmp_path, capsys):
    """Stage settings hold the resolved config, not only the command's overrides: a default that
    changed between two runs into one --run-dir (the same overrides) must not read the stage made
    under the old default back as the new one's."""
    configs = bench.Configs(bench.parse_args(["--run-dir", str(tmp_path), "model=tiny"]))
    before = configs.build(constrained=True, extra=("rollout.drop_uniform_groups=false",))
    now = configs.build(constrained=True, extra=("rollout.drop_uniform_groups=true",))
    folder = tmp_path / "sft_ppo" / "seed_0"

    def settings(config):
        return configs.settings(steps=4, minutes=None,
                                config=configs.resolved(config, bench.PPO_SECTIONS))

    assert settings(before)["overrides"] == settings(now)["overrides"]
    record = bench.save_stage(folder, settings(before), {"checkpoint": None})
    assert bench.cached_stage(folder, settings(before), extends=True) == record
    with pytest.raises(ValueError, match=r"rollout\.drop_uniform_groups: False -> True"):
        bench.cached_stage(folder, settings(now), extends=True)

    with pytest.raises(ValueError, match=r"\(minutes: None -> 5\); remove"):  # the key, alone
        bench.cached_stage(folder, {**settings(before), "minutes": 5}, extends=True)

    # a record from before stage records held their config reads back, with a note saying so,
    # and goes on to more steps from its checkpoint with the same note
    old = {key: value for key, value in settings(before).items() if key != "config"}
    record = bench.save_stage(folder, old, {"checkpoint": None})
    assert bench.cached_stage(folder, settings(now), extends=True) == record
    assert "holds no resolved config" in capsys.readouterr().err
    save_checkpoint(folder, 4, tensors={"trainer_state": {"step": 4}})
    assert bench.cached_stage(folder, {**settings(now), "steps": 8}, extends=True) is None
    assert "holds no resolved config" in capsys.readouterr().err


def test_a_key_added_since_a_stage_ran_reads_back_at_its_default_only(bench, tmp_path):
    """A stage recorded before a config key existed is the same stage under that key's default
    (a new key is off by default), and another stage at any other value of it."""
    configs = bench.Configs(bench.parse_args(["--run-dir", str(tmp_path), "model=tiny"]))
    folder = tmp_path / "sft_ppo" / "seed_0"

    def settings(*extra):
        config = configs.build(constrained=True, extra=extra)
        return configs.settings(steps=4, minutes=None,
                                config=configs.resolved(config, bench.PPO_SECTIONS))

    old = settings()
    del old["config"]["algorithm"]["lost_group_advantage"]  # recorded before the key was added
    record = bench.save_stage(folder, old, {"checkpoint": None})
    assert bench.cached_stage(folder, settings(), extends=True) == record
    with pytest.raises(ValueError, match=r"algorithm\.lost_group_advantage: None -> -1\.0"):
        bench.cached_stage(folder, settings("algorithm.lost_group_advantage=-1"), extends=True)


def test_the_model_is_resolved_unless_it_is_the_checkpoint_a_stage_starts_from(bench, tmp_path):
    configs = bench.Configs(bench.parse_args(["--run-dir", str(tmp_path), "model=tiny"]))
    config = configs.build(constrained=True)
    assert configs.resolved(config, bench.SFT_SECTIONS)["model"]["name"] == "tiny"
    warm = configs.build(constrained=True, model=str(tmp_path / "sft" / "checkpoints" / "step_1"))
    assert "name" not in configs.resolved(warm, bench.PPO_SECTIONS, from_checkpoint=True)["model"]


@pytest.mark.slow
def test_more_steps_resume_the_finished_run_and_keep_its_curve(bench, tmp_path, one_torch_thread):
    args = ["--recipes", "ppo_constrained", "--seeds", "1", "--val-groups", "2",
            "--run-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "learn.json"),
            "--keep-checkpoints", "model=tiny", "threads=1", *ONE_SMALL_GROUP]
    bench.main([*args, "--steps", "1"])
    result = bench.main([*args, "--steps", "2", "--val-every", "1"])
    stage = result["runs"]["ppo_constrained"][0]["stages"][-1]
    assert stage["steps"] == 2 and [step for step, _ in stage["val_curve"]] == [0, 1, 2]
    metrics = tmp_path / "runs" / "ppo_constrained" / "seed_0" / "metrics.jsonl"
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps.count(1) == 1 and steps[-1] == 2  # step 1 was not trained again
