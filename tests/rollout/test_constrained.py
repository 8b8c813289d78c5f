"""Constrained action decoding end to end on the tiny random model: every game's replies are
well formed with only the turn's valid actions, and the trainer's log-prob recompute describes
the masked distribution the sampler drew from (PPO's first ratio is 1)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch

from agentrl.agents import Agent, load_agent_presets, parse_response
from agentrl.engines import BatchingLLM, SamplingParams
from agentrl.rollout import run_episode, run_groups, to_batch
from agentrl.trainers.microbatch import micro_rows
from agentrl.trainers.policy import response_logprobs

PRESETS = load_agent_presets()
GAMES = ["quickSokobanAgent", "simpleSokobanAgent", "tetrisType1Agent", "blocksworldTextAgent",
         "textworldEasyAgent", "banditAgent"]
CONSTRAINED = SamplingParams(temperature=1.0, max_new_tokens=40, constrained_actions=True)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def engine(tiny):
    llm = BatchingLLM(*tiny, max_batch=16, seed=0)
    yield llm
    llm.close()


class RecordingAgent(Agent):
    """An Agent that remembers the valid actions each turn started from."""

    def __init__(self, config):
        super().__init__(config)
        self.valid_at_turn: list[set[str]] = []

    def answer_grammar(self):
        self.valid_at_turn.append(set(self.env.unwrapped.valid_actions()))
        return super().answer_grammar()


@pytest.mark.parametrize("name", GAMES)
def test_constrained_replies_are_well_formed_with_valid_actions(name, engine, tiny):
    """3 seeds, sampled: no format error, no length cut, and every action run
    is one the game listed as valid when the turn began (Sokoban, Tetris and Bandit: all
    accepted by the game). Unconstrained, the same model breaks the format."""
    _, tokenizer = tiny
    config = PRESETS[name]
    if config.game == "TextWorld":
        config = dataclasses.replace(config, max_turns=2)  # each step runs the interpreter

    async def play(sampling, seeds):
        agents, episodes = [], []
        for seed in range(seeds):
            agent = RecordingAgent(config)
            agents.append(agent)
            episodes.append(run_episode(agent, seed, engine, tokenizer, sampling,
                                        max_context_tokens=4096))
        return agents, await asyncio.gather(*episodes)

    agents, trajectories = asyncio.run(play(CONSTRAINED, 3))
    for agent, trajectory in zip(agents, trajectories):
        assert trajectory.metrics["format_errors"] == 0, [t.text for t in trajectory.turns]
        assert trajectory.metrics["truncated_turns"] == 0
        for turn, valid in zip(trajectory.turns, agent.valid_at_turn):
            parsed = parse_response(turn.text, enable_think=config.enable_think,
                                    separator=config.action_separator,
                                    max_actions=config.max_actions_per_turn,
                                    answer_format=config.answer_format)
            assert parsed.format_ok and set(parsed.actions) <= valid, (turn.text, valid)
            assert turn.token_masks is not None and len(turn.token_masks) == len(
                turn.response_ids)
        if config.game in ("Sokoban", "Tetris", "Bandit"):
            assert trajectory.metrics["num_valid"] == trajectory.metrics["num_actions"] > 0

    _, free = asyncio.run(play(dataclasses.replace(CONSTRAINED, constrained_actions=False), 1))
    assert sum(t.metrics["format_errors"] for t in free) > 0
    assert all(t.response_token_masks is None for t in free)


def test_first_ppo_ratio_is_one_under_the_mask(engine, tiny):
    """The trainer's recompute (micro-batch path, temperature 1) equals the sampler's
    log-probs on every model token within 1e-4: exp(new - old) = 1 on the first mini-batch.
    Ignoring the mask (no constraint tensors) moves them far apart."""
    model, tokenizer = tiny
    presets = [(name, PRESETS[name]) for name in ("quickSokobanAgent", "banditAgent",
                                                  "tetrisType1Agent")]
    trajectories = asyncio.run(run_groups(presets, engine, tokenizer, CONSTRAINED, group_num=1,
                                          group_size=2, max_context_tokens=4096))
    batch = to_batch(trajectories, pad_token_id=tokenizer.pad_token_id)
    assert "constraint_kind" in batch and (batch["constraint_kind"] >= 0).any()
    micro = micro_rows(batch, torch.arange(len(trajectories)))
    mask = micro["response_mask"].bool()
    with torch.no_grad():
        recomputed, _, _ = response_logprobs(model, micro, temperature=1.0)
        ratio = torch.exp(recomputed - micro["rollout_log_probs"])[mask]
        assert (ratio - 1).abs().max().item() < 1e-4

        unmasked = {k: v for k, v in micro.items() if not k.startswith("constraint_")}
        ignored, _, _ = response_logprobs(model, unmasked, temperature=1.0)
        assert (torch.exp(ignored - micro["rollout_log_probs"])[mask] - 1).abs().max() > 0.1
