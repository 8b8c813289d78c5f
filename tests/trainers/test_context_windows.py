"""A reply is trained on the context it was sampled from: one training sample per context window.

With ``history_window=1`` the tiny model's replies from turn 3 on were sampled without the
oldest turns; the trainer's old log-probs must still equal the sampler's on every model token.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch

from agentrl.agents import load_agent_presets
from agentrl.engines import BatchingLLM, SamplingParams
from agentrl.rollout import run_groups, to_batch
from agentrl.rollout.batch import context_samples
from agentrl.rollout.records import Trajectory
from agentrl.trainers import ppo
from agentrl.trainers.policy import response_logprobs


def _windowed_episodes(tiny, history_window: int) -> list[Trajectory]:
    model, tokenizer = tiny
    config = dataclasses.replace(load_agent_presets()["simpleSokobanAgent"], max_turns=4,
                                 max_response_tokens=12, history_window=history_window)
    llm = BatchingLLM(model, tokenizer, max_batch=4, max_wait_ms=1, seed=3)
    try:
        return asyncio.run(run_groups([("windowed", config)], llm, tokenizer,
                                      SamplingParams(max_new_tokens=12), group_num=1,
                                      group_size=2, max_context_tokens=4096))
    finally:
        llm.close()


def test_trainer_logprobs_equal_the_samplers_with_history_window(tiny, one_torch_thread):
    model, tokenizer = tiny
    trajectories = _windowed_episodes(tiny, history_window=1)
    assert all(t.metrics["dropped_turns"] >= 1 for t in trajectories)  # the window did move
    batch = to_batch(trajectories, pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        old, _, _ = response_logprobs(model, batch)
    mask = batch["response_mask"].bool()
    gap = (old - batch["rollout_log_probs"]).abs()[mask]
    assert gap.numel() == sum(sum(t.response_mask) for t in trajectories)
    assert float(gap.max()) < 1e-4


def test_one_sample_per_context_window(tiny, one_torch_thread):
    trajectory = _windowed_episodes(tiny, history_window=1)[0]
    samples = context_samples(trajectory)
    starts = [turn.context_start for turn in trajectory.turns]
    assert len(samples) == len(dict.fromkeys(starts))  # a new sample when the start moves
    # every model token is in exactly one sample, with its sampler log-prob
    assert sum(sum(s.response_mask) for s in samples) == sum(trajectory.response_mask)
    for sample in samples:
        context = sample.prompt_ids + sample.response_ids
        assert context[:len(trajectory.prompt_ids)] == trajectory.prompt_ids
    # the rewards of all turns are in the samples, each once
    assert sum(sum(s.token_rewards("turn")) for s in samples) == pytest.approx(
        trajectory.episode_return)


def _episode(rewards_per_sample: list[list[float]]) -> dict[str, torch.Tensor]:
    """Rows of one episode split into samples: each sample has one 2-token turn per reward."""
    width = 2 * max(len(r) for r in rewards_per_sample)
    rows = len(rewards_per_sample)
    rewards = torch.zeros(rows, width)
    mask = torch.zeros(rows, width)
    for row, turn_rewards in enumerate(rewards_per_sample):
        for k, reward in enumerate(turn_rewards):
            mask[row, 2 * k: 2 * k + 2] = 1
            rewards[row, 2 * k + 1] = reward
    return {"rewards": rewards, "mask": mask}


def test_gae_flows_across_the_samples_of_an_episode():
    """The last turn of a window bootstraps from the next window: the episode is one GAE run."""
    split = _episode([[1.0], [2.0], [3.0]])
    values = torch.tensor([[0.5, 0.4], [0.3, 0.2], [0.1, 0.05]])
    _, returns = ppo.compute_advantages(
        "gae", split["rewards"], split["mask"], values=values, gamma=1.0, lam=1.0,
        episode_index=torch.tensor([0, 0, 0]))
    assert returns[:, 0].tolist() == pytest.approx([6.0, 5.0, 3.0])
    whole = _episode([[1.0, 2.0, 3.0]])
    adv_whole, ret_whole = ppo.compute_advantages(
        "gae", whole["rewards"], whole["mask"], values=values.reshape(1, 6), gamma=0.9, lam=0.8)
    adv_split, ret_split = ppo.compute_advantages(
        "gae", split["rewards"], split["mask"], values=values, gamma=0.9, lam=0.8,
        episode_index=torch.tensor([7, 7, 7]))
    assert ret_split.reshape(-1).tolist() == pytest.approx(ret_whole[0].tolist(), abs=1e-6)
    assert adv_split.reshape(-1).tolist() == pytest.approx(adv_whole[0].tolist(), abs=1e-5)


def test_grpo_scores_whole_episodes_not_samples():
    # episode 0 = two samples (rewards 1 and 2), episode 1 = one sample (reward 0); one group
    split = _episode([[1.0], [2.0], [0.0]])
    advantages, _ = ppo.compute_advantages(
        "grpo", split["rewards"], split["mask"], group_index=torch.tensor([0, 0, 0]).numpy(),
        episode_index=torch.tensor([0, 0, 1]))
    # scores 3 and 0: the first episode's samples share its positive advantage
    assert advantages[0, 0] == pytest.approx(advantages[1, 0])
    assert advantages[0, 0] > 0 > advantages[2, 0]


@pytest.mark.parametrize("gamma_unit", ["token", "turn"])
def test_a_training_step_logs_the_logprob_gap_of_windowed_episodes(gamma_unit, tmp_path,
                                                                    one_torch_thread):
    from agentrl.config import compose_config
    from agentrl.trainers.local import LocalTrainer

    overrides = ["model=tiny", "train.presets=[simpleSokobanAgent]", "train.group_num=1",
                 "train.group_size=2", "rollout.max_new_tokens=8", "threads=1",
                 "agents.simpleSokobanAgent.history_window=1",
                 "agents.simpleSokobanAgent.max_turns=3", "algorithm.gamma=0.9",
                 f"algorithm.gamma_unit={gamma_unit}", "algorithm.lam=1.0",
                 "critic.sibling_pseudocount=null",  # siblings refuse a per-token discount
                 "trainer.logger=[]", "trainer.plot=false",
                 f"run_dir={tmp_path}"]
    trainer = LocalTrainer(compose_config(overrides))
    try:
        metrics = trainer.train_step(1)
    finally:
        trainer.close()
    assert metrics["train/training_samples"] > metrics["train/kept_trajectories"] == 2
    assert 0 <= metrics["rollout/logprob_gap_max"] < 1e-4
    assert metrics["rollout/logprob_gap_mean"] <= metrics["rollout/logprob_gap_max"]
    assert metrics["guard/skipped_updates"] == 0


def test_a_window_ending_at_full_width_does_not_merge_with_the_next_windows_reply():
    """Two windows of one episode: the first ends on a model token at full width, the second
    starts with a reply. Stitched end to end their model tokens touch, but they are two turns:
    per-turn GAE must discount the second one (gamma 0.5: 1 + 0.5 * 2 = 2, not 1 + 2)."""
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    _, returns = ppo.compute_advantages(
        "gae", rewards, mask, values=torch.zeros_like(mask), gamma=0.5, lam=1.0,
        gamma_unit="turn", episode_index=torch.tensor([0, 0]))
    assert returns[0].tolist() == pytest.approx([2.0, 2.0, 2.0])
    assert returns[1, :2].tolist() == pytest.approx([2.0, 2.0])
