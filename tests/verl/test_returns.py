"""verl's value clip scaled to the returns, and episodes cut by the response budget ended where
they are cut (agentrl.verl.returns), through verl 0.9.1's own value loss, compute_advantage and
value slice."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import verl
from verl import DataProto
from verl.trainer.ppo import ray_trainer
from verl.utils import tensordict_utils as tu
from verl.workers.config import CriticConfig
from verl.workers.utils import losses, padding

from agentrl.verl import cpu_platform, returns


def unpatched(function):
    """verl's own function (a manager built earlier in this process may have patched it)."""
    return getattr(function, "__wrapped_by_agentrl__", function)


def test_the_patches_match_this_verl():
    for patch in returns._patches():
        assert callable(cpu_platform.check_patch(patch, verl.__version__))


# -- the value clip --------------------------------------------------------------------------------
def critic_batch(returns_value: float, prompt: int = 2, response: int = 3, **columns):
    """One trajectory as verl's critic receives it (padded), old values 0."""
    return tu.get_tensordict(tensor_dict={
        "prompts": torch.ones(1, prompt, dtype=torch.long),
        "responses": torch.ones(1, response, dtype=torch.long),
        "attention_mask": torch.ones(1, prompt + response, dtype=torch.long),
        "values": torch.zeros(1, response), "returns": torch.full((1, response), returns_value),
        "response_mask": torch.ones(1, response), **columns},
        non_tensor_dict={"dp_size": 1, "batch_num_tokens": None, "global_batch_size": None})


@pytest.mark.parametrize(("scale", "loss", "clip"), [
    ("absolute", 0.5 * (10 - 0.5) ** 2, None),  # vpred 3 clipped to old 0 + 0.5
    ("returns", 0.5 * (10 - 3) ** 2, 5.0),       # clip 0.5 x RMS 10 = 5: vpred 3 stands
])
def test_verls_value_loss_clips_at_the_returns_scale(monkeypatch, scale, loss, clip):
    monkeypatch.setenv(returns.VALUE_CLIP_ENV, scale)
    scaled = returns._scaled_value_loss(unpatched(losses.value_loss))
    config = CriticConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1)  # cliprange 0.5
    value, metrics = scaled(config, {"values": torch.full((5,), 3.0)}, critic_batch(10.0))
    assert float(value) == pytest.approx(loss)
    assert metrics.get("critic/cliprange_value") == clip


def test_the_steps_scale_wins_over_the_micro_batchs(monkeypatch):
    """The legacy trainer stores the step's scale in every row: a micro-batch of small returns
    still clips at the step's scale, as the local engine does."""
    monkeypatch.setenv(returns.VALUE_CLIP_ENV, "returns")
    scaled = returns._scaled_value_loss(unpatched(losses.value_loss))
    config = CriticConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1)
    batch = critic_batch(1.0, **{returns.RETURN_SCALE: torch.tensor([8.0])})
    _, metrics = scaled(config, {"values": torch.full((5,), 3.0)}, batch)
    assert metrics["critic/cliprange_value"] == pytest.approx(4.0)


def test_return_scale_is_the_local_engines():
    values = torch.tensor([[3.0, 4.0, 99.0]])
    assert returns.return_scale(values, torch.tensor([[1, 1, 0]])) == pytest.approx(12.5 ** 0.5)
    assert returns.return_scale(values * 0.1, torch.tensor([[1, 1, 0]])) == 1.0


# -- cut episodes ---------------------------------------------------------------------------------
def gae_batch(truncated: list[bool | None]) -> DataProto:
    """Two rows: model tokens, an observation (mask 0), a reply, then padding."""
    mask = torch.tensor([[1, 1, 0, 1, 0], [1, 1, 0, 1, 0]], dtype=torch.float32)
    rewards = torch.tensor([[0.0, 0.5, 0.0, 1.0, 0.0], [0.0, 0.5, 0.0, 1.0, 0.0]])
    values = torch.tensor([[1.0, 2.0, 9.0, 3.0, 9.0], [1.0, 2.0, 9.0, 3.0, 9.0]])
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "values": values,
                                        "response_mask": mask})
    data.non_tensor_batch[returns.TRUNCATED] = np.array(truncated, dtype=object)
    return data


def test_a_cut_episode_ends_where_it_is_cut(monkeypatch):
    monkeypatch.setenv(returns.VALUE_CLIP_ENV, "returns")
    patched = returns._compute_advantage(unpatched(ray_trainer.compute_advantage))
    data = patched(gae_batch([True, False]), "gae", gamma=1.0, lam=1.0, config={})
    got = data.batch["returns"]
    # gamma = lam = 1: each model token's return is the rewards after it, cut or not
    assert got[0, [0, 1, 3]].tolist() == pytest.approx([1.5, 1.5, 1.0])
    assert torch.equal(got[0], got[1])
    assert data.batch["token_level_rewards"][0].tolist() == [0.0, 0.5, 0.0, 1.0, 0.0]
    mask = data.batch["response_mask"]
    assert data.batch[returns.RETURN_SCALE].tolist() == pytest.approx(
        [returns.return_scale(got, mask)] * 2)


def test_verls_gae_is_unchanged_cut_or_not(monkeypatch):
    monkeypatch.setenv(returns.VALUE_CLIP_ENV, "absolute")
    patched = returns._compute_advantage(unpatched(ray_trainer.compute_advantage))
    plain = unpatched(ray_trainer.compute_advantage)(gae_batch([True, None]), "gae", gamma=0.9,
                                                     lam=0.95, config={})
    data = patched(gae_batch([True, None]), "gae", gamma=0.9, lam=0.95, config={})
    assert torch.equal(data.batch["returns"], plain.batch["returns"])
    assert returns.RETURN_SCALE not in data.batch.keys()


def critic_reads(outputs: torch.Tensor, prompt: int) -> torch.Tensor:
    """The values verl's critic hands GAE: its per-position ``outputs`` of one unpadded row
    (``prompt`` tokens, then the response), sliced by verl's own ``no_padding_2_padding``; the
    value of response token t is the output at the position before t."""
    response = outputs.numel() - prompt
    row = tu.get_tensordict(tensor_dict={
        "prompts": torch.ones(1, prompt, dtype=torch.long),
        "responses": torch.ones(1, response, dtype=torch.long),
        "attention_mask": torch.ones(1, prompt + response, dtype=torch.long)})
    return padding.no_padding_2_padding(outputs, row)


def test_a_cut_episodes_critic_target_has_a_fixed_point(monkeypatch):
    """A critic fitted exactly to its target, step after step, on an episode the response budget
    cut (flagged, as the AgentLoop flags it): the target stops moving. A bootstrap with the value
    at the last model token, which verl reads before that token and so already holds its reward,
    would make the target r + V there: at gamma = 1 a drift of r a step."""
    monkeypatch.setenv(returns.VALUE_CLIP_ENV, "returns")
    patched = returns._compute_advantage(unpatched(ray_trainer.compute_advantage))
    data = gae_batch([True, True])
    prompt = 2
    outputs = torch.zeros(prompt + data.batch["values"].shape[1])  # the critic, per position
    last_targets = []
    for _ in range(3):
        data.batch["values"] = critic_reads(outputs, prompt).repeat(2, 1)
        data = patched(data, "gae", gamma=1.0, lam=1.0, config={})
        target = data.batch["returns"][0]
        last_targets.append(float(target[3]))
        outputs[prompt - 1:-1] = target  # critic := target, at the positions verl reads
    assert last_targets == pytest.approx([1.0, 1.0, 1.0])  # the last reward, and no more
    assert data.batch["returns"][0, [0, 1, 3]].tolist() == pytest.approx([1.5, 1.5, 1.0])


def test_v1_ends_a_cut_episode_where_it_is_cut():
    """V1's advantage step hands verl's GAE only the fields it selects (``response_mask``,
    ``rm_scores``, ``values``, ...): a cut episode's row, flagged by our AgentLoop, ends like any
    other, and a critic fitted to its target, step after step, has a fixed point."""
    from verl_fakes import fake_transfer_queue

    from agentrl.rollout.records import Trajectory
    from agentrl.verl.rows import episode_output

    cut = Trajectory(preset="p", seed=0, group_index=0, prompt_ids=[11, 12, 13],
                     response_ids=[21, 22, 31, 32, 41, 42], response_mask=[1, 1, 0, 0, 1, 1],
                     response_logprobs=[-1.0] * 6, turn_end_positions=[1, 5],
                     turn_rewards=[1.0, 2.0], success=False, episode_return=3.0, num_turns=2)
    row = episode_output(cut, response_length=6, reward_placement="turn", with_logprobs=False,
                         budget_exhausted=True).as_dict()
    assert row["extra_fields"][returns.TRUNCATED] is True
    mask = row["response_mask"].float().unsqueeze(0)
    values = torch.zeros_like(mask)
    last_targets = []
    with fake_transfer_queue():
        from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories
        for _ in range(3):
            data = DataProto.from_dict(tensors={
                "response_mask": mask, "values": values,
                "token_level_rewards": row["rm_scores"].unsqueeze(0)})
            data = compute_advantage_for_multi_trajectories(
                data, batch_keys=["u_0_0"], adv_estimator="gae", gamma=1.0, lam=1.0, config={})
            values = data.batch["returns"].clone()  # critic := target
            last_targets.append(float(values[0, 5]))
    assert last_targets == pytest.approx([2.0, 2.0, 2.0])
    assert values[0, mask[0].bool()].tolist() == pytest.approx([3.0, 3.0, 2.0, 2.0])
