"""Test helpers for the rollout tests: a scripted fake LLM and well-formed replies."""

from __future__ import annotations

from typing import Callable, Sequence

from agentrl.agents import GAME_SPECS, format_response
from agentrl.models import end_of_turn_ids


class FakeLLM:
    """Returns scripted replies as token ids (+ the end-of-turn id); records every prompt.

    ``reply(prompt_ids, call_index) -> str`` gives the text; ``close=False`` leaves the turn
    open (as a reply cut by ``max_new_tokens``), and ``max_new_tokens`` is honoured.
    Log-probs are ``-0.5 - 0.001 * position`` so tests can tell them from the fill value 0.0.
    """

    def __init__(self, tokenizer, reply: Callable[[Sequence[int], int], str],
                 close: Callable[[int], bool] = lambda call: True):
        self.tokenizer = tokenizer
        self.reply = reply
        self.close = close
        self.eot = end_of_turn_ids(tokenizer)[0]
        self.calls: list[list[int]] = []
        self.outputs: list[list[int]] = []

    async def generate(self, prompt_ids, sampling):
        call = len(self.calls)
        self.calls.append(list(prompt_ids))
        ids = self.tokenizer.encode(self.reply(prompt_ids, call), add_special_tokens=False)
        if self.close(call):
            ids = ids[: sampling.max_new_tokens - 1] + [self.eot]
        else:
            ids = (ids * 50)[: sampling.max_new_tokens]  # long enough to hit the limit
        self.outputs.append(ids)
        return ids, [-0.5 - 0.001 * i for i in range(len(ids))]


def game_reply(game: str, think: bool = True) -> str:
    """A well-formed reply with the game's first example action."""
    return format_response(GAME_SPECS[game].example_actions[:1], separator="||",
                           think="go" if think else None)
