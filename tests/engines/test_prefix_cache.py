"""The prefix cache of the local engine: a turn that extends an earlier one reads only its new
tokens, identical prompts of a batch are read once, and both decode as without the cache."""

from __future__ import annotations

import pytest
import torch
from test_local import chat_prompts, teacher_forced_logprobs

from agentrl.engines import BatchingLLM, SamplingParams
from agentrl.engines.prefix_cache import PrefixCache

GREEDY = SamplingParams(greedy=True, max_new_tokens=10)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def engine(tiny, cache_tokens: int) -> BatchingLLM:
    return BatchingLLM(*tiny, seed=0, eos_token_ids=(), prefix_cache_tokens=cache_tokens)


def next_turn(tokenizer, prompt: list[int], reply: list[int], text: str) -> list[int]:
    """The prompt of an episode's next turn: this one, the reply, then an observation."""
    return prompt + reply + tokenizer.encode(text, add_special_tokens=False)


def test_later_turns_read_only_their_new_tokens_and_decode_as_without_cache(tiny):
    model, tokenizer = tiny
    cached, plain = engine(tiny, 10_000), engine(tiny, 0)
    prompts = chat_prompts(tokenizer, 3)
    prompts.append(prompts[0])  # a group's members share their first prompt
    turns = []
    for turn in range(3):
        results = cached.generate_batch(prompts, GREEDY)
        expected = plain.generate_batch(prompts, GREEDY)
        for prompt, (ids, logprobs), (plain_ids, _) in zip(prompts, results, expected):
            assert ids == plain_ids
            forward = teacher_forced_logprobs(model, prompt, ids)
            assert torch.allclose(torch.tensor(logprobs), forward, atol=1e-4)
        turns.append((cached.stats.prefill_tokens, prompts))
        prompts = [next_turn(tokenizer, p, ids, f" you moved {turn} boxes")
                   for p, (ids, _) in zip(prompts, results)]
    first_read, first = turns[0]
    assert first_read == sum(map(len, first[:3]))  # the repeated prompt was read once
    for (before, _), (after, prompts) in zip(turns, turns[1:]):
        # a later turn reads its reply's last token and the observation, nothing older; the
        # greedy twins still share their prompt, which is read once
        observation = len(tokenizer.encode(" you moved 0 boxes", add_special_tokens=False))
        assert len(set(map(tuple, prompts))) == 3
        assert after - before == 3 * (1 + observation)
    # 0 turns the cache off: every turn reads its distinct prompts whole
    assert plain.stats.prefill_tokens == sum(len(p) for _, prompts in turns
                                             for p in set(map(tuple, prompts)))


def test_a_prompt_that_shares_only_a_start_reads_the_rest_and_decodes_as_without_cache(tiny):
    """A history window drops a turn from the middle of the conversation: the next prompt no
    longer extends a stored turn, but it shares the episode's first message, which is reused."""
    model, tokenizer = tiny
    llm, plain = engine(tiny, 10_000), engine(tiny, 0)
    prompt = chat_prompts(tokenizer, 1)[0]
    (reply, _), = llm.generate_batch([prompt], GREEDY)
    shared = len(prompt) - 1
    assert shared >= llm.prefix_cache.min_shared
    changed = next_turn(tokenizer, prompt[:-1] + [prompt[-1] + 1], reply, " moved")
    read = llm.stats.prefill_tokens
    (ids, logprobs), = llm.generate_batch([changed], GREEDY)
    assert llm.stats.prefill_tokens - read == len(changed) - shared
    assert ids == plain.generate_batch([changed], GREEDY)[0][0]
    forward = teacher_forced_logprobs(model, changed, ids)
    assert torch.allclose(torch.tensor(logprobs), forward, atol=1e-4)
    # under min_shared tokens in common: read whole
    llm.prefix_cache.min_shared = shared + 1
    other = next_turn(tokenizer, prompt[:-1] + [prompt[-1] + 2], reply, " moved")
    read = llm.stats.prefill_tokens
    llm.generate_batch([other], GREEDY)
    assert llm.stats.prefill_tokens - read == len(other)


def test_after_the_weights_change_clearing_the_cache_gives_the_new_models_tokens(tiny):
    model, tokenizer = tiny
    llm = engine(tiny, 10_000)
    prompt = chat_prompts(tokenizer, 1)[0]
    (reply, _), = llm.generate_batch([prompt], GREEDY)
    follow = next_turn(tokenizer, prompt, reply, " the box moved left")
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn_like(parameter) * 0.5)
        (_, stale), = llm.generate_batch([follow], GREEDY)  # old keys/values: wrong
        llm.clear_prefix_cache()
        (ids, fresh), = llm.generate_batch([follow], GREEDY)
        forward = teacher_forced_logprobs(model, follow, ids)
        assert torch.allclose(torch.tensor(fresh), forward, atol=1e-4)
        assert not torch.allclose(torch.tensor(stale), forward, atol=1e-4)
    finally:
        model.load_state_dict(saved)


def test_store_keeps_the_longest_proper_prefix_and_evicts_the_oldest():
    def kv(n):
        return [torch.zeros(1, n, 2)], [torch.zeros(1, n, 2)]

    store = PrefixCache(max_tokens=8)
    store.put([1, 2, 3], *kv(3))
    store.put([1, 2], *kv(2))
    assert store.longest_prefix([1, 2, 3, 4]).ids == (1, 2, 3)
    assert store.longest_prefix([1, 2, 3]).ids == (1, 2)  # one token must be left to read
    assert store.longest_prefix([2, 2, 3, 4]) is None
    store.put([7, 7, 7, 7], *kv(4))  # 9 tokens > 8: the least recently used, (1, 2, 3), goes
    assert store.tokens == 6 and store.longest_prefix([1, 2, 3, 4]).ids == (1, 2)
    store.put(list(range(9)), *kv(9))  # longer than the whole store: not kept
    assert len(store) == 2
    store.clear()
    assert len(store) == 0 and store.tokens == 0
    with pytest.raises(ValueError, match="max_tokens must be >= 0"):
        PrefixCache(-1)


def test_a_turn_replaces_the_turn_it_extends():
    """An episode's earlier turns leave the store when its next turn is stored: the live
    conversations, not their history, fill the budget."""
    def kv(n):
        return [torch.zeros(1, n, 2)], [torch.zeros(1, n, 2)]

    store = PrefixCache(max_tokens=12)
    store.put([1, 2, 3], *kv(3))      # episode A, turn 1
    store.put([5, 6, 7], *kv(3))      # episode B, turn 1
    store.put([1, 2, 3, 4, 9], *kv(5))  # A, turn 2: its turn 1 goes
    assert store.tokens == 8 and store.longest_prefix([1, 2, 3, 8]) is None
    store.put([5, 6, 7, 8], *kv(4))   # B, turn 2 fits: 9 tokens live, nothing evicted
    assert store.tokens == 9
    assert store.longest_prefix([1, 2, 3, 4, 9, 0]).ids == (1, 2, 3, 4, 9)
    assert store.longest_prefix([5, 6, 7, 8, 0]).ids == (5, 6, 7, 8)
