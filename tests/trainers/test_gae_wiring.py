"""Value and GAE wiring on a hand-computed two-turn episode, and the critic's positions."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from agentrl.rollout import to_batch
from agentrl.rollout.records import Trajectory
from agentrl.trainers import ppo
from agentrl.trainers.policy import ValueModel, backbone_of, response_logprobs


def two_turn_episode() -> Trajectory:
    """Prompt 3 tokens | reply 1 (2 tokens) | observation (2 tokens) | reply 2 (2 tokens)."""
    return Trajectory(
        preset="p", seed=0, group_index=0, prompt_ids=[11, 12, 13],
        response_ids=[21, 22, 31, 32, 41, 42], response_mask=[1, 1, 0, 0, 1, 1],
        response_logprobs=[-1.0, -1.0, 0.0, 0.0, -1.0, -1.0], turn_end_positions=[1, 5],
        turn_rewards=[1.0, 2.0], success=True, episode_return=3.0, num_turns=2)


def test_turn_rewards_compose_into_returns():
    batch = to_batch([two_turn_episode()], pad_token_id=0, reward_placement="turn")
    mask = batch["response_mask"].float()
    values = torch.zeros_like(mask)
    _, returns = ppo.compute_advantages("gae", batch["token_level_rewards"], mask,
                                        values=values, gamma=1.0, lam=1.0)
    # every token of turn 1 is worth both turns' rewards; turn 2 only its own
    assert returns[0, mask[0] == 1].tolist() == [3.0, 3.0, 2.0, 2.0]


def test_gae_by_hand_skips_observation_tokens():
    batch = to_batch([two_turn_episode()], pad_token_id=0, reward_placement="turn")
    mask = batch["response_mask"].float()
    # observation values (9.0) must be ignored: GAE bridges over them
    values = torch.tensor([[0.5, 0.4, 9.0, 9.0, 0.3, 0.2]])
    advantages, returns = ppo.compute_advantages("gae", batch["token_level_rewards"], mask,
                                                 values=values, gamma=1.0, lam=0.5)
    # backwards over model tokens, gamma 1, lambda 0.5:
    # t5: 2 + 0 - 0.2 = 1.8                 -> A = 1.8
    # t4: 0 + 0.2 - 0.3 = -0.1              -> A = -0.1 + 0.5 * 1.8 = 0.8
    # t1: 1 + 0.3 - 0.4 = 0.9 (next = t4)   -> A = 0.9 + 0.5 * 0.8 = 1.3
    # t0: 0 + 0.4 - 0.5 = -0.1              -> A = -0.1 + 0.5 * 1.3 = 0.55
    raw = torch.tensor([0.55, 1.3, 0.8, 1.8])
    model_tokens = mask[0] == 1
    assert returns[0, model_tokens] == pytest.approx((raw + torch.tensor([0.5, 0.4, 0.3, 0.2])).tolist())
    whitened = (raw - raw.mean()) / raw.std()  # verl whitens over model tokens
    assert advantages[0, model_tokens] == pytest.approx(whitened.tolist(), abs=1e-4)


@pytest.mark.parametrize("gamma_unit", ["token", "turn"])
def test_a_cut_episodes_critic_target_has_a_fixed_point(gamma_unit):
    """An episode cut by its turn budget (two turns, ``max_turns: 2``) ends where it is cut: a
    critic fitted exactly to its target, step after step, gives the same target again (the
    values are read before each token, so the last token's value already holds its reward)."""
    batch = to_batch([two_turn_episode()], pad_token_id=0, reward_placement="turn")
    mask = batch["response_mask"].float()
    values = torch.zeros_like(mask)
    last_targets = []
    for _ in range(3):
        _, values = ppo.compute_advantages("gae", batch["token_level_rewards"], mask,
                                           values=values, gamma=1.0, lam=1.0,
                                           gamma_unit=gamma_unit)  # critic := target
        last_targets.append(float(values[0, 5]))
    assert last_targets == pytest.approx([2.0, 2.0, 2.0])
    assert values[0, mask[0] == 1].tolist() == pytest.approx([3.0, 3.0, 2.0, 2.0])


def test_last_placement_puts_the_score_on_the_last_model_token():
    trajectory = two_turn_episode()
    batch = to_batch([trajectory], pad_token_id=0, reward_placement="last")
    rewards = batch["token_level_rewards"][0]
    assert rewards[5] == 3.0 and rewards.sum() == 3.0


@pytest.mark.parametrize("shared", [False, True])
def test_value_of_a_token_is_read_before_it(tiny, shared):
    model, _ = tiny
    critic = ValueModel.from_actor(model, share_backbone=shared)
    torch.nn.init.normal_(critic.head.weight)
    batch = to_batch([two_turn_episode()], pad_token_id=0)
    values = critic(batch)
    with torch.no_grad():
        hidden = backbone_of(model)(input_ids=batch["input_ids"]).last_hidden_state
        expected = critic.head(hidden).squeeze(-1)[0, 2:8]  # positions P-1 .. P+R-2
    assert values.shape == (1, 6)
    assert values[0].tolist() == pytest.approx(expected.tolist(), abs=1e-5)
    with torch.no_grad():  # the actor's own pass gives the same values to a shared critic
        _, _, features = response_logprobs(model, batch, with_features=True)
    assert critic.values_from(features)[0].tolist() == pytest.approx(expected.tolist(), abs=1e-5)
    trainable = {id(p) for p in critic.trainable_parameters()}
    assert (id(next(backbone_of(model).parameters())) in trainable) is False
    assert len(trainable) == (2 if shared else len(list(critic.parameters())))


def test_critic_of_a_lora_actor_trains_its_own_adapters(tiny):
    from peft import LoraConfig, get_peft_model

    model, _ = tiny
    actor = get_peft_model(copy.deepcopy(model), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    critic = ValueModel.from_actor(actor, share_backbone=False)
    names = {name for name, p in critic.named_parameters() if p.requires_grad}
    assert names and all("lora_" in name or name.startswith("head.") for name in names)
    assert any("lora_" in name for name in names)
    actor_adapters = {id(p) for name, p in actor.named_parameters() if "lora_" in name}
    assert not actor_adapters & {id(p) for p in critic.trainable_parameters()}


def test_turn_placement_sums_to_the_normalized_score():
    # score = 0.5 * return - 2: every turn gets 0.5 * r - 2 / 2 (one map, the shift shared)
    trajectory = dataclasses.replace(two_turn_episode(), score=-0.5, score_map=(0.5, -2.0))
    rewards = to_batch([trajectory], pad_token_id=0, reward_placement="turn")["token_level_rewards"][0]
    assert rewards[1] == pytest.approx(0.5 * 1.0 - 1.0)
    assert rewards[5] == pytest.approx(0.5 * 2.0 - 1.0)
    assert float(rewards.sum()) == pytest.approx(-0.5)


@pytest.mark.parametrize("reply_tokens", [2, 7])
def test_turn_discount_is_per_turn_whatever_the_reply_length(reply_tokens):
    """gamma 0.9 per turn: turn 1 is worth 0.9 x turn 2's reward (per token: 0.9 ** tokens)."""
    reply = [1] * reply_tokens
    trajectory = Trajectory(
        preset="p", seed=0, group_index=0, prompt_ids=[11, 12],
        response_ids=[21] * reply_tokens + [31, 32] + [41] * reply_tokens,
        response_mask=reply + [0, 0] + reply,
        response_logprobs=[-1.0] * (2 * reply_tokens + 2),
        turn_end_positions=[reply_tokens - 1, 2 * reply_tokens + 1], turn_rewards=[0.0, 1.0],
        success=True, episode_return=1.0, num_turns=2)
    batch = to_batch([trajectory], pad_token_id=0, reward_placement="turn")
    mask = batch["response_mask"].float()
    values = torch.zeros_like(mask)
    _, per_turn = ppo.compute_advantages("gae", batch["token_level_rewards"], mask, values=values,
                                         gamma=0.9, lam=1.0, gamma_unit="turn",
                                         episode_index=batch["episode_index"])
    model_tokens = per_turn[0, mask[0] == 1].tolist()
    assert model_tokens == pytest.approx([0.9] * reply_tokens + [1.0] * reply_tokens)
    _, per_token = ppo.compute_advantages("gae", batch["token_level_rewards"], mask,
                                          values=values, gamma=0.9, lam=1.0)
    assert per_token[0, 0] == pytest.approx(0.9 ** (2 * reply_tokens - 1))


def test_turn_discount_uses_the_value_before_each_reply():
    batch = to_batch([two_turn_episode()], pad_token_id=0, reward_placement="turn")
    mask = batch["response_mask"].float()
    values = torch.tensor([[0.5, 0.4, 9.0, 9.0, 0.3, 0.2]])
    advantages, returns = ppo.compute_advantages("gae", batch["token_level_rewards"], mask,
                                                 values=values, gamma=0.9, lam=0.5,
                                                 gamma_unit="turn")
    # turns: r = (1, 2), V = (0.5, 0.3) (the value before each reply's first token)
    # turn 2: A = 2 - 0.3 = 1.7; turn 1: delta = 1 + 0.9 * 0.3 - 0.5 = 0.77, A = 0.77 + 0.45 * 1.7
    a2, a1 = 1.7, 0.77 + 0.45 * 1.7
    assert returns[0, mask[0] == 1].tolist() == pytest.approx([a1 + 0.5] * 2 + [a2 + 0.3] * 2)
    raw = torch.tensor([a1, a1, a2, a2])
    assert advantages[0, mask[0] == 1].tolist() == pytest.approx(
        ((raw - raw.mean()) / raw.std()).tolist(), abs=1e-4)
