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
