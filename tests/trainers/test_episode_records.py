"""Episode records: the local trainer writes a bounded sample of finished episodes per step and
split to <run_dir>/episodes/step_N.jsonl, replaces the steps it redoes after a resume, and the
record format, sampling and bounds behave as documented."""

from __future__ import annotations

import json
import shutil

import pytest

from agentrl.rollout.episode_record import (
    MAX_TEXT_CHARS,
    MAX_TURNS,
    clip_text,
    episode_record,
    episode_table,
    sample_episodes,
    sample_line,
)
from agentrl.rollout.records import Trajectory, Turn
from agentrl.trainers.episode_log import EpisodeLog, read_episodes

STEPS = 2
OVERRIDES = ["model=tiny", f"train.total_steps={STEPS}", "train.group_num=2", "train.group_size=2",
             "train.presets=[simpleSokobanAgent]", "val.presets=[simpleSokobanAgent]",
             "val.group_num=2", "val.test_freq=1", "rollout.max_new_tokens=12", "threads=1",
             "trainer.save_freq=1", "trainer.keep_last=5", "trainer.logger=[]",
             "trainer.plot=false", "trainer.log_episodes=3"]


def run_local(run_dir, *extra):
    from agentrl.config import compose_config
    from agentrl.trainers.local import LocalTrainer

    trainer = LocalTrainer(compose_config([*OVERRIDES, f"run_dir={run_dir}", *extra]))
    try:
        return trainer.fit()
    finally:
        trainer.close()


@pytest.fixture(scope="module")
def trained(tmp_path_factory, one_torch_thread):
    run_dir = tmp_path_factory.mktemp("records") / "run"
    run_local(run_dir)
    return run_dir


def test_local_run_writes_a_sample_per_step_and_split(trained):
    episodes = read_episodes(trained)
    assert list(episodes) == [0, 1, 2]  # 0: validation before training
    assert {r["split"] for r in episodes[0]} == {"val"}
    for step in (1, 2):
        splits = [r["split"] for r in episodes[step]]
        # 3 of the 4 training episodes (never the whole batch); both validation games
        assert splits.count("train") == 3 and splits.count("val") == 2
    val_seeds = [[r["seed"] for r in episodes[s] if r["split"] == "val"] for s in (0, 1, 2)]
    assert val_seeds[0] == val_seeds[1] == val_seeds[2]  # the same held-out games every time
    train = [r for r in episodes[1] if r["split"] == "train"]
    assert len({r["seed"] for r in train}) == 2  # both groups' seeds before a repeat
    record = train[0]
    assert record["step"] == 1 and record["preset"] == "simpleSokobanAgent"
    assert record["num_turns"] == len(record["turns"]) >= 1
    first = record["turns"][0]
    assert "#" in first["observation"]  # the board the first reply answered
    assert isinstance(first["reply"], str)
    assert {"reward", "format_error", "cut_by_length", "dropped_context", "actions"} <= set(first)
    assert record["return"] == pytest.approx(sum(t["reward"] for t in record["turns"]))


@pytest.mark.slow  # trains again after a resume
def test_resume_replaces_the_redone_steps_and_keeps_the_rest(trained, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    before = read_episodes(run_dir)
    # as if killed after logging step 2 but before its checkpoint: resume redoes step 2
    shutil.rmtree(run_dir / "checkpoints" / "step_000002")
    run_local(run_dir)
    after = read_episodes(run_dir)
    assert list(after) == [0, 1, 2]
    assert after[0] == before[0] and after[1] == before[1]  # kept as they were
    assert [r["split"] for r in after[2]].count("train") == 3  # redone once, not appended

    run_local(run_dir, "resume=never")  # a fresh start in the same folder: history afresh
    assert list(read_episodes(run_dir)) == [0, 1, 2]
    assert [r["split"] for r in read_episodes(run_dir)[2]].count("train") == 3


def test_log_episodes_zero_writes_nothing(tmp_path, one_torch_thread):
    run_local(tmp_path / "run", "trainer.log_episodes=0", "train.total_steps=1")
    assert read_episodes(tmp_path / "run") == {}


# -- the record ------------------------------------------------------------------------------------
def trajectory(preset="p", seed=0, turns=1, text="<answer>Up</answer>", observation="#P#"):
    turn = Turn(prompt_ids=(), response_ids=(), logprobs=(), reward=-0.1, format_ok=False,
                num_actions=2, num_valid=1, num_effective=1, truncated_by_length=True, text=text,
                context_start=5, observation=observation, actions=("Up", "Left"),
                action_valid=(True, False))
    return Trajectory(preset=preset, seed=seed, group_index=0, prompt_ids=[], response_ids=[],
                      response_mask=[], response_logprobs=[], turn_end_positions=[],
                      turn_rewards=[], success=False, episode_return=-0.1 * turns,
                      num_turns=turns, turns=[turn] * turns)


def test_a_record_holds_each_turns_flags_and_action_validity():
    record = episode_record(trajectory(), split="train", step=7)
    turn = record["turns"][0]
    assert turn["actions"] == [{"action": "Up", "valid": True}, {"action": "Left", "valid": False}]
    assert turn["format_error"] and turn["cut_by_length"] and turn["dropped_context"]
    assert json.loads(json.dumps(record)) == record
    columns, rows = episode_table([record])
    assert rows[0][columns.index("actions")] == "Up, Left!"
    assert rows[0][columns.index("flags")] == "format_error cut_by_length dropped_context"


def test_records_are_bounded_however_long_the_model_rambles():
    long = "!" * 50_000 + "BOARD"
    record = episode_record(trajectory(turns=500, text=long, observation=long), split="val")
    assert len(record["turns"]) == MAX_TURNS and record["turns_left_out"] == 500 - MAX_TURNS
    turn = record["turns"][0]
    assert len(turn["reply"]) < MAX_TEXT_CHARS + 60 and turn["observation"].endswith("BOARD")
    assert len(json.dumps(record)) < 2.2 * MAX_TEXT_CHARS * MAX_TURNS
    assert clip_text("short") == "short"


def test_sampling_takes_presets_in_turn_and_new_seeds_first():
    episodes = [trajectory("a", 1), trajectory("a", 1), trajectory("a", 2), trajectory("b", 9)]
    picked = sample_episodes(episodes, 3)
    assert [(t.preset, t.seed) for t in picked] == [("a", 1), ("b", 9), ("a", 2)]
    assert sample_episodes(episodes, 0) == []
    assert len(sample_episodes(episodes, 10)) == 4


def test_the_console_line_shows_a_short_reply_and_its_flags():
    record = episode_record(trajectory(text="!" * 500), split="val", step=3)
    line = sample_line([record])
    assert line.startswith("val sample p seed 0: '!!!") and "format_error" in line
    assert len(line) < 200
    assert sample_line([]) is None


def test_a_split_replaces_only_its_own_records_of_a_step(tmp_path):
    log = EpisodeLog(tmp_path)
    log.write(3, [{"split": "train", "n": 1}])
    log.write(3, [{"split": "val", "n": 2}])
    log.write(3, [{"split": "train", "n": 3}])
    assert read_episodes(tmp_path) == {3: [{"split": "val", "n": 2, "step": 3},
                                           {"split": "train", "n": 3, "step": 3}]}
    # a new process (verl after a resume): its first write of a split drops that split's later steps
    log.write(4, [{"split": "train", "n": 4}])
    again = EpisodeLog(tmp_path)
    again.write(3, [{"split": "train", "n": 5}])
    assert read_episodes(tmp_path) == {3: [{"split": "val", "n": 2, "step": 3},
                                           {"split": "train", "n": 5, "step": 3}]}
    assert not list((tmp_path / "episodes").glob(".*"))  # no temporary files left


# -- WandB and the console -------------------------------------------------------------------------
class FakeTable:
    def __init__(self, columns, data):
        self.columns, self.data = columns, data


def test_wandb_gets_the_episodes_as_a_table_and_the_console_a_sampled_reply(
        tmp_path, monkeypatch, capsys):
    import sys
    from types import SimpleNamespace

    from agentrl.trainers.tracking import RunTracker

    logged = []
    run = SimpleNamespace(log=lambda values, step: logged.append((step, values)),
                          finish=lambda exit_code: None)
    fake = SimpleNamespace(init=lambda **kwargs: run, Settings=lambda **kwargs: None,
                           Table=FakeTable)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    records = [episode_record(trajectory("p", 5, turns=2, text="!!!!!"), split="val", step=1),
               episode_record(trajectory("q", 6, turns=1), split="train", step=1)]
    with RunTracker(tmp_path, project="t", experiment="e", use_wandb=True, wandb_mode="offline",
                    console=True) as tracker:
        tracker.log(1, {"val/p/success": 0.0}, records)
        tracker.log(2, {"val/p/success": 0.0})
    (step, values), (_, plain) = logged
    table = values["episodes"]
    assert step == 1 and values["val/p/success"] == 0.0 and "episodes" not in plain
    assert len(table.data) == 3  # one row per turn: 2 + 1
    assert [row[table.columns.index("reply")] for row in table.data[:2]] == ["!!!!!"] * 2
    printed = capsys.readouterr().out
    assert "  val sample p seed 5: '!!!!!' reward -0.10" in printed
    assert printed.count("sample") == 1  # validation's, not training's
