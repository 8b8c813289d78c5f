"""The legacy trainer's probe for ``agentrl doctor`` (agentrl.verl.returns): per step, the value,
reward and return at the last model token of every cut row, through verl 0.9.1's own
compute_advantage, and the first step's batch saved."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from verl import DataProto
from verl.trainer.ppo import ray_trainer

from agentrl.verl import returns


def gae_batch(truncated: list[bool]) -> DataProto:
    """Two rows: model tokens, an observation (mask 0), a reply, then padding."""
    mask = torch.tensor([[1, 1, 0, 1, 0], [1, 1, 0, 1, 0]], dtype=torch.float32)
    rewards = torch.tensor([[0.0, 0.5, 0.0, 1.0, 0.0], [0.0, 0.5, 0.0, 2.0, 0.0]])
    values = torch.tensor([[1.0, 2.0, 9.0, 3.0, 9.0], [1.0, 2.0, 9.0, 4.0, 9.0]])
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "values": values,
                                        "response_mask": mask})
    data.non_tensor_batch[returns.TRUNCATED] = np.array(truncated, dtype=object)
    return data


def test_the_probe_records_each_cut_rows_last_model_token(monkeypatch, tmp_path):
    monkeypatch.setenv(returns.VALUE_CLIP_ENV, "returns")
    monkeypatch.setenv(returns.PROBE_ENV, str(tmp_path / "probe"))
    original = getattr(ray_trainer.compute_advantage, "__wrapped_by_agentrl__",
                       ray_trainer.compute_advantage)
    patched = returns._compute_advantage(original)
    for _ in range(2):
        patched(gae_batch([False, True]), "gae", gamma=1.0, lam=1.0, config={})
    lines = (tmp_path / "probe" / returns.CUT_EPISODES_FILE).read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records] == [1, 2]
    # only the cut row (the second), at its last model token (column 3): V 4, r 2, return r
    assert records[0]["rows"] == [pytest.approx({"value": 4.0, "reward": 2.0, "return": 2.0})]
    saved = DataProto.load_from_disk(str(tmp_path / "probe" / returns.PROBE_BATCH_FILE))
    assert saved.batch["returns"].shape == (2, 5)


def test_without_the_probe_nothing_is_written(monkeypatch, tmp_path):
    monkeypatch.delenv(returns.PROBE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    original = getattr(ray_trainer.compute_advantage, "__wrapped_by_agentrl__",
                       ray_trainer.compute_advantage)
    returns._compute_advantage(original)(gae_batch([True, True]), "gae", config={})
    assert list(tmp_path.iterdir()) == []


def test_constraint_violations_are_logged_per_preset_and_zero_when_none():
    """What the doctor's constrained row reads: every preset's batch record carries the count,
    0 included (a missing key would not tell a clean run from an unwired metric)."""
    from agentrl.rollout import EpisodeOutcome
    from agentrl.verl.metrics import batch_metrics, episode_outcomes

    def info(preset, seed, **metrics):
        return {**EpisodeOutcome(preset, seed, False, 0.0, 1, metrics, {}).to_dict(),
                "index": seed}

    outcomes = episode_outcomes([info("p", 1, constraint_violations=2.0), info("p", 2),
                                 info("q", 3)], per_row=1)
    for split in ("train", "val"):
        metrics = batch_metrics(outcomes, split)
        assert metrics[f"{split}/p/constraint_violations"] == 2.0
        assert metrics[f"{split}/q/constraint_violations"] == 0.0
