"""verl's value clip scaled to the returns and truncated episodes bootstrapped
(agentrl.verl.returns), through verl 0.9.1's own value loss and compute_advantage."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import verl
from verl import DataProto
from verl.trainer.ppo import ray_trainer
from verl.utils import tensordict_utils as tu
from verl.workers.config import CriticConfig
from verl.workers.utils import losses

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


# -- truncated episodes ----------------------------------------------------------------------------
def gae_batch(truncated: list[bool | None]) -> DataProto:
    """Two rows: model tokens, an observation (mask 0), a reply, then padding."""
    mask = torch.tensor([[1, 1, 0, 1, 0], [1, 1, 0, 1, 0]], dtype=torch.float32)
    rewards = torch.tensor([[0.0, 0.5, 0.0, 1.0, 0.0], [0.0, 0.5, 0.0, 1.0, 0.0]])
    values = torch.tensor([[1.0, 2.0, 9.0, 3.0, 9.0], [1.0, 2.0, 9.0, 3.0, 9.0]])
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "values": values,
                                        "response_mask": mask})
    data.non_tensor_batch[returns.TRUNCATED] = np.array(truncated, dtype=object)
    return data


def test_a_truncated_episode_bootstraps_from_its_last_value(monkeypatch):
    monkeypatch.setenv(returns.VALUE_CLIP_ENV, "returns")
    patched = returns._compute_advantage(unpatched(ray_trainer.compute_advantage))
    data = patched(gae_batch([True, False]), "gae", gamma=1.0, lam=1.0, config={})
    got = data.batch["returns"]
    # gamma = lam = 1: each model token's return is the rewards after it, plus V(last) if cut
    assert got[0, [0, 1, 3]].tolist() == pytest.approx([1.5 + 3.0, 1.5 + 3.0, 1.0 + 3.0])
    assert got[1, [0, 1, 3]].tolist() == pytest.approx([1.5, 1.5, 1.0])
    assert data.batch["token_level_rewards"][0].tolist() == [0.0, 0.5, 0.0, 1.0, 0.0]  # as logged
    mask = data.batch["response_mask"]
    assert data.batch[returns.RETURN_SCALE].tolist() == pytest.approx(
        [returns.return_scale(got, mask)] * 2)


def test_without_a_flag_verls_gae_is_unchanged(monkeypatch):
    monkeypatch.setenv(returns.VALUE_CLIP_ENV, "absolute")
    patched = returns._compute_advantage(unpatched(ray_trainer.compute_advantage))
    data = gae_batch([None, False])
    plain = unpatched(ray_trainer.compute_advantage)(gae_batch([None, False]), "gae", gamma=0.9, lam=0.95, config={})
    data = patched(data, "gae", gamma=0.9, lam=0.95, config={})
    assert torch.equal(data.batch["returns"], plain.batch["returns"])
    assert returns.RETURN_SCALE not in data.batch.keys()


def test_bootstrap_skips_rows_without_model_tokens():
    rewards = torch.zeros(2, 3)
    out = returns.bootstrap_truncated(rewards, torch.ones(2, 3), torch.tensor([[0, 0, 0],
                                      [1, 0, 0]]), torch.tensor([True, True]), gamma=0.5)
    assert out.tolist() == [[0.0, 0.0, 0.0], [0.5, 0.0, 0.0]]
