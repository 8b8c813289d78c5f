"""A wall-clock deadline stops training early and cleanly: PPO after the step that passes it
(validated, logged and saved as the run's last step), SFT after the update that passes it (its
checkpoint written as usual). ``scripts/bench/learn.py --minutes`` relies on both."""

from __future__ import annotations

import time

from agentrl.config import compose_config
from agentrl.trainers.checkpoint import list_checkpoints
from agentrl.trainers.local import LocalTrainer
from agentrl.trainers.sft import SFTTrainer
from agentrl.trainers.tracking import read_metrics


def test_ppo_stops_after_the_step_that_passes_the_deadline(tmp_path, one_torch_thread):
    config = compose_config([
        "model=tiny", "train.total_steps=5", "train.group_num=1", "train.group_size=2",
        "train.presets=[banditAgent]", "val.presets=[banditAgent]", "val.group_num=1",
        "val.test_freq=5", "val.before_train=false", "rollout.max_new_tokens=4",
        "trainer.logger=[]", "trainer.plot=false", "trainer.save_freq=0",
        f"run_dir={tmp_path / 'run'}"])
    trainer = LocalTrainer(config)
    try:
        run = trainer.fit(deadline=time.monotonic())  # already past: one step, then stop
    finally:
        trainer.close()
    assert run.step == 1
    records = read_metrics(run.metrics)
    assert [r["step"] for r in records] == [1]
    assert records[0].get("val/banditAgent/success") is not None  # the last step validates
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["step_000001"]


def test_sft_stops_after_the_update_that_passes_the_deadline(tmp_path, one_torch_thread):
    config = compose_config([
        "model=tiny", "sft.presets=[banditAgent]", "val.presets=[banditAgent]",
        "sft.episodes=4", "sft.epochs=3", "sft.mini_batch_size=2", "sft.evaluate=false",
        "rollout.max_new_tokens=8", f"run_dir={tmp_path / 'run'}"])
    trainer = SFTTrainer(config)
    try:
        result = trainer.fit(deadline=time.monotonic())
    finally:
        trainer.close()
    assert result.updates == 1 and result.checkpoint.name == "step_000001"


def test_sft_evaluates_with_the_runs_decoding(tmp_path, one_torch_thread):
    """SFT's before/after numbers are those PPO's validation reports: with constrained
    decoding on (the local default) the random tiny model makes no format error."""
    config = compose_config([
        "model=tiny", "sft.presets=[tightSokobanAgent]", "val.presets=[tightSokobanAgent]",
        "val.group_num=2", f"run_dir={tmp_path / 'run'}"])
    trainer = SFTTrainer(config)
    try:
        result = trainer.evaluate("untrained")
    finally:
        trainer.close()
    assert config.constrained_actions
    assert result.preset_metrics("tightSokobanAgent")["format_error"] == 0
