"""A learning task with a known chance level, for checking that training works end to end.

    arms = likely_arms(model, tokenizer, count=4)
    preset = first_token_bandit(arms)      # agents-file entry: one plain reply token per episode
    # the last (least likely) arm pays: sampling with top_k=count starts near 1/count success,
    # greedy decoding at 0; only a working policy gradient moves the model onto that arm.

The arms are the model's own most likely first reply tokens, at a fixed point (listing them as
the arms in the prompt leaves them the most likely), so any model - random or pretrained -
starts with every arm reachable and none preferred for a reason of its own. Used by the
learning test (tiny model) and ``scripts/bench/learn.py --preset first-token-bandit``.
"""

from __future__ import annotations

from typing import Any

import torch

from agentrl.agents import Agent, agent_presets_from_dict
from agentrl.rollout.episode import first_prompt_ids

__all__ = ["first_token_bandit", "likely_arms"]

MAX_ROUNDS = 5


def first_token_bandit(arms: list[str], golden: str | None = None) -> dict:
    """An agents-file entry: a one-turn Bandit on ``arms`` answered with one plain token,
    paying ``golden`` (default: the last arm)."""
    return {"game": "Bandit", "env_kwargs": {"arms": list(arms), "golden_arm": golden or arms[-1]},
            "answer_format": "plain", "enable_think": False, "max_turns": 1,
            "max_actions_per_turn": 1, "max_actions_all_turns": 1, "max_response_tokens": 1}


@torch.no_grad()
def likely_arms(model: Any, tokenizer: Any, count: int = 4) -> list[str]:
    """The ``count`` most likely first reply tokens as distinct arm names, at a fixed point."""
    arms = [f"arm{i}" for i in range(count)]
    device = next(model.parameters()).device
    for _ in range(MAX_ROUNDS):
        config = agent_presets_from_dict({"probe": first_token_bandit(arms)})["probe"]
        with Agent(config) as agent:
            ids = first_prompt_ids(tokenizer, agent.reset(seed=0))
        logits = model(torch.tensor([ids], device=device)).logits[0, -1]
        found: list[str] = []
        for token in logits.argsort(descending=True).tolist():
            text = " ".join(tokenizer.decode([token]).split())
            if text and "|" not in text and text.lower() not in {t.lower() for t in found}:
                found.append(text)
            if len(found) == count:
                break
        if found == arms:
            return arms
        arms = found
    raise ValueError(f"the model's likely first tokens did not settle in {MAX_ROUNDS} rounds: {arms}")
