"""`agentrl eval`: presets, reference policies to JSON, a checkpoint folder, bad options."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.cli.eval import model_path, select_presets
from agentrl.envs.splits import SEED_RANGES
from agentrl.trainers.checkpoint import save_checkpoint

PRESETS = ("tetrisType1Agent", "blocksworldTextAgent")


def agentrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentrl.cli", *args], capture_output=True,
                          text=True, check=False)


def test_oracle_writes_json_rows_and_prints_the_table(tmp_path):
    out = tmp_path / "results" / "oracle.json"
    result = agentrl("eval", "--policy", "oracle", "--presets", *PRESETS, "--groups", "3",
                     "--out", str(out))
    assert result.returncode == 0, result.stderr
    for text in (*PRESETS, "success %", "95% interval", "43.9-100.0",
                 "valid-action %", f"wrote {out}"):
        assert text in result.stdout
    assert "eval oracle" in result.stderr  # the progress bar
    data = json.loads(out.read_text())
    assert data["policy"] == "oracle" and list(data["presets"]) == list(PRESETS)
    assert all(row["success"] == 1.0 and row["episodes"] == 3 for row in data["presets"].values())
    assert all(row["success_ci95"] == pytest.approx([0.438503, 1.0], abs=1e-6)
               for row in data["presets"].values())  # 3 of 3 games: Wilson's 95% interval
    assert data["seeds"] == list(SEED_RANGES["val"][:3])


def test_random_on_the_test_split(tmp_path, capsys):
    out = tmp_path / "random.json"
    code = main(["eval", "--policy", "random", "--presets", "blocksworld2dAgent", "--groups", "4",
                 "--split", "test", "--out", str(out), "--no-progress"])
    assert code == 0
    data = json.loads(out.read_text())
    assert all(seed in SEED_RANGES["test"] for seed in data["seeds"])
    assert data["presets"]["blocksworld2dAgent"]["action_is_valid"] < 1.0  # random moves
    captured = capsys.readouterr()
    assert "blocksworld2dAgent" in captured.out and captured.err == ""


def test_without_out_an_earlier_eval_is_kept_and_the_new_file_named(tmp_path, capsys,
                                                                    monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = ["eval", "--policy", "random", "--presets", "banditAgent", "--groups", "1",
            "--no-progress"]
    assert main(line) == 0
    first = (tmp_path / "eval_results.json").read_text()
    assert "wrote eval_results.json" in capsys.readouterr().out
    assert main([*line, "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "eval_results.json").read_text() == first  # not overwritten
    assert json.loads((tmp_path / "eval_results_2.json").read_text())["policy"] == "random"
    assert "wrote eval_results_2.json" in out and "eval_results.json is kept" in out
    assert main([*line, "--out", "eval_results.json"]) == 0  # named: replaced
    assert "wrote eval_results.json" in capsys.readouterr().out
    assert not (tmp_path / "eval_results_3.json").exists()


@pytest.mark.parametrize("args, message", [
    (["--presets", "simpleSokobanAgent", "chessAgent"], "unknown preset(s) ['chessAgent']"),
    (["--groups", "0"], "expected an integer >= 1"),
    (["--policy", "expert"], "invalid choice: 'expert'"),
    (["--temperature", "-1"], "argument --temperature: expected a number >= 0"),
])
def test_bad_options_exit_2_with_a_message(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_bad_preset_from_the_shell_names_the_allowed_ones():
    result = agentrl("eval", "--policy", "oracle", "--presets", "chessAgent")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "unknown preset(s) ['chessAgent']" in result.stderr
    assert "simpleSokobanAgent" in result.stderr and "'all'" in result.stderr


def test_select_presets():
    available = {"a": 1, "b": 2, "c": 3}
    assert list(select_presets(["c", "a", "c"], available)) == ["c", "a"]
    assert list(select_presets(["all"], available)) == ["a", "b", "c"]


class FakeModel:
    def save_pretrained(self, folder):  # as transformers does: the folder may not exist yet
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "config.json").write_text("{}")


def test_model_path_finds_the_actor_of_a_checkpoint_or_a_run(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(ValueError, match="--model: .*run: no such file or folder"):
        model_path(str(run))  # a path that is not there is named, not tried as a hub id
    assert model_path("embedded") == "embedded"
    assert model_path("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"  # a hub id
    first = save_checkpoint(run, 1, models={"actor": FakeModel()})
    newest = save_checkpoint(run, 2, models={"actor": FakeModel()})
    assert model_path(str(first)) == str(first / "actor")
    assert model_path(str(run)) == str(newest / "actor")


@pytest.mark.slow
def test_model_from_a_training_run(tiny, tmp_path, capsys, one_torch_thread):
    checkpoint = save_checkpoint(tmp_path / "run", 3, models={"actor": tiny})
    out = tmp_path / "model.json"
    code = main(["eval", "--model", str(tmp_path / "run"), "--presets", "simpleSokobanAgent",
                 "--groups", "1", "--max-new-tokens", "4", "--device", "cpu", "--out", str(out),
                 "--no-progress"])
    assert code == 0
    data = json.loads(out.read_text())
    assert data["policy"] == str(tmp_path / "run")
    assert data["model"]["path"] == str(checkpoint / "actor")
    assert data["model"]["sampling"]["greedy"] and data["model"]["sampling"]["max_new_tokens"] == 4
    assert data["model"]["generation"]["requests"] >= data["presets"]["simpleSokobanAgent"]["turns"]
    assert data["presets"]["simpleSokobanAgent"]["response_length"] > 0
    assert "simpleSokobanAgent" in capsys.readouterr().out


@pytest.fixture(scope="module")
def run_with_a_best(tmp_path_factory, tiny):
    """A run folder of the tiny model: the best checkpoint at step 1, the last at step 2."""
    from agentrl.trainers.checkpoint import BestRecord, write_best

    run = tmp_path_factory.mktemp("best") / "run"
    best = save_checkpoint(run, 1, models={"actor": tiny})
    write_best(run, BestRecord(step=1, val_success=0.5))
    last = save_checkpoint(run, 2, models={"actor": tiny}, keep_last=1, keep_steps=(1,))
    return run, best, last


@pytest.mark.parametrize("choice, expected", [(None, "best"), ("best", "best"),
                                              ("last", "last"), ("step_2", "last")])
def test_a_run_folder_is_evaluated_at_its_best_unless_asked(run_with_a_best, tmp_path, choice,
                                                           expected, one_torch_thread):
    run, best, last = run_with_a_best
    out = tmp_path / "e.json"
    chosen = [] if choice is None else ["--checkpoint", choice]
    assert main(["eval", "--model", str(run), *chosen, "--presets", "banditAgent", "--groups",
                 "1", "--max-new-tokens", "4", "--device", "cpu", "--out", str(out),
                 "--no-progress"]) == 0
    folder = {"best": best, "last": last}[expected]
    assert json.loads(out.read_text())["model"]["path"] == str(folder / "actor")


def test_a_checkpoint_the_run_does_not_have_is_named(run_with_a_best, tmp_path, capsys):
    run, best, last = run_with_a_best
    out = str(tmp_path / "e.json")
    for model, choice, message in ((run, "step_7", "step_000007: no such folder"),
                                   (last, "last", "is not a run folder")):
        with pytest.raises(SystemExit) as exit_info:
            main(["eval", "--model", str(model), "--checkpoint", choice, "--out", out])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err


# -- a run evaluates as it validated -----------------------------------------------------------
VAL_PRESETS = ("banditAgent", "tightBlocksworldTurnsAgent")  # one turn; six with a 1-turn window
COMPARED = ("success", "return", "turns", "action_is_valid", "format_error", "response_length")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, one_torch_thread):
    """A 1-step run of the tiny model: constrained decoding (the local default), replies cut at
    24 tokens, 4 validation games of two presets after its step (~15 s)."""
    run_dir = tmp_path_factory.mktemp("tiny_run") / "run"
    assert main(["train", "model=tiny", f"run_dir={run_dir}", "train.total_steps=1",
                 "train.presets=[banditAgent]", f"val.presets=[{','.join(VAL_PRESETS)}]",
                 "val.group_num=4", "train.group_num=1", "train.group_size=2",
                 "rollout.max_new_tokens=24", "threads=1", "trainer.logger=[]",
                 "trainer.plot=false", "val.before_train=false"]) == 0
    return run_dir


def test_evaluating_a_run_gives_its_last_validation_numbers(tiny_run, tmp_path, capsys):
    """No flags: the run's presets, games, constrained decoding, reply limit and history
    windows, so every number equals the run's own last validation."""
    from agentrl.trainers.tracking import read_metrics

    capsys.readouterr()
    out = tmp_path / "eval.json"
    assert main(["eval", "--model", str(tiny_run), "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    last = [r for r in read_metrics(tiny_run / "metrics.jsonl")
            if "val/banditAgent/success" in r][-1]
    assert list(data["presets"]) == list(VAL_PRESETS)
    for preset in VAL_PRESETS:
        assert data["presets"][preset]["episodes"] == 4
        for name in COMPARED:
            assert data["presets"][preset][name] == pytest.approx(last[f"val/{preset}/{name}"]), \
                (preset, name)
    decoding = data["decoding"]
    assert decoding["constrained"] is True and decoding["max_new_tokens"] == 24
    assert decoding["history_windows"] == {"banditAgent": 0, "tightBlocksworldTurnsAgent": "state"}
    assert data["model"]["sampling"]["constrained_actions"] is True
    assert "decoding: greedy, constrained to valid actions, replies up to 24 tokens" in printed
    assert ("tightBlocksworldTurnsAgent none (each turn its own chat)" in printed
            and "the run's config" in printed)


def test_a_flag_overrides_the_runs_decoding_and_says_so(tiny_run, tmp_path, capsys):
    out = tmp_path / "free.json"
    assert main(["eval", "--model", str(tiny_run), "--presets", "banditAgent", "--groups", "1",
                 "--no-constrained", "--max-new-tokens", "8", "--out", str(out),
                 "--no-progress"]) == 0
    decoding = json.loads(out.read_text())["decoding"]
    assert decoding["constrained"] is False and decoding["max_new_tokens"] == 8
    assert "free (unconstrained)" in capsys.readouterr().out
    assert "with --max-new-tokens, --no-constrained" in decoding["description"]


def test_the_report_of_the_run_and_of_its_eval_state_the_decoding(tiny_run, tmp_path):
    from agentrl.report.data import eval_data, run_data

    rows = dict(run_data(tiny_run, play_references=False)["config"]["summary"])
    assert rows["decoding"].startswith("validation greedy, constrained to valid actions, "
                                       "replies up to 24 tokens")
    out = tmp_path / "eval.json"
    assert main(["eval", "--model", str(tiny_run), "--presets", "banditAgent", "--groups", "1",
                 "--out", str(out), "--no-progress"]) == 0
    rows = dict(eval_data(out)["config"]["summary"])
    assert rows["decoding"].startswith("greedy, constrained to valid actions")


# -- a verl run folder -----------------------------------------------------------------------------
def verl_run(root: Path, tiny, steps=(1, 2), weights: bool = True) -> Path:
    """A run folder as agentrl's verl runs leave it (verl 0.9.1's checkpoint layout): the
    resolved config, and per step the actor's shards and, in ``actor/huggingface``, the whole
    model (``hf_model`` saved) or only its config and tokenizer (verl's default)."""
    import torch
    import yaml

    from agentrl.config import compose_config

    run = root / "run"
    run.mkdir(parents=True)
    config = compose_config(["model=tiny", "val.presets=[banditAgent]", "val.group_num=2"])
    (run / "config.yaml").write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
    for step in steps:
        actor = run / "checkpoints" / f"global_step_{step}" / "actor"
        actor.mkdir(parents=True)
        (actor / "fsdp_config.json").write_text('{"world_size": 1}')
        for kind in ("model", "optim", "extra_state"):
            torch.save({}, actor / f"{kind}_world_size_1_rank_0.pt")
        torch.save({}, actor.parent / "data.pt")
        if weights:
            for part in tiny:
                part.save_pretrained(actor / "huggingface")
        else:
            tiny[1].save_pretrained(actor / "huggingface")
            (actor / "huggingface" / "config.json").write_text("{}")
    (run / "checkpoints" / "latest_checkpointed_iteration.txt").write_text(str(steps[-1]))
    return run


def test_a_verl_run_is_evaluated_from_the_model_its_actor_saved(tiny, tmp_path,
                                                                one_torch_thread):
    from agentrl.trainers.verl_checkpoints import verl_run_of

    run = verl_run(tmp_path, tiny)
    hf = run / "checkpoints" / "global_step_{}" / "actor" / "huggingface"
    for choice, step in ((None, 2), ("last", 2), ("step_1", 1), ("1", 1)):
        chosen = [] if choice is None else ["--checkpoint", choice]
        out = tmp_path / f"eval_{choice}.json"
        assert main(["eval", "--model", str(run), *chosen, "--max-new-tokens", "4",
                     "--device", "cpu", "--out", str(out), "--no-progress"]) == 0
        data = json.loads(out.read_text())
        assert data["model"]["path"] == str(hf).format(step)
        assert verl_run_of(Path(data["model"]["path"])) == run.resolve()  # whose config it reads
        # it played as the run validated: the run's presets and games, from its config
        assert list(data["presets"]) == ["banditAgent"]
        assert data["presets"]["banditAgent"]["episodes"] == 2
        assert "config.yaml" in json.dumps(data["decoding"])


def test_a_verl_run_without_its_model_or_that_step_says_what_to_do(tiny, tmp_path, capsys):
    from agentrl.trainers.checkpoint import model_folder

    run = verl_run(tmp_path / "a", tiny)
    for choice, message in (("step_7", "global_step_7: actor: no readable fsdp_config.json"),
                            ("first", "checkpoint='first' is not allowed")):
        with pytest.raises(SystemExit) as exit_info:
            main(["eval", "--model", str(run), "--checkpoint", choice])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
    bare = verl_run(tmp_path / "b", tiny, weights=False)
    with pytest.raises(ValueError, match="verl saved no Hugging Face model .*global_step_2.*"
                                         "model_merger merge --backend fsdp"):
        model_folder(bare)
    (bare / "checkpoints" / "global_step_2" / "data.pt").write_bytes(b"cut")  # a kill mid-save
    with pytest.raises(ValueError, match="global_step_1/actor/huggingface"):
        model_folder(bare)  # the newest intact step, here step 1


def test_a_verl_run_started_from_an_sft_run_in_its_folder_still_starts_from_it(tiny, tmp_path):
    """`agentrl sft` then `agentrl train model=<run> run_dir=<run>`: the SFT checkpoint stays
    the run's starting model after verl saved steps beside it (a relaunch starts the same)."""
    from agentrl.trainers.checkpoint import model_folder

    run = verl_run(tmp_path, tiny)
    sft = save_checkpoint(run / "sft", 1, models={"actor": tiny})
    assert model_folder(run) == sft / "actor"
