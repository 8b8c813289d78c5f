"""scripts/bench/ppo_gain.py: the summary over seeds on hand-made runs, its checks, and a smoke
run with the tiny model (one seed, one PPO step and one lever's, two held-out games) that writes
the JSON with the issue's keys, the plot, and reads its stages back a second time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.evaluation.stats import paired_difference


@pytest.fixture(scope="module")
def bench(load_script):
    return load_script("scripts/bench/ppo_gain.py")


def test_the_mean_gain_and_the_pooled_games(bench):
    def run(sft, ppo):
        return {"sft": sum(sft) / len(sft), "sft_ppo": sum(ppo) / len(ppo),
                "gain": paired_difference(ppo, sft)[0], "wins": {"sft": sft, "sft_ppo": ppo}}

    runs = [run([True, False, False, False], [True, True, True, False]),   # +50 points
            run([True, True, False, False], [True, False, False, False])]  # -25 points
    mean = bench.summarize(runs)
    assert mean["gain"] == pytest.approx(0.125)
    assert mean["gain_seed_sd"] == pytest.approx((2 * 0.375 ** 2) ** 0.5)  # +0.5 and -0.25
    assert mean["sft"] == pytest.approx(0.375) and mean["sft_ppo"] == pytest.approx(0.5)
    # the same 4 games on both seeds: per game (0 + 0)/2, (+1 - 1)/2, (+1 + 0)/2, (0 + 0)/2
    pooled = mean["pooled"]
    assert pooled["games"] == 4 and (pooled["better"], pooled["worse"]) == (1, 0)
    assert pooled["gain"] == pytest.approx(1 / 8)
    assert pooled["p"] == pytest.approx(1.0)
    low, high = pooled["gain_ci95"]
    assert low < pooled["gain"] < high
    # the seeds as the units: two seeds that gain alike (+25 points) on different games
    alike = bench.summarize([run([True, False, False, False], [True, True, False, False]),
                             run([False, False, True, False], [False, False, True, True])])
    assert alike["pooled"]["seed_ci95"] == pytest.approx([0.25, 0.25])


def test_arguments_are_checked(bench, capsys):
    for argv, message in ((["--seeds", "0"], "--seeds must be >= 1"),
                          (["--group-size", "0"], "--group-size must be >= 1"),
                          (["--minutes", "0"], "--minutes must be > 0"),
                          (["--only-seed", "3"], "--only-seed must be a training seed")):
        with pytest.raises(SystemExit):
            bench.parse_args(argv)
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--preset", "first-token-bandit"])
    assert "no warm start" in capsys.readouterr().err
    args = bench.parse_args([])
    assert (args.val_groups, args.seeds, args.groups, args.group_size) == (128, 3, 4, 8)


def smoke_args(tmp_path):
    return ["--seeds", "1", "--steps", "1", "--val-groups", "2", "--sft-episodes", "2",
            "--sft-epochs", "1", "--groups", "1", "--group-size", "2",
            "--run-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "learn_ppo.json"),
            "--lever", "two_passes=actor.ppo_epochs=2", "model=tiny", "threads=1"]


@pytest.mark.slow
def test_a_smoke_run_writes_the_json_and_reads_its_stages_back(bench, tmp_path, capsys,
                                                             one_torch_thread):
    bench.main(smoke_args(tmp_path))
    result = json.loads((tmp_path / "learn_ppo.json").read_text())
    assert result["val_games"] == 2 and result["games"] == [2]
    run = result["runs"][0]
    assert all(len(run["wins"][name]) == 2 for name in ("sft", "sft_ppo"))
    assert run["gain"] == pytest.approx(run["sft_ppo"] - run["sft"])
    assert result["gain_per_seed"] == [run["gain"]] and result["gain"] == run["gain"]
    assert run["ppo_steps"] == 1 and set(run["mcnemar"]) == {"only_a", "only_b", "p"}
    assert run["health"]["actor/entropy"] is not None  # the PPO run's health, read back
    assert run["explained_variance_from_step_5"] is None  # one step: none from step 5 on
    assert run["mc_explained_variance_from_step_5"] is None  # likewise, against whole returns
    lever = run["levers"]["two_passes"]  # the lever's PPO run, on the same games
    assert lever["gain"] == pytest.approx(lever["success"] - run["sft"])
    assert lever["vs_sft_ppo"]["gain"] == pytest.approx(lever["success"] - run["sft_ppo"])
    assert lever["health"]["actor/ppo_kl"] not in (None, 0)  # a second pass: the ratio moved
    assert run["health"]["actor/ppo_kl"] == 0  # its own run's numbers, not the plain PPO's
    assert set(result["mean"]["levers"]["two_passes"]) == {"success", "gain", "pooled",
                                                           "vs_sft_ppo"}
    assert Path(result["plot"]).stat().st_size > 0
    first = capsys.readouterr()
    assert "mean gain" in first.out and "oracle demonstrations" in first.err
    runs = tmp_path / "runs"
    ppo_stage = json.loads((runs / "sft_ppo@1x2" / "seed_0" / "stage.json").read_text())
    assert ppo_stage["settings"]["lever"] == ["train.group_num=1", "train.group_size=2"]
    lever_stage = json.loads((runs / "sft_ppo@1x2+two_passes" / "seed_0" / "stage.json"
                              ).read_text())
    assert lever_stage["settings"]["lever"][-1] == "actor.ppo_epochs=2"
    assert not list(runs.glob("**/checkpoints"))  # all trained here, pruned

    bench.main(smoke_args(tmp_path))  # every stage read back: nothing trains or plays again
    again = json.loads((tmp_path / "learn_ppo.json").read_text())
    assert again["runs"] == result["runs"]
    assert "oracle demonstrations" not in capsys.readouterr().err


def test_a_paired_record_of_another_checkpoint_is_played_again(bench, tmp_path, monkeypatch):
    """A PPO run resumed to more steps has a new checkpoint: its games are played again, where a
    stage of other settings is otherwise refused (playing depends on nothing else)."""
    learn = bench.LEARN
    played = []
    monkeypatch.setattr(learn, "held_out_wins", lambda config, split: played.append(
        config.model.name) or [True, False])
    args = bench.parse_args(["--run-dir", str(tmp_path), "--val-groups", "2", "model=tiny"])
    configs = learn.Configs(args)
    folder = tmp_path / "paired" / "sft_ppo" / "seed_0"
    first = learn.paired_stage(configs, folder, "sft_ppo", 0, "run/checkpoints/step_000016", args)
    again = learn.paired_stage(configs, folder, "sft_ppo", 0, "run/checkpoints/step_000016", args)
    assert first == again and len(played) == 1                          # read back
    more = learn.paired_stage(configs, folder, "sft_ppo", 0, "run/checkpoints/step_000020", args)
    assert played == [str(tmp_path / "run/checkpoints/step_000016"),
                      str(tmp_path / "run/checkpoints/step_000020")]
    assert more["settings"]["checkpoint"].endswith("step_000020") and more["games"] == 2


def test_the_test_split_is_played_apart_from_the_val_records(bench, tmp_path, monkeypatch):
    """``--split test``: the paired games are the test split's, recorded under ``paired@test/``
    with their split named; the val records beside them are neither read nor overwritten."""
    learn = bench.LEARN
    played = []
    monkeypatch.setattr(learn, "held_out_wins", lambda config, split: played.append(split)
                        or ([True, True] if split == "test" else [False, False]))
    checkpoint = "run/checkpoints/step_000016"
    records = {}
    for split in ("val", "test", "val", "test"):
        args = bench.parse_args(["--run-dir", str(tmp_path), "--val-groups", "2",
                                 "--split", split, "model=tiny"])
        records[split] = bench.paired(args, "sft", 0, checkpoint)
    assert played == ["val", "test"]  # each split played once, then read back
    assert records["test"]["wins"] == [True, True] and records["val"]["wins"] == [False, False]
    test_record = json.loads((tmp_path / "paired@test" / "sft" / "seed_0" / "stage.json"
                              ).read_text())
    val_record = json.loads((tmp_path / "paired" / "sft" / "seed_0" / "stage.json").read_text())
    assert test_record["settings"]["split"] == "test" and "split" not in val_record["settings"]


def test_a_new_split_needs_the_kept_checkpoints(bench, tmp_path):
    """Played on the val split, pruned: the test split's games cannot be played from those
    runs, and the run stops before training anything again (another warm start could be another
    model, paired against PPO runs from the first). Its result goes beside val's, not over it."""
    for folder in ("sft", "sft_ppo@4x8"):
        record = tmp_path / folder / "seed_0" / "stage.json"
        record.parent.mkdir(parents=True)
        record.write_text(json.dumps({"checkpoint": f"{folder}/seed_0/checkpoints/step_000016"}))
    args = bench.parse_args(["--run-dir", str(tmp_path), "--split", "test", "model=tiny"])
    assert Path(args.out).name == "learn_ppo@test.json"
    with pytest.raises(SystemExit, match=r"seed 0: sft \(.*\), sft_ppo \(.*--keep-checkpoints"):
        bench.run_seed(args, 0)
    assert not (tmp_path / "paired@test").exists()
