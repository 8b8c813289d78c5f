"""The verl task files: rows per the contract with the AgentLoop, and verl's own loader reading
them back in step order."""

from __future__ import annotations

import dataclasses
import json

import pyarrow.parquet as pq
import pytest

from agentrl.agents import Agent, agent_presets_from_dict
from agentrl.config import compose_config
from agentrl.envs.splits import split_of, split_seeds
from agentrl.envs.splits import train_seeds
from agentrl.verl import data
from agentrl.verl.launch import compose_verl_config, task_paths, verl_overrides

OVERRIDES = ["train.total_steps=3", "train.group_num=3", "train.group_size=2", "seed=5",
             "train.presets=[simpleSokobanAgent,tetrisType1Agent]", "val.group_num=2",
             "val.presets=[largeSokobanAgent,banditAgent]", "rollout.max_new_tokens=64",
             "val.max_new_tokens=32", "rollout.max_context_tokens=3000",
             "rollout.reward_placement=last"]


@pytest.fixture(scope="module")
def config():
    return compose_config(OVERRIDES)


@pytest.fixture(scope="module")
def written(config, tmp_path_factory):
    return data.write_tasks(config, tmp_path_factory.mktemp("tasks"))


def read(path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def test_training_rows_are_the_local_trainers_games_step_by_step(config, written):
    rows = read(written[0])
    assert len(rows) == config.train.total_steps * config.train.group_num
    for step in range(1, config.train.total_steps + 1):
        block = rows[(step - 1) * 3: step * 3]
        assert [r["extra_info"]["seed"] for r in block] == train_seeds(step, 3, config.seed)
        assert [r["data_source"] for r in block] == [
            "simpleSokobanAgent", "tetrisType1Agent", "simpleSokobanAgent"]  # group g % presets
    seeds = [r["extra_info"]["seed"] for r in rows]
    assert len(set(seeds)) == len(seeds) and {split_of(s) for s in seeds} == {"train"}
    assert [r["extra_info"]["index"] for r in rows] == list(range(len(rows)))


def test_validation_rows_are_every_preset_on_the_same_held_out_seeds(config, written):
    rows = read(written[1])
    seeds = split_seeds("val", config.val.group_num)
    assert [(r["data_source"], r["extra_info"]["seed"]) for r in rows] == [
        (preset, seed) for preset in config.val.presets for seed in seeds]
    assert {r["extra_info"]["split"] for r in rows} == {"val"}


@pytest.mark.parametrize("split", [0, 1])
def test_a_row_rebuilds_its_episode_without_our_config(config, written, split):
    """agent_config + seed alone reproduce the opening chat; the reply limit is folded in."""
    limit = config.rollout.max_new_tokens if split == 0 else config.val.max_new_tokens
    for row in read(written[split]):
        info = row["extra_info"]
        preset = info["preset"]
        rebuilt = agent_presets_from_dict({preset: json.loads(info["agent_config"])},
                                          check_envs=False)[preset]
        expected = dataclasses.replace(config.agents[preset], held_out_of=None,
                                       max_response_tokens=min(
                                           config.agents[preset].max_response_tokens, limit))
        assert rebuilt == expected
        with Agent(rebuilt) as agent:
            assert row["prompt"] == agent.reset(seed=info["seed"])
        assert row["agent_name"] == data.AGENT_NAME and preset == row["data_source"]
        assert row["reward_model"] == {"style": "rule", "ground_truth": ""}
        assert (info["max_context_tokens"], info["reward_placement"]) == (3000, "last")


def test_rows_parse_in_the_agent_loop(written):
    from agentrl.verl.agent_loop import EpisodeTask

    for path in written:
        for row in read(path):
            task = EpisodeTask.from_extra_info(row["extra_info"])
            assert (task.preset, task.seed) == (row["data_source"], row["extra_info"]["seed"])


def test_writing_again_gives_the_same_file_and_leaves_no_temporary(config, written, tmp_path):
    again = data.write_tasks(config, tmp_path)
    assert [read(path) for path in again] == [read(path) for path in written]
    assert sorted(p.name for p in tmp_path.iterdir()) == [data.TRAIN_FILE, data.VAL_FILE]


def test_presets_may_repeat_to_weight_them(config):
    preset = config.agents["banditAgent"]
    rows = data.task_rows([("banditAgent", preset), ("banditAgent", preset),
                           ("simpleSokobanAgent", config.agents["simpleSokobanAgent"])],
                          range(6), "train", max_context_tokens=100, reward_placement="turn",
                          first_index=10)
    assert [r["data_source"][0] for r in rows] == list("bbsbbs")
    assert [r["extra_info"]["index"] for r in rows] == list(range(10, 16))


@pytest.mark.slow
def test_verl_loads_the_files_in_step_order(config, written, tmp_path, monkeypatch):
    """verl's RLHFDataset, sampler and collate_fn, with the data config the launcher composes:
    batch ``s`` is step ``s``'s groups, and every column reaches the AgentLoop's kwargs."""
    import datasets
    from torch.utils.data import DataLoader
    from verl.trainer.ppo.utils import create_rl_sampler
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    from agentrl.models import load_tokenizer

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    tokenizer = load_tokenizer("embedded")
    verl_config = compose_verl_config(verl_overrides(config, written), validate=False)
    data_config = verl_config.data
    data_config.filter_overlong_prompts = True  # tokenizes each prompt: all fit in the budget
    dataset = RLHFDataset([str(written[0])], tokenizer, data_config)
    rows = read(written[0])
    assert len(dataset) == len(rows)

    loader = DataLoader(dataset, batch_size=data_config.train_batch_size, collate_fn=collate_fn,
                        sampler=create_rl_sampler(data_config, dataset), drop_last=True)
    for step, batch in enumerate(loader, start=1):
        assert [info["seed"] for info in batch["extra_info"]] == train_seeds(step, 3, config.seed)
        first = rows[(step - 1) * 3]
        assert list(batch["agent_name"]) == [data.AGENT_NAME] * 3
        assert batch["raw_prompt"][0] == first["prompt"]
        assert batch["extra_info"][0] == first["extra_info"]
        assert batch["data_source"][0] == first["data_source"]
        assert batch["index"][0] == first["extra_info"]["index"]
    assert step == config.train.total_steps


SMALL = ["train.total_steps=1", "train.group_num=2", "train.group_size=1", "val.group_num=1",
         "train.presets=[simpleSokobanAgent]", "val.presets=[simpleSokobanAgent]"]
WINDOWED = ["train.presets=[tightBlocksworldTurnsAgent]",  # context: state, replies of 32
            "val.presets=[tightBlocksworldTurnsAgent]"]


@pytest.mark.parametrize(("overrides", "message"), [
    (["verl.max_prompt_length=64"],
     r"the first prompt of preset 'simpleSokobanAgent' \(seed \d+\) has \d{3} tokens, more than "
     r"verl.max_prompt_length=64 .*allowed: verl.max_prompt_length >= \d{3}"),
    (["rollout.max_context_tokens=128"],
     r"preset 'simpleSokobanAgent' .* leaves no room for a reply in "
     r"rollout.max_context_tokens=128; allowed: rollout.max_context_tokens >= \d{3}"),
    ([*WINDOWED, "verl.max_response_length=16"],
     r"agents.tightBlocksworldTurnsAgent.max_response_tokens=32 \(with rollout.max_new_tokens\) "
     r"is not allowed with context windows and verl.max_response_length=16"),
    ([*WINDOWED, "rollout.max_context_tokens=120"],
     r"preset 'tightBlocksworldTurnsAgent' .* has 1\d\d tokens, which with a whole reply of "
     r"agents.tightBlocksworldTurnsAgent.max_response_tokens=32 .* needs 1\d\d tokens of "
     r"rollout.max_context_tokens=120"),
])
def test_a_first_prompt_verl_cannot_play_is_refused_when_the_tasks_are_written(
        overrides, message, tmp_path):
    """The AgentLoop would raise when verl reached the row, minutes or hours into the run; the
    task files measure every first prompt with the model's tokenizer and write nothing."""
    config = compose_config([*SMALL, *overrides])
    with pytest.raises(ValueError, match=message):
        data.write_tasks(config, tmp_path / "data")
    assert not (tmp_path / "data").exists()


def test_task_paths_live_in_the_run_dir(config):
    train, val = task_paths(config)
    assert train.parent == val.parent == config.run_dir / "data"
