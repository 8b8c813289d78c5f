"""verl's server manager as :func:`agentrl.rollout.run_episode`'s ``llm``, for one episode.

Why apart from :mod:`agentrl.verl.agent_loop`: the loop wires an episode into verl; this is the
one engine of the verl backend (a request's parameters, vLLM's aborts, a constrained reply's
masks replayed, the server's fields kept), as :mod:`agentrl.engines.local` is the local one's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from verl.experimental.agent_loop.tool_agent_loop import SPEC_DECODE_EXTRA_KEYS

from agentrl.engines import Generation, SamplingParams
from agentrl.engines.constrained import TokenTexts
from agentrl.verl.constrained import EXTRA_ARGS_KEY, TurnConstraint, replay_masks
from agentrl.verl.episode_task import ResponseBudget

__all__ = ["ABORT_RETRIES", "ServerLLM"]

ABORT_RETRIES = 3
"""Times a reply vLLM answered ``stop_reason="aborted"`` (verl aborts requests around a weight
update) is asked again; its partial tokens are dropped, never trained on."""


class ServerLLM:
    """``llm.generate(prompt_ids, sampling)`` over verl's server manager, for one episode.

    Every call uses the episode's ``request_id``. The request's sampling parameters are verl's
    (``sampling_params`` given to the loop's ``run``) plus, from ``sampling``, only
    ``max_new_tokens`` (cut to what the budget has left) and ``stop_token_ids``. Records what
    verl's own loops report from the server: its ``extra_fields`` (weights versions) and
    preemptions.

    A request with an ``answer_grammar`` (constrained actions) also carries its
    :class:`~agentrl.verl.constrained.TurnConstraint` in ``extra_args``, for vLLM's logits
    processor, and returns a :class:`~agentrl.engines.Generation` with each token's mask,
    replayed here from the same constraint (``texts``: the tokenizer's token texts; ``width``:
    the model's logits per token). ``constraint_violations`` counts replies with a token
    outside its mask (the processor was not applied to them).
    """

    def __init__(self, server_manager: Any, sampling_params: Mapping[str, Any],
                 budget: ResponseBudget, end_of_turn: Sequence[int], *, request_id: str,
                 priority: int = 0, texts: TokenTexts | None = None, width: int = 0):
        self.server_manager = server_manager
        self.sampling_params = dict(sampling_params)
        self.budget = budget
        self.end_of_turn = frozenset(int(t) for t in end_of_turn)
        self.eos_token_ids = tuple(dict.fromkeys(int(t) for t in end_of_turn))
        """What ends a reply (``run_episode`` reads it): a reply ending on one is not cut."""
        self.request_id = request_id
        self.priority = priority
        self.server_fields: dict[str, Any] = {}
        self.num_preempted = -1
        self.texts, self.width = texts, width
        self.constraint_violations = 0

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams
                       ) -> tuple[list[int], list[float]]:
        max_tokens = min(sampling.max_new_tokens, self.budget.left)
        if max_tokens < 1:
            raise RuntimeError(f"request {self.request_id}: no response budget left "
                               f"({self.budget.used}/{self.budget.total} tokens used)")
        stop = dict.fromkeys([*(self.sampling_params.get("stop_token_ids") or []),
                              *sampling.stop_token_ids])
        params = {**self.sampling_params, "max_tokens": max_tokens, "stop_token_ids": list(stop)}
        constraint = self._constraint(sampling, max_tokens)
        if constraint is not None:
            params["extra_args"] = {**(params.get("extra_args") or {}),
                                    EXTRA_ARGS_KEY: constraint.to_wire()}
        for _ in range(ABORT_RETRIES + 1):
            output = await self.server_manager.generate(
                request_id=self.request_id, prompt_ids=list(prompt_ids), sampling_params=params,
                priority=self.priority)
            if output.stop_reason != "aborted":
                break
        else:
            raise RuntimeError(f"request {self.request_id}: vLLM aborted it {ABORT_RETRIES + 1} "
                               "times in a row")
        ids = [int(t) for t in output.token_ids]
        if not ids:
            raise RuntimeError(f"request {self.request_id}: the server returned no tokens "
                               f"(stop_reason={output.stop_reason!r})")
        logprobs = ([float(x) for x in output.log_probs] if output.log_probs is not None
                    else [0.0] * len(ids))
        self._record(output)
        # what run_episode appends: the reply, and a closing token when the reply was cut
        self.budget.used += len(ids) + (ids[-1] not in self.end_of_turn)
        if constraint is None:
            return ids, logprobs
        masks, violations = await asyncio.to_thread(replay_masks, constraint, self.texts, ids)
        self.constraint_violations += violations
        return Generation(ids, logprobs, masks)

    def _constraint(self, sampling: SamplingParams, max_tokens: int) -> TurnConstraint | None:
        """The request's constraint: its grammar, ended by the chat template's end-of-turn
        (the first end-of-turn id, as the local engine ends a constrained reply)."""
        if sampling.answer_grammar is None:
            return None
        if self.texts is None or self.width < 1:
            raise RuntimeError(f"request {self.request_id}: a constrained request needs the "
                               "tokenizer's texts and the logits' width (ServerLLM texts, width)")
        return TurnConstraint(sampling.answer_grammar, self.eos_token_ids[:1], self.width,
                              max_tokens)

    def _record(self, output: Any) -> None:
        """Keep the first turn's server fields, the newest weights version and summed
        speculative-decoding counts (as verl's ToolAgentLoop does)."""
        fields = dict(output.extra_fields or {})
        if not self.server_fields:
            self.server_fields = fields
        else:
            if fields.get("max_global_steps") is not None:
                self.server_fields["max_global_steps"] = fields["max_global_steps"]
            for key in SPEC_DECODE_EXTRA_KEYS:
                if key in fields and key in self.server_fields:
                    self.server_fields[key] = int(self.server_fields[key]) + int(fields[key])
        if output.num_preempted is not None:
            self.num_preempted = max(self.num_preempted, 0) + int(output.num_preempted)
