"""scripts/bench/dagger.py: the oracle's labels land on the boards and contexts the policy saw,
and a tiny-model run writes its held-out curve."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from agentrl.agents import Agent
from agentrl.config import build_config
from agentrl.envs.splits import split_seeds
from agentrl.rollout.demonstrations import play_demonstrations
from agentrl.trainers.checkpoint import latest_checkpoint

PRESET = "tightBlocksworldTurnsAgent"


@pytest.fixture(scope="module")
def bench(load_script):
    return load_script("scripts/bench/dagger.py")


@pytest.fixture(scope="module")
def played(tiny):
    """Episodes with random moves among the oracle's (random turns: response_mask 0), so some
    boards were left by a move that did not close the distance; each turn is its own chat
    (``context: state``), so no later turn's context holds the first prompt."""
    _, tokenizer = tiny
    presets = build_config({}).playing_presets([PRESET], 32)
    episodes = asyncio.run(play_demonstrations(
        presets, tokenizer, split_seeds("train", 16, 7), max_context_tokens=2048,
        max_new_tokens=32, random_action_share=0.4, seed=5))
    return presets[0][1], tokenizer, episodes


def random_turns(episode):
    return [episode.response_mask[end] == 0 for end in episode.turn_end_positions]


def test_every_turn_gets_the_oracles_reply_in_the_policys_context(bench, played):
    config, tokenizer, episodes = played
    assert any(any(random_turns(e)) for e in episodes), "some kept episode has a random move"
    assert any(t.fresh_context for e in episodes for t in e.turns), "a turn opened its own chat"
    with Agent(config) as agent:
        for episode in episodes:
            rows = bench.oracle_rows(episode, agent, tokenizer, keep="all",
                                    max_new_tokens=32)
            assert [row.group_index for row in rows] == list(range(episode.num_turns))
            for k, (row, turn, was_random) in enumerate(zip(rows, episode.turns,
                                                             random_turns(episode))):
                seen = row.prompt_ids
                assert seen == episode.turn_context(k)  # the context the policy sampled from
                opening = [] if turn.fresh_context else list(episode.prompt_ids)
                assert seen[:len(opening)] == opening  # a fresh chat is the turn's own
                assert seen[len(seen) - len(turn.prompt_ids):] == list(turn.prompt_ids)
                text = tokenizer.decode(row.response_ids, skip_special_tokens=True)
                if not was_random:  # the oracle played this board: the label is its move
                    assert text == turn.text
                assert row.response_mask == [1] * len(row.response_ids)


def test_corrections_keep_only_the_moves_that_missed_the_oracles_distance(bench, played):
    config, tokenizer, episodes = played
    kept = 0
    with Agent(config) as agent:
        for episode in episodes:
            rows = bench.oracle_rows(episode, agent, tokenizer, keep="corrections",
                                    max_new_tokens=32)
            flags = random_turns(episode)
            assert all(flags[row.group_index] for row in rows)  # the oracle's moves are optimal
            for row in rows:  # a random move that closed the distance would not be kept
                assert row.turns[0].text != episode.turns[row.group_index].text
            kept += len(rows)
    assert kept > 0



def test_on_path_rows_leave_out_exactly_the_boards_a_missed_move_led_to(bench, played):
    config, tokenizer, episodes = played
    skipped = 0
    with Agent(config) as agent:
        for episode in episodes:
            missed = {row.group_index for row in bench.oracle_rows(
                episode, agent, tokenizer, keep="corrections", max_new_tokens=32)}
            kept = [row.group_index for row in bench.oracle_rows(
                episode, agent, tokenizer, keep="on_path", max_new_tokens=32)]
            after_missed = {index + 1 for index in missed if index + 1 < episode.num_turns}
            assert kept == [i for i in range(episode.num_turns) if i not in after_missed]
            skipped += len(after_missed)
    assert skipped > 0

@pytest.mark.slow
def test_a_tiny_run_writes_its_held_out_curve(bench, tmp_path, one_torch_thread):
    out = tmp_path / "dagger.json"
    result = bench.main(["--model", "tiny", "--max-steps", "2", "--games", "2", "--val-groups",
                         "2", "--val-every", "1", "--out", str(out), "--save",
                         str(tmp_path / "policy"), "actor.warm_optimizer=false", "sft.lr=3e-5",
                         "threads=1"])
    assert result["lr"] == 3e-5  # the update steps at the warm start's rate, sft.lr
    assert json.loads(out.read_text()) == result
    assert [p["step"] for p in result["held_out"]] == [0, 1, 2]
    assert latest_checkpoint(tmp_path / "policy").name == "step_000002"
    assert [s["step"] for s in result["steps"]] == [1, 2] and result["episodes"] == 4
    assert result["rows_learned"] == sum(s["rows"] for s in result["steps"]) > 0
    for point in result["held_out"]:
        low, high = point["success_ci95"]
        assert point["games"] == 2 and low <= point["success"] <= high


@pytest.mark.slow
def test_the_oracle_control_learns_whole_demonstrations(bench, tmp_path, one_torch_thread):
    result = bench.main(["--model", "tiny", "--labels", "oracle", "--max-steps", "1", "--games",
                         "2", "--val-groups", "2", "--out", str(tmp_path / "control.json"),
                         "actor.warm_optimizer=false", "threads=1"])
    (step,) = result["steps"]
    assert step["train_success"] == 1.0  # the oracle solves every game it plays
    assert step["rows"] >= 2 and result["labels"] == "oracle"


@pytest.mark.slow
def test_both_learns_the_oracles_episodes_and_its_labels_of_the_policys_boards(bench,
                                                                               one_torch_thread):
    args = bench.parse_args(["--model", "tiny", "--labels", "both", "--games", "2",
                             "actor.warm_optimizer=false", "threads=1"])
    trainer = bench.LocalTrainer(bench.build(args))
    agent = Agent(dict(trainer.train_presets)[args.preset])
    seeds = [11, 12]
    try:
        rows, played = bench.step_rows(trainer, agent, args, seeds, step=1)
    finally:
        agent.close()
        trainer.close()
    demonstrations, labels = rows[:len(seeds)], rows[len(seeds):]
    assert [d.seed for d in demonstrations] == seeds and all(d.success for d in demonstrations)
    assert sorted(e.seed for e in played) == seeds  # the reported episodes are the policy's
    assert len(labels) == sum(e.num_turns for e in played)  # one labelled row a policy turn
    assert all(row.num_turns == 1 and row.seed in seeds for row in labels)


def test_bad_budgets_are_refused(bench, capsys):
    for argv in (["--games", "0"], ["--minutes", "0"], ["--val-every", "-1"]):
        with pytest.raises(SystemExit):
            bench.parse_args(["--model", "tiny", *argv])
        assert "must be" in capsys.readouterr().err


def test_labels_move_the_block_just_moved_only_after_a_missed_move(bench, played):
    """A shortest plan never moves one block twice in a row, so after an optimal move (the
    oracle's, or a random one that happened to close the distance) no label does; after a
    random move that missed, the correction of that block is common."""
    config, _, episodes = played
    counts = Counter()
    with Agent(config) as agent:
        for episode in episodes:
            counts.update(bench.label_relations(episode, agent))
    assert counts["after_optimal", "rows"] > 0 and counts["after_missed", "rows"] > 0
    assert counts["after_optimal", "same_block"] == 0
    assert counts["after_missed", "same_block"] > 0
    assert counts["after_missed", "undo"] <= counts["after_missed", "same_block"]
    assert counts["after_optimal", "rows"] + counts["after_missed", "rows"] <= sum(
        e.num_turns - 1 for e in episodes)


def test_label_relations_refuse_other_games(bench):
    presets = dict(build_config({}).playing_presets(["simpleSokobanAgent"], 32))
    with Agent(presets["simpleSokobanAgent"]) as agent:
        with pytest.raises(ValueError, match="BlocksWorld"):
            bench.label_relations(None, agent)


@pytest.mark.slow
def test_label_stats_play_once_and_train_nothing(bench, tmp_path, one_torch_thread):
    out = tmp_path / "labels.json"
    result = bench.main(["--model", "tiny", "--label-stats", "--games", "3", "--out", str(out),
                         "actor.warm_optimizer=false", "threads=1"])
    assert json.loads(out.read_text()) == result
    assert result["games"] == 3 and 0 <= result["wins"] <= 3
    rows = sum(row["rows"] for row in result["labels"].values())
    assert result["labels"]["after_optimal"]["same_block"] == 0 and rows > 0
    assert "held_out" not in result  # no validation, no training


def test_every_row_choice_and_label_stats_parse(bench):
    for rows in ("all", "corrections", "on_path"):
        assert bench.parse_args(["--model", "tiny", "--rows", rows]).rows == rows
    assert bench.parse_args(["--model", "tiny", "--label-stats"]).label_stats


class _Folder:
    """A model folder's stand-in: what a checkpoint needs to be found, no weights."""

    def save_pretrained(self, folder):
        from pathlib import Path

        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "config.json").write_text("{}")


def _run_folder(tmp_path):
    """A run trained on blocksworldTextAgent with its own decoding: free, 24-token replies at
    temperature 0.7, two turns of history, a 1024-token context."""
    from agentrl.config import compose_config
    from agentrl.trainers.checkpoint import save_checkpoint

    config = compose_config(["train.presets=[blocksworldTextAgent]",
                             "val.presets=[blocksworldTextAgent]",
                             "rollout.constrained_actions=false", "rollout.max_new_tokens=24",
                             "rollout.temperature=0.7", "rollout.max_context_tokens=1024",
                             "agents.blocksworldTextAgent.history_window=2"])
    save_checkpoint(tmp_path / "run", 3, models={"actor": _Folder()}, config=config.to_dict())
    return tmp_path / "run"


def test_a_run_plays_with_its_own_decoding_unless_an_override_says_otherwise(bench, tmp_path):
    run = _run_folder(tmp_path)
    config = bench.build(bench.parse_args(["--model", str(run)]))
    assert list(config.train.presets) == list(config.val.presets) == ["blocksworldTextAgent"]
    assert config.constrained_actions is False
    assert config.rollout.max_new_tokens == 24 and config.rollout.temperature == 0.7
    assert config.rollout.max_context_tokens == 1024
    assert config.model.name == str(run / "checkpoints" / "step_000003" / "actor")
    assert config.agents["blocksworldTextAgent"].history_window == 2
    given = bench.build(bench.parse_args(["--model", str(run), "--preset", PRESET,
                                          "rollout.max_new_tokens=16",
                                          "rollout.constrained_actions=true"]))
    assert list(given.train.presets) == [PRESET]
    assert given.rollout.max_new_tokens == 16 and given.constrained_actions is True
    assert given.rollout.temperature == 0.7  # what no override names stays the run's
    window = bench.build(bench.parse_args([
        "--model", str(run), "agents.blocksworldTextAgent.history_window=1"]))
    assert window.agents["blocksworldTextAgent"].history_window == 1
    assert bench.decoding(config, bench.parse_args(["--model", str(run)])).startswith(
        "rollout sampled at temperature 0.7, replies up to 24 tokens; held-out greedy, free")
    plain = bench.build(bench.parse_args(["--model", "tiny"]))  # no run: base.yaml's decoding
    assert list(plain.train.presets) == [PRESET] and plain.rollout.max_new_tokens != 24
