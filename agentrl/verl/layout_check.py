"""The first-run check's ``use_remove_padding`` row (``agentrl doctor``): one constrained batch
through verl's engine with the masks, packed and padded, whose masked probabilities must agree.
Packing needs flash-attn's varlen attention, so :func:`run_remove_padding_check` needs a GPU;
:func:`compare_remove_padding` runs anywhere (tests/verl/test_doctor.py, on the tiny model).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

def bare_engine(cls: type) -> Any:
    """verl's engine class without its model or process group: what its
    ``prepare_model_inputs`` and ``prepare_model_outputs`` read (one rank, no padding to a
    bucket), as the actor's micro-batch passes through them."""
    from types import SimpleNamespace

    from verl.utils.torch_functional import entropy_from_logits

    engine = object.__new__(cls)
    engine.pad_to_length, engine.pad_to_length_bucket = False, 0
    engine.use_ulysses_sp, engine.ulysses_sequence_parallel_size = False, 1
    engine.compute_entropy_from_logits = entropy_from_logits
    engine.engine_config = SimpleNamespace(entropy_checkpointing=False,
                                           entropy_from_logits_with_chunking=False)
    return engine


def masked_logprobs(model: Any, batch: Any, remove_padding: bool, temperature: float) -> Any:
    """The masked engine's log-probs of ``batch`` (a legacy ``DataProto``) in one micro-batch,
    packed (``remove_padding``) or padded, as ``(rows, response width)``."""
    from types import SimpleNamespace

    import torch
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    from agentrl.verl.masked_engine import MaskedLMEngine

    batch.meta_info["temperature"] = temperature
    data = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(data, use_remove_padding=remove_padding, calculate_entropy=False)
    engine = bare_engine(MaskedLMEngine)
    with torch.no_grad():
        inputs, args = engine.prepare_model_inputs(data)
        logits = model(**inputs).logits.float()
        out = engine.prepare_model_outputs(SimpleNamespace(logits=logits), args, data, None)
    return no_padding_2_padding(out["log_probs"], data)


PROBE_COLUMNS = ("prompts", "responses", "response_mask", "input_ids", "attention_mask",
                 "position_ids")


def compare_remove_padding(model: Any, batch: Any, temperature: float) -> dict[str, Any]:
    """Masked log-probs of one batch with ``use_remove_padding`` on and off (and against the
    rollout's, when the batch has them and the model is the one that sampled)."""
    from agentrl.verl.constrained import MASKS_FIELD

    keys = [*PROBE_COLUMNS, *(["rollout_log_probs"] if "rollout_log_probs" in batch.batch.keys()
                              else [])]
    batch = batch.select(batch_keys=keys, non_tensor_batch_keys=[
        k for k in (MASKS_FIELD,) if k in batch.non_tensor_batch])
    mask = batch.batch["response_mask"].bool()
    padded = masked_logprobs(model, batch, False, temperature)
    packed = masked_logprobs(model, batch, True, temperature)
    masks = batch.non_tensor_batch.get(MASKS_FIELD)
    result = {"max_abs_diff": float((packed.exp() - padded.exp())[mask].abs().max()),
              "max_abs_logprob_diff": float((packed - padded)[mask].abs().max()),
              "tokens": int(mask.sum()), "rows": int(mask.shape[0]),
              "masked": int(sum(m is not None for m in masks)) if masks is not None else 0}
    if "rollout_log_probs" in batch.batch.keys():
        rollout = batch.batch["rollout_log_probs"]
        result["max_abs_diff_rollout"] = float((padded.exp() - rollout.exp())[mask].abs().max())
    return result


def run_remove_padding_check(probe_batch: Path, model_path: str, temperature: float
                             ) -> dict[str, Any]:
    """:func:`compare_remove_padding` on a GPU, with the model as verl's actor loads it for
    packing (flash-attn 2)."""
    import torch
    from transformers import AutoModelForCausalLM
    from verl import DataProto

    batch = DataProto.load_from_disk(str(probe_batch))
    model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.bfloat16,
                                                 attn_implementation="flash_attention_2")
    model = model.to("cuda").eval()
    batch = batch.to("cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return compare_remove_padding(model, batch, temperature)
