"""verl task files for BabyAI and TextWorldExpress presets: each row rebuilds its episode."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from agentrl.agents import Agent, agent_presets_from_dict
from agentrl.config import compose_config
from agentrl.verl import data

OVERRIDES = ["train.total_steps=2", "train.group_num=2", "train.group_size=2",
             "train.presets=[babyaiGoTo3Agent,twxCookingAgent]", "val.group_num=2",
             "val.presets=[babyaiGoTo8Agent,babyaiDoorKeyLargeAgent,twxCoinHardAgent]",
             "rollout.max_new_tokens=64", "val.max_new_tokens=32"]


def test_rows_rebuild_the_opening_chat_and_parse_in_the_agent_loop(tmp_path):
    from agentrl.verl.agent_loop import EpisodeTask

    config = compose_config(OVERRIDES)
    written = data.write_tasks(config, tmp_path)
    presets = set()
    for path in written:
        for row in pq.read_table(path).to_pylist():
            info = row["extra_info"]
            preset = info["preset"]
            presets.add(preset)
            rebuilt = agent_presets_from_dict({preset: json.loads(info["agent_config"])},
                                              check_envs=False)[preset]
            assert (rebuilt.game, rebuilt.env_kwargs) == (config.agents[preset].game,
                                                          config.agents[preset].env_kwargs)
            with Agent(rebuilt) as agent:
                assert row["prompt"] == agent.reset(seed=info["seed"])
            task = EpisodeTask.from_extra_info(info)
            assert (task.preset, task.seed) == (row["data_source"], info["seed"])
    assert presets == {"babyaiGoTo3Agent", "twxCookingAgent", "babyaiGoTo8Agent",
                       "babyaiDoorKeyLargeAgent", "twxCoinHardAgent"}
