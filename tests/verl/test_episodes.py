"""agentrl.verl.episodes: verl's batches give the local engine's episode records: padding copies
left out, a sample per step and split, a WandB table in verl's step, uncommitted."""

from __future__ import annotations

import sys
from types import SimpleNamespace

from omegaconf import OmegaConf

from agentrl.trainers.episode_log import read_episodes
from agentrl.verl.episodes import VerlEpisodeLog, unpadded_records


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
