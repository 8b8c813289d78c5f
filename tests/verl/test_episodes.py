"""agentrl.verl.episodes: verl's batches give the local engine's episode records: padding copies
left out, a sample per step and split, a WandB table in verl's step, uncommitted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from omegaconf import OmegaConf

from agentrl.trainers.episode_log import read_episodes
from agentrl.verl.episodes import VerlEpisodeLog, unpadded_records

ROOT = Path(__file__).resolve().parents[2]


def record(preset: str, seed: int) -> dict:
    return {"split": "", "preset": preset, "seed": seed, "success": False, "return": 0.0,
            "num_turns": 1, "turns_left_out": 0,
            "turns": [{"observation": "#P#", "reply": "hi", "actions": [], "reward": 0.0,
                       "format_error": True, "cut_by_length": False, "dropped_context": False}]}


def test_copies_past_n_per_row_are_left_out():
    records = [record("p", 1), record("p", 1), record("p", 2), None]
    infos = [{"index": 0}, {"index": 0}, {"index": 1}, None]
    assert unpadded_records(records, infos, per_row=1) == [records[0], records[2]]
    assert len(unpadded_records(records, infos, per_row=2)) == 3


def test_the_launch_key_sets_the_count_and_the_run_folder(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "wandb", SimpleNamespace(
        run=SimpleNamespace(log=lambda values, **kwargs: calls.append((values, kwargs))),
        Table=lambda columns, data: ("table", len(data))))
    config = OmegaConf.create({"trainer": {"default_local_dir": str(tmp_path / "checkpoints"),
                                           "logger": ["wandb"], "agentrl_log_episodes": 1}})
    log = VerlEpisodeLog.for_verl(config)
    written = log.log_batch([record("p", 1), record("p", 2)], [None, None],
                            {"global_steps": 3, "validate": True}, per_row=1)
    assert [(r["seed"], r["split"], r["step"]) for r in written] == [(1, "val", 3)]
    assert read_episodes(tmp_path) == {3: written}
    assert calls == [({"episodes/val": ("table", 1)}, {"step": 3, "commit": False})]
    assert log.log_batch([record("p", 1)], None, {}, per_row=1) == []  # no step: nothing


def test_a_v1_batch_is_logged_once_per_episode_whatever_its_windows(tmp_path):
    """V1 keys are ``{uid}_{session}_{window}``: every window row carries its episode's outcome
    and record, and the episode counts once in the metrics and the records."""
    from agentrl.rollout import EpisodeOutcome
    from agentrl.trainers.tracking import read_metrics
    from agentrl.verl.episodes import episode_rows, log_rows
    from agentrl.verl.metrics import EpisodeMetricsLog
    from agentrl.verl.rows import EPISODE_INFO, EPISODE_RECORD

    keys = ["u1_0_0", "u1_0_1", "u1_0_2", "u1_1_0", "u2_0_0", "u2_0_1"]
    assert episode_rows(keys) == [0, 3, 4]
    assert episode_rows(["a_b_c_0_1", "a_b_c_0_0", "plain"]) == [0, 2]  # uids with "_"
    wins = {"u1_0": True, "u1_1": False, "u2_0": False}
    fields = []
    for key in keys:
        session = key.rsplit("_", 1)[0]
        seed = int(session[1])
        outcome = EpisodeOutcome("p", seed, wins[session], 1.0 if wins[session] else 0.0, 3,
                                 {"format_errors": 0.0}, {"generate_s": 0.5})
        fields.append({EPISODE_INFO: {**outcome.to_dict(), "index": seed},
                       EPISODE_RECORD: record("p", seed), "reward_extra_info": {}})
    metrics = EpisodeMetricsLog(tmp_path, use_wandb=False, console=False)
    episodes = VerlEpisodeLog(tmp_path, 8, use_wandb=False, console=False)
    logged = log_rows(metrics, episodes, keys, fields, {"global_steps": 2}, per_row=2)
    assert logged["train/p/success"] == 1 / 3 and logged["train/p/episodes"] == 3
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [2]
    assert sorted(r["seed"] for r in read_episodes(tmp_path)[2]) == [1, 1, 2]


REPLAY_BUFFER_SCRIPT = """
import json, sys
from omegaconf import OmegaConf
from tensordict import NonTensorStack
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
from agentrl.rollout import EpisodeOutcome
from agentrl.verl import agent_loop_v1
from agentrl.verl.agent_loop import SAMPLER_KWARGS
from agentrl.verl.rows import EPISODE_INFO, EPISODE_RECORD

run_dir = sys.argv[1]
config = OmegaConf.create({
    "trainer": {"default_local_dir": run_dir + "/checkpoints", "logger": ["console"],
                "agentrl_log_episodes": 4},
    "actor_rollout_ref": {"rollout": {"n": 2, "val_kwargs": {"n": 1}}},
    "kwargs": {key: "${" + source + "}" for key, source in SAMPLER_KWARGS.items()}})
OmegaConf.resolve(config)  # as verl's V1 TaskRunner does
buffer = agent_loop_v1.GameReplayBuffer(
    trainer_mode="sync", trainer_config={}, max_off_policy_threshold=8,
    max_off_policy_strategy="drop", sampler_kwargs=config.kwargs, refill_fn=None)
keys = ["u_0_0", "u_0_1", "u_1_0"]  # session 0: two windows
ReplayBuffer.sample = lambda self, steps, partition, size: (
    KVBatchMeta(partition_id=partition, keys=keys, tags=[{}] * 3), {"verl": 1})

def fields(key):
    session = int(key.split("_")[1])
    outcome = EpisodeOutcome("p", 7, session == 0, 1.0, 2, {"format_errors": 0.0}, {})
    record = {"split": "", "preset": "p", "seed": 7, "success": session == 0, "return": 1.0,
              "num_turns": 2, "turns_left_out": 0, "turns": []}
    return {EPISODE_INFO: {**outcome.to_dict(), "index": 0}, EPISODE_RECORD: record}

asked = []
def kv_batch_get(keys, partition_id, select_fields):
    asked.append((partition_id, select_fields))
    rows = [fields(key) for key in keys]  # TransferQueue 0.1.11 gives a list (LinkedList)
    return {"extra_fields": rows if partition_id == "train" else NonTensorStack(*rows)}

agent_loop_v1.tq.kv_batch_get = kv_batch_get
batch, metrics = buffer.sample(3, "train", 1)
assert batch.keys == keys and metrics == {"verl": 1}
buffer.sample(3, "val", 1)
print(json.dumps(asked))
"""


def test_v1s_replay_buffer_logs_each_batch_it_hands_the_trainer(tmp_path):
    """Our V1 replay buffer, built as verl builds a custom sampler (its settings resolved from
    verl's keys), reads a batch's extra_fields from TransferQueue and logs it: one episode per
    session, training and validation. Needs TransferQueue (the verl CPU venv)."""
    from verl_runs import v1_python

    from agentrl.trainers.tracking import read_metrics

    python = v1_python()
    script = tmp_path / "buffer.py"
    script.write_text(REPLAY_BUFFER_SCRIPT)
    done = subprocess.run([python, str(script), str(tmp_path)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [["train", ["extra_fields"]],
                                                               ["val", ["extra_fields"]]]
    train, val = read_metrics(tmp_path / "metrics.jsonl")
    assert (train["step"], train["train/p/episodes"], train["train/p/success"]) == (3, 2, 0.5)
    assert (val["step"], val["val/p/episodes"]) == (3, 1)  # val n=1: one per task row
    assert {r["split"] for r in read_episodes(tmp_path)[3]} == {"train", "val"}
