"""``rollout.turn_branches``: PPO trains on each turn's sampled replies, a group a turn."""

from __future__ import annotations

from agentrl.config import compose_config
from agentrl.trainers.local import LocalTrainer

PRESET = "tightBlocksworldTurnsAgent"


def test_a_step_trains_one_row_per_sampled_reply(tmp_path, one_torch_thread):
    """One episode, two more replies at each of its turns: 3 one-turn rows a turn reach the
    update, compared within their turn (GRPO over reward + the oracle's progress)."""
    config = compose_config([
        "model=tiny", "train.total_steps=1", "train.group_num=1", "train.group_size=1",
        f"train.presets=[{PRESET}]", f"val.presets=[{PRESET}]", "val.test_freq=0",
        "val.before_train=false", "rollout.turn_branches=2", "rollout.temperature=2.0",
        "algorithm.adv_estimator=grpo", "algorithm.distance_shaping=1.0", "trainer.logger=[]",
        "trainer.plot=false", "trainer.save_freq=0", f"run_dir={tmp_path / 'run'}"])
    trainer = LocalTrainer(config)
    try:
        trainer.step = 1
        metrics = trainer.train_step(1)
    finally:
        trainer.close()
    turns = metrics[f"train/{PRESET}/turns"]
    assert turns >= 1 and metrics["branch/turns"] == turns
    assert metrics["train/training_samples"] == 3 * turns
    assert 1 <= metrics["branch/distinct_replies"] <= 3 and 0 <= metrics["branch/spread"] <= 1


def test_turn_branches_are_refused_on_verl():
    import pytest

    with pytest.raises(ValueError, match="rollout.turn_branches=2 is not allowed with backend"):
        compose_config(["hardware=a100", "model=qwen_halfb", "rollout.turn_branches=2"])
