"""The value clip follows the reward scale: with returns of 10 (the games' scale, not verl's 0/1
rewards) the critic gets near them within three steps of 32 mini-batch updates each, while an
absolute clip of 0.5 zeroes the gradient of every token 0.5 past its old value and leaves the
critic lagging (it still drifts further on AdamW's momentum, so it is slow, not stopped)."""

from __future__ import annotations

import pytest

from agentrl.trainers.timing import StageTimer
from update_fixtures import tiny_trainer, two_turn_batch

STEPS = 3


def critic_values_after(tmp_path, scale: str) -> tuple[float, float]:
    """(mean value on model tokens, the clip used) after STEPS steps on episodes returning 10."""
    trainer = tiny_trainer(tmp_path / scale, f"critic.value_clip_scale={scale}",
                           "critic.share_backbone=true", "critic.lr=0.02", "critic.ppo_epochs=4",
                           "actor.ppo_mini_batch_size=1", "actor.micro_batch_size=1",
                           "actor.lr=1e-9", "critic.ppo_mini_batch_size=null",
                           # the linear head on raw features: the clip, not the head, is tested
                           "critic.head_hidden=0", "critic.standardize_features=false")
    batch = two_turn_batch(8, turn_rewards=(0.0, 10.0))  # every model token's return: 10
    for step in range(1, STEPS + 1):
        trainer.step = step
        metrics = trainer.updater.update(batch, StageTimer())
    assert metrics["critic/returns_mean"] == pytest.approx(10.0)
    mask = batch["response_mask"].float()
    values = trainer.updater._score(batch, StageTimer())["values"]
    return float((values * mask).sum() / mask.sum()), metrics["critic/cliprange_value"]


@pytest.mark.slow
def test_a_clip_scaled_to_the_returns_lets_the_critic_reach_them(tmp_path, one_torch_thread):
    scaled, scaled_clip = critic_values_after(tmp_path, "returns")
    absolute, absolute_clip = critic_values_after(tmp_path, "absolute")
    print(f"values after {STEPS} steps: clip {scaled_clip} -> {scaled:.2f}, "
          f"clip {absolute_clip} -> {absolute:.2f}")
    assert scaled_clip == pytest.approx(5.0) and absolute_clip == 0.5
    assert scaled >= 8.5
    assert absolute <= 7.0


def test_verl_takes_either_clip_and_scales_by_the_returns_by_default():
    """verl's value loss is patched to the same scale (agentrl.verl.returns)."""
    from agentrl.config import compose_config
    from agentrl.verl.launch import launch_env
    from agentrl.verl.returns import VALUE_CLIP_ENV

    gpu = ["hardware=a100", "model=qwen_halfb"]
    assert launch_env(compose_config(gpu))[VALUE_CLIP_ENV] == "returns"
    absolute = compose_config([*gpu, "critic.value_clip_scale=absolute"])
    assert launch_env(absolute)[VALUE_CLIP_ENV] == "absolute"
