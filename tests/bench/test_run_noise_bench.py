"""scripts/bench/run_noise.py on a hand-made ppo_gain result: the run-to-run spread from null
pairs, each pair read against it, pairs read as one (clustered by seed), the warm start's half
variance, and its refusals."""

from __future__ import annotations

import json
import math

import pytest

from agentrl.evaluation.stats import student_t_95


def won(n: int, games: int = 10) -> list[bool]:
    return [True] * n + [False] * (games - n)


def run(seed: int, sft: int, ppo: int, **levers: int) -> dict:
    return {"seed": seed, "wins": {"sft": won(sft), "sft_ppo": won(ppo)},
            "levers": {name: {"wins": won(n)} for name, n in levers.items()}}


@pytest.fixture(scope="module")
def bench(load_script):
    return load_script("scripts/bench/run_noise.py")


@pytest.fixture
def result_file(tmp_path):
    # 3 seeds x 10 games; `again` is sft_ppo on another PPO seed: differences +2, -1, -2 games
    runs = [run(0, 5, 6, again=8, lever=4), run(1, 5, 7, again=6, lever=5),
            run(2, 4, 6, again=4, lever=3)]
    path = tmp_path / "gain.json"
    path.write_text(json.dumps({"seeds": [0, 1, 2], "val_games": 10, "runs": runs}))
    return path


def test_pairs_are_read_against_the_spread_of_the_null(bench, result_file, tmp_path, capsys):
    out = tmp_path / "noise.json"
    record = bench.main([str(result_file), "--null", "again:sft_ppo", "--out", str(out)])
    sigma = math.sqrt((0.2 ** 2 + 0.1 ** 2 + 0.2 ** 2) / 3)
    assert record["noise"]["sigma"] == pytest.approx(sigma) and record["noise"]["df"] == 3
    assert set(record["pairs"]) == {"again:sft_ppo", "lever:sft_ppo"}  # every lever
    lever = record["pairs"]["lever:sft_ppo"]  # -2, -2, -3 games
    assert lever["per_seed"] == pytest.approx([-0.2, -0.2, -0.3])
    half = student_t_95(3) * sigma / math.sqrt(3)
    assert lever["ci95"] == pytest.approx([-0.7 / 3 - half, -0.7 / 3 + half])
    assert lever["se"] == pytest.approx(sigma / math.sqrt(3)) and lever["ppo_arms"] == 2
    assert 0.05 < lever["p"] < 0.2  # t = 2.33 with 3 degrees of freedom
    # with the seeds as the units the same lever is far surer: the seeds agree
    low, high = lever["seed_ci95"]
    assert high < 0 and high - low < 2 * half
    assert json.loads(out.read_text())["pairs"]["lever:sft_ppo"]["p"] == pytest.approx(lever["p"])
    assert "sigma" in capsys.readouterr().out


def test_pairs_read_as_one_and_the_warm_start_has_half_the_variance(bench, result_file,
                                                                        tmp_path):
    record = bench.main([str(result_file), "--null", "again:sft_ppo",
                         "--compare", "sft_ppo:sft+again:sft", "--compare", "sft_ppo:sft",
                         "--out", str(tmp_path / "n.json")])
    sigma = record["noise"]["sigma"]
    both = record["pairs"]["sft_ppo:sft+again:sft"]
    assert both["per_seed"] == pytest.approx([0.1, 0.2, 0.2, 0.3, 0.1, 0.0])
    # with the seeds as the units a seed's two runs are averaged first: 0.2, 0.15, 0.1
    half = student_t_95(2) * 0.05 / math.sqrt(3)
    assert both["seed_ci95"] == pytest.approx([0.15 - half, 0.15 + half])
    one = record["pairs"]["sft_ppo:sft"]
    # one PPO run against the warm start: sigma / sqrt(2), over 3 seeds and then over 6
    assert one["ci95"][1] - one["mean"] == pytest.approx(
        student_t_95(3) * sigma / math.sqrt(2) / math.sqrt(3))
    assert both["ci95"][1] - both["mean"] == pytest.approx(
        student_t_95(3) * sigma / math.sqrt(2) / math.sqrt(6))


def test_bad_pairs_are_refused(bench, result_file, tmp_path):
    out = ["--out", str(tmp_path / "n.json")]
    with pytest.raises(SystemExit, match="no arm 'nope'"):
        bench.main([str(result_file), "--null", "nope:sft_ppo", *out])
    with pytest.raises(SystemExit, match="no null pair"):
        bench.main([str(result_file), *out])
    for null in ("sft_ppo:sft", "again:again"):  # half the variance; no variance at all
        with pytest.raises(SystemExit, match="two different PPO arms"):
            bench.main([str(result_file), "--null", null, *out])
    with pytest.raises(SystemExit, match="named twice"):
        bench.main([str(result_file), "--null", "again:sft_ppo", "--null", "again:sft_ppo",
                    *out])
    with pytest.raises(SystemExit, match="or all between PPO runs"):
        bench.main([str(result_file), "--null", "again:sft_ppo",
                    "--compare", "lever:sft+lever:sft_ppo", *out])
    with pytest.raises(SystemExit):  # argparse: not ARM:ARM
        bench.main([str(result_file), "--null", "again", *out])


def test_results_that_cannot_be_read_are_refused(bench, tmp_path):
    def refused(runs: list[dict], match: str, null: str = "again:sft_ppo") -> None:
        path = tmp_path / "gain.json"
        path.write_text(json.dumps({"seeds": [r["seed"] for r in runs], "val_games": 10,
                                    "runs": runs}))
        with pytest.raises(SystemExit, match=match):
            bench.main([str(path), "--null", null, "--out", str(tmp_path / "n.json")])

    refused([], "no runs")
    refused([run(0, 5, 6, again=6), run(1, 5, 7)], "seed 1: no arm 'again'")
    refused([run(0, 5, 6, again=6), run(1, 5, 7, again=7)], "never differ")
    uneven = run(0, 5, 6, again=6)
    uneven["levers"]["again"]["wins"] = won(6, games=12)
    refused([uneven], "different games")


def test_a_lever_of_the_first_seed_missing_on_another_is_refused(bench, tmp_path):
    path = tmp_path / "gain.json"
    runs = [run(0, 5, 6, again=8, lever=4), run(1, 5, 7, again=6)]  # seed 1 has no `lever`
    path.write_text(json.dumps({"seeds": [0, 1], "val_games": 10, "runs": runs}))
    with pytest.raises(SystemExit, match="seed 1: no arm 'lever'"):  # every lever by default
        bench.main([str(path), "--null", "again:sft_ppo", "--out", str(tmp_path / "n.json")])
