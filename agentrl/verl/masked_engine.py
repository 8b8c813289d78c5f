"""The trainer's side of constrained action decoding on verl: verl's FSDP engine, masked.

    VERL_ENGINE_VENDOR=agentrl_masked VERL_USE_EXTERNAL_MODULES=agentrl.verl.masked_engine,...

(launch.py sets both, on every Ray worker, when ``rollout.constrained_actions`` is on.) verl
imports the modules of ``VERL_USE_EXTERNAL_MODULES`` in every process; importing this one
registers :class:`MaskedLMEngine` in verl's ``EngineRegistry`` for language models on fsdp and
fsdp2, device ``cuda`` (verl's engine device: the CPU platform sets ``VERL_ENGINE_DEVICE=cuda``
too), vendor :data:`~agentrl.verl.constrained.ENGINE_VENDOR`. verl looks the vendor key up
first, so with ``VERL_ENGINE_VENDOR`` naming it the actor gets this engine, and so does the
reference (its config is a copy of the actor's model config: its KL is on the masked
distribution too); the critic (``value_model``) has no such entry and keeps verl's.

:meth:`MaskedLMEngine.prepare_model_outputs` masks the model's logits with each row's
:class:`~agentrl.verl.constrained.RowMasks` (the ``non_tensor_batch`` column the AgentLoop
wrote) and hands them to verl's own method, which divides by the temperature and computes the
log-probs and the entropy: old, new and reference log-probs all describe the distribution
vLLM sampled from. Fused kernels compute log-probs without logits, and Ulysses sequence
parallelism splits a row's logits over ranks: both are refused when the engine starts.

verl logs a failed plugin import at DEBUG only, so a run that constrains checks at start that
this engine is the one verl's lookup returns (:func:`check_masked_engine`, called by the
AgentLoop's manager before the first step).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from typing import Any

from verl.utils import tensordict_utils as tu
from verl.workers.engine import EngineRegistry
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

from agentrl.verl.constrained import (
    ENGINE_VENDOR,
    MASKS_FIELD,
    RowMasks,
    mask_logits_,
    response_logit_rows,
)

__all__ = ["BACKENDS", "MaskedLMEngine", "check_masked_engine"]

BACKENDS = ("fsdp", "fsdp2")
MODEL_TYPE = "language_model"


class MaskedLMEngine(FSDPEngineWithLMHead):
    """verl's FSDP language-model engine whose logits are masked per response token (see the
    module docstring)."""

    def __init__(self, model_config: Any, engine_config: Any, *args: Any, **kwargs: Any):
        if getattr(engine_config, "use_fused_kernels", False):
            raise ValueError("actor_rollout_ref.model.use_fused_kernels=true is not allowed with "
                             "rollout.constrained_actions=true: fused kernels compute log-probs "
                             "without logits, which the masks apply to; allowed: false")
        sp = getattr(engine_config, "ulysses_sequence_parallel_size", 1) or 1
        if sp > 1:
            raise ValueError(f"ulysses_sequence_parallel_size={sp} is not allowed with "
                             "rollout.constrained_actions=true: each rank would hold a slice of "
                             "a row's logits; allowed: 1")
        super().__init__(model_config, engine_config, *args, **kwargs)

    def prepare_model_outputs(self, output, output_args, micro_batch, logits_processor_func):
        rows = tu.get(micro_batch, MASKS_FIELD)
        if rows is not None and any(row is not None for row in rows):
            logits = output.logits
            flat = logits.view(-1, logits.shape[-1])
            ends, responses = _sequence_ends(micro_batch, logits)
            rows = [_fit_to_response(RowMasks.of(row), length)
                    for row, length in zip(rows, responses)]
            mask_logits_(flat, response_logit_rows(ends, responses), rows)
        return super().prepare_model_outputs(output, output_args, micro_batch,
                                             logits_processor_func)


def _fit_to_response(row: RowMasks | None, length: int) -> RowMasks | None:
    """A row's masks on its response. The V1 trainer's padding rows copy a real row's fields,
    masks included, onto a one-token response: those are cut to it. A real row whose masks
    run past its response is misaligned, and fails here rather than mask the wrong logits."""
    if row is None or len(row.index) <= length:
        return row
    if length > 1:
        raise RuntimeError(f"a row's constraint masks cover {len(row.index)} response tokens "
                           f"but its response has {length}: the masks are misaligned")
    return dataclasses.replace(row, index=row.index[:length])


def _sequence_ends(micro_batch: Any, logits: Any) -> tuple[list[int], list[int]]:
    """Where each row's sequence ends in the flattened logits, and its response's length
    (the real tokens after its prompt, as verl's ``no_padding_2_padding`` counts them).
    Packed logits ``(1, tokens, vocab)`` hold the rows one after another; padded logits
    ``(rows, width, vocab)`` one row each, left-aligned."""
    lengths = micro_batch["input_ids"].offsets().diff().tolist()
    if micro_batch["responses"].is_nested:  # V1 trainer: rows are unpadded
        responses = micro_batch["responses"].offsets().diff().tolist()
    else:  # legacy trainer: left-padded prompts, right-padded responses
        prompt_width = micro_batch["prompts"].shape[1]
        responses = micro_batch["attention_mask"][:, prompt_width:].sum(dim=1).tolist()
    if tu.get_non_tensor_data(data=micro_batch, key="use_remove_padding", default=True):
        ends = list(itertools.accumulate(lengths))
    else:
        width = logits.shape[1]
        ends = [row * width + length for row, length in enumerate(lengths)]
    return ends, responses


def register() -> type:
    """Register :class:`MaskedLMEngine` under our vendor (once per process)."""
    registry = EngineRegistry._engines.get(MODEL_TYPE, {})
    if all(registry.get(backend, {}).get(("cuda", ENGINE_VENDOR)) is MaskedLMEngine
           for backend in BACKENDS):
        return MaskedLMEngine
    return EngineRegistry.register(model_type=MODEL_TYPE, backend=list(BACKENDS),
                                   device="cuda", vendor=ENGINE_VENDOR)(MaskedLMEngine)


def check_masked_engine(backend: str) -> None:
    """Raise unless every verl process imports this module (``VERL_USE_EXTERNAL_MODULES``)
    and verl's own lookup then gives the actor :class:`MaskedLMEngine` in this process's
    environment (``VERL_ENGINE_VENDOR``, ``VERL_ENGINE_DEVICE``)."""
    imported = __name__ in os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",")
    found = EngineRegistry.get_engine_cls(MODEL_TYPE, backend)
    if found is not MaskedLMEngine or not imported:
        raise RuntimeError(
            f"rollout.constrained_actions=true: verl's engine lookup gives "
            f"{found.__module__}.{found.__qualname__}, not the masked engine "
            f"(VERL_ENGINE_VENDOR={os.environ.get('VERL_ENGINE_VENDOR')!r}, "
            f"VERL_ENGINE_DEVICE={os.environ.get('VERL_ENGINE_DEVICE')!r}; expected vendor "
            f"{ENGINE_VENDOR!r} and {__name__} in VERL_USE_EXTERNAL_MODULES): the actor would "
            "recompute log-probs over the whole vocabulary")


register()
