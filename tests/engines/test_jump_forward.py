"""Jump-forward decoding: where a constrained row's grammar allows one token only, the engine
appends it without a decode step of its own. The tokens, log-probs (1e-5), masks and features
are those of step-by-step decoding, on the static-cache and ``DynamicCache`` paths, through the
prefix cache; only the decode steps are fewer."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_constrained_masks import GRAMMARS, prompts
from test_features import forward_features
from test_local import teacher_forced_logprobs

from agentrl.engines import BatchingLLM, SamplingParams
from agentrl.engines.static_cache import StaticCacheDecoder

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def engine(tiny, jump_forward: bool, static: bool) -> BatchingLLM:
    llm = BatchingLLM(*tiny, seed=0, prefix_cache_tokens=10_000, jump_forward=jump_forward)
    llm._static = static
    return llm


def decode_twice(llm: BatchingLLM, tokenizer, samplings: list[SamplingParams]):
    """A batch of first turns, then a batch that extends each of them (prefix cache hits)."""
    batch = prompts(tokenizer, len(samplings))
    first = llm.generate_batch(batch, samplings)
    follow = [p + r[0] + prompts(tokenizer, 1)[0] for p, r in zip(batch, first)]
    return batch + follow, first + llm.generate_batch(follow, samplings)


@pytest.mark.parametrize("static", [True, False], ids=["static-cache", "dynamic-cache"])
def test_jump_forward_decodes_the_step_by_step_tokens_in_fewer_steps(tiny, static):
    model, tokenizer = tiny
    greedy = SamplingParams(greedy=True, max_new_tokens=48)
    samplings = [dataclasses.replace(greedy, answer_grammar=grammar) for grammar in GRAMMARS]
    samplings += [dataclasses.replace(greedy, answer_grammar=GRAMMARS[0], max_new_tokens=9),
                  dataclasses.replace(greedy, max_new_tokens=6),  # a free row rides along
                  dataclasses.replace(greedy, answer_grammar=GRAMMARS[1], return_features=True)]
    fast, slow = engine(tiny, True, static), engine(tiny, False, static)
    batch, jumped = decode_twice(fast, tokenizer, samplings)
    _, stepped = decode_twice(slow, tokenizer, samplings)
    for prompt, ours, theirs in zip(batch, jumped, stepped):
        assert ours[0] == theirs[0]
        assert torch.allclose(torch.tensor(ours[1]), torch.tensor(theirs[1]), atol=1e-5)
        assert (ours.token_masks is None) == (theirs.token_masks is None)
        if ours.token_masks is not None:
            assert [(m.ids, m.allow) for m in ours.token_masks] == [
                (m.ids, m.allow) for m in theirs.token_masks]
            forced = [lp for lp, m in zip(ours[1], ours.token_masks) if len(m.ids) == 1 and m.allow]
            assert forced and all(lp == 0.0 for lp in forced)
        if ours.features is not None:
            assert torch.allclose(ours.features, forward_features(model, prompt, ours[0]),
                                  atol=1e-5)
    free = [i for i, s in enumerate(samplings * 2) if s.answer_grammar is None]
    for i in free:  # log-probs of the free row are the model's (no mask)
        forward = teacher_forced_logprobs(model, batch[i], jumped[i][0])
        assert torch.allclose(torch.tensor(jumped[i][1]), forward, atol=1e-5)
    assert fast.stats.generated_tokens == slow.stats.generated_tokens
    assert fast.stats.jumped_tokens > 0 and slow.stats.jumped_tokens == 0
    assert fast.stats.decode_steps < slow.stats.decode_steps


def test_a_step_of_several_tokens_a_row_grows_the_static_cache(tiny):
    """Three tokens a row in one step, left-padded and past the buffers' capacity: the last
    logits and every hidden state are those of the model's own forward pass."""
    from transformers import DynamicCache

    model, tokenizer = tiny
    rows = prompts(tokenizer, 2)
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(r) for r in rows])[:, None])
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask.long(), position_ids=positions,
              past_key_values=cache, use_cache=True)
        decoder = StaticCacheDecoder.build(model, cache, mask.long(), None, steps=1)
        chunks = torch.tensor([[0, 5, 6], [7, 8, 9]])  # row 0 feeds two tokens, row 1 three
        valid = torch.tensor([[False, True, True], [True, True, True]])
        start = positions[:, -1] + 1
        chunk_positions = start[:, None] + (torch.arange(3)[None, :] - (~valid).sum(1)[:, None]
                                            ).clamp(min=0)
        logits, hidden = decoder.step(chunks, chunk_positions, valid)
    assert decoder.valid.shape[1] >= width + 3
    for row, (prompt, chunk) in enumerate(zip(rows, [[5, 6], [7, 8, 9]])):
        with torch.no_grad():
            out = model(torch.tensor([prompt + chunk]), output_hidden_states=True)
        assert torch.allclose(logits[row], out.logits[0, -1].float(), atol=1e-5)
        assert torch.allclose(hidden[row, 3 - len(chunk):], out.hidden_states[-1][0, -len(chunk):],
                              atol=1e-5)


def test_decode_steps_count_the_forward_passes_after_the_prefill(tiny):
    """A free request of 7 tokens without stops: the prefill gives the first, six decode steps
    the rest; the counts reach ``agentrl eval --out``'s ``model.generation``."""
    llm = BatchingLLM(*tiny, seed=0, eos_token_ids=())
    llm.generate_batch(prompts(tiny[1], 2), SamplingParams(greedy=True, max_new_tokens=7))
    stats = llm.stats.as_dict()
    assert stats["decode_steps"] == 6 and stats["jumped_tokens"] == 0
    assert stats["generated_tokens"] == 14
