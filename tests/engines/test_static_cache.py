"""The local engine's decode steps over a preallocated cache compute what the model's own forward
pass computes: the same greedy tokens and the same log-probs (1e-5) as the ``DynamicCache``
path and as a fresh forward pass, in every batch shape the engine meets."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_local import chat_prompts, teacher_forced_logprobs

from agentrl.agents.grammar import AnswerGrammar
from agentrl.engines import BatchingLLM, SamplingParams
from agentrl.engines import static_cache
from agentrl.engines.sampling import draw as _draw
from agentrl.models import end_of_turn_ids

GREEDY = SamplingParams(greedy=True, max_new_tokens=12)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def engines(model, tokenizer, **options) -> tuple[BatchingLLM, BatchingLLM]:
    """The engine as it runs (static cache) and the same engine on the DynamicCache path."""
    fast = BatchingLLM(model, tokenizer, seed=0, **options)
    plain = BatchingLLM(model, tokenizer, seed=0, **options)
    plain._static = False
    return fast, plain


def assert_same(results, expected, model=None, prompts=None):
    for row, ((ids, logprobs), (plain_ids, plain_logprobs)) in enumerate(zip(results, expected)):
        assert ids == plain_ids, f"row {row}"
        assert torch.allclose(torch.tensor(logprobs), torch.tensor(plain_logprobs), atol=1e-5)
        if model is not None:
            forward = teacher_forced_logprobs(model, prompts[row], ids)
            assert torch.allclose(torch.tensor(logprobs), forward, atol=1e-5), f"row {row}"


def test_the_tiny_llama_decodes_over_the_static_cache(tiny):
    llm = BatchingLLM(*tiny, seed=0)
    llm.generate_batch(chat_prompts(tiny[1], 2), GREEDY)
    assert llm._static is True and static_cache.supports(tiny[0])


def test_mixed_lengths_stops_and_limits_match_the_model_forward(tiny):
    model, tokenizer = tiny
    fast, plain = engines(model, tokenizer, eos_token_ids=())
    prompts = chat_prompts(tokenizer, 6)  # six different lengths: left padding
    full = [ids for ids, _ in plain.generate_batch(prompts, GREEDY)]
    # rows finish at different steps: a stop token in row 0 and 3, short limits in rows 1 and 4
    samplings = [dataclasses.replace(GREEDY, stop_token_ids=[full[0][3]]),
                 dataclasses.replace(GREEDY, max_new_tokens=2), GREEDY,
                 dataclasses.replace(GREEDY, stop_token_ids=[full[3][6]]),
                 dataclasses.replace(GREEDY, max_new_tokens=5), GREEDY]
    results = fast.generate_batch(prompts, samplings)
    assert_same(results, plain.generate_batch(prompts, samplings), model, prompts)
    lengths = [len(ids) for ids, _ in results]
    assert lengths[1] == 2 and lengths[4] == 5 and lengths[2] == lengths[5] == 12
    assert lengths[0] <= 4 and lengths[3] <= 7 and len(set(lengths)) >= 4


def test_identical_prompts_and_sampled_rows_match_the_model_forward(tiny):
    model, tokenizer = tiny
    fast, plain = engines(model, tokenizer, eos_token_ids=())
    prompts = chat_prompts(tokenizer, 3)
    prompts = [prompts[0], prompts[1], prompts[0], prompts[2], prompts[0]]  # a group's turn
    assert_same(fast.generate_batch(prompts, GREEDY), plain.generate_batch(prompts, GREEDY),
                model, prompts)
    hot = SamplingParams(temperature=1.3, top_k=20, max_new_tokens=10)
    for prompt, (ids, logprobs) in zip(prompts, fast.generate_batch(prompts, hot)):
        forward = teacher_forced_logprobs(model, prompt, ids, temperature=1.3)
        assert torch.allclose(torch.tensor(logprobs), forward, atol=1e-5)


def test_turns_through_the_prefix_cache_match_the_plain_path(tiny):
    model, tokenizer = tiny
    fast, plain = engines(model, tokenizer, eos_token_ids=(), prefix_cache_tokens=10_000)
    prompts = chat_prompts(tokenizer, 3) + chat_prompts(tokenizer, 1)
    for turn in range(3):
        samplings = [GREEDY, dataclasses.replace(GREEDY, max_new_tokens=4 + turn), GREEDY,
                     GREEDY]
        results = fast.generate_batch(prompts, samplings)
        assert_same(results, plain.generate_batch(prompts, samplings), model, prompts)
        prompts = [prompt + ids + tokenizer.encode(f" moved {turn}", add_special_tokens=False)
                   for prompt, (ids, _) in zip(prompts, results)]
    assert fast.stats.prefill_tokens == plain.stats.prefill_tokens  # the same hits


def test_constrained_rows_match_the_plain_path(tiny):
    model, tokenizer = tiny
    fast, plain = engines(model, tokenizer)
    grammar = AnswerGrammar(actions=("Up", "Down", "Left", "Right"), max_actions=2, think=True)
    constrained = SamplingParams(greedy=True, max_new_tokens=24, answer_grammar=grammar,
                                 stop_token_ids=tuple(end_of_turn_ids(tokenizer)))
    prompts = chat_prompts(tokenizer, 4)
    samplings = [constrained, GREEDY, constrained, GREEDY]
    results = fast.generate_batch(prompts, samplings)
    expected = plain.generate_batch(prompts, samplings)
    assert_same(results, expected)
    assert results[1].token_masks is None and results[0].token_masks
    for ours, theirs in zip(results[::2], expected[::2]):  # the same masks, step by step
        assert [(m.ids, m.allow) for m in ours.token_masks] == [
            (m.ids, m.allow) for m in theirs.token_masks]


def test_a_qwen2_model_with_biases_matches_its_forward(tiny):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = tiny[1]
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # visible biases: they must be applied
        for layer in model.model.layers:
            layer.self_attn.q_proj.bias.normal_(0, 0.5)
            layer.self_attn.k_proj.bias.normal_(0, 0.5)
    assert static_cache.supports(model)
    fast, plain = engines(model, tokenizer, eos_token_ids=())
    prompts = chat_prompts(tokenizer, 4)
    assert_same(fast.generate_batch(prompts, GREEDY), plain.generate_batch(prompts, GREEDY),
                model, prompts)


def test_unsupported_attention_keeps_the_dynamic_cache_path(tiny):
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=len(tiny[1]), hidden_size=64, intermediate_size=128,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           sliding_window=8)
    model = MistralForCausalLM(config).eval()
    assert not static_cache.supports(model)
    llm = BatchingLLM(model, tiny[1], seed=0, eos_token_ids=())
    prompt = chat_prompts(tiny[1], 1)[0]
    (ids, logprobs), = llm.generate_batch([prompt], GREEDY)
    assert llm._static is False
    assert torch.allclose(torch.tensor(logprobs), teacher_forced_logprobs(model, prompt, ids),
                          atol=1e-4)


def test_draw_follows_the_distribution_and_never_picks_a_zero():
    generator = torch.Generator().manual_seed(0)
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2, 0.0]] * 4000)
    draws = torch.cat([_draw(probs, generator) for _ in range(5)])
    counts = torch.bincount(draws, minlength=5).double() / len(draws)
    assert counts[1] == 0 and counts[4] == 0
    assert torch.allclose(counts, probs[0].double(), atol=0.01)
    scaled = _draw(probs[:2] * 7, torch.Generator().manual_seed(3))  # any scale
    assert scaled.tolist() == _draw(probs[:2], torch.Generator().manual_seed(3)).tolist()


def test_lora_adapters_are_applied_in_the_static_decode(tiny):
    import copy

    from peft import LoraConfig, get_peft_model

    model, tokenizer = tiny
    torch.manual_seed(0)
    adapted = get_peft_model(copy.deepcopy(model), LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
        init_lora_weights=False)).eval()  # random adapters: they change the tokens
    assert static_cache.supports(adapted)
    fast, plain = engines(adapted, tokenizer, eos_token_ids=())
    prompts = chat_prompts(tokenizer, 3)
    results = fast.generate_batch(prompts, GREEDY)
    assert_same(results, plain.generate_batch(prompts, GREEDY), adapted, prompts)
    base = BatchingLLM(model, tokenizer, seed=0, eos_token_ids=()).generate_batch(prompts, GREEDY)
    assert [ids for ids, _ in results] != [ids for ids, _ in base]


def test_a_masked_row_gets_only_its_allowed_logits_and_those_exactly(tiny):
    """The head reads only a constrained row's allowed ids (the rest -inf); a free row of the
    same step gets every logit; both equal the full head's within float noise."""
    from transformers import DynamicCache

    model, tokenizer = tiny
    prompt = torch.tensor([chat_prompts(tokenizer, 1)[0]] * 2)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=prompt, past_key_values=cache, use_cache=True)
        decoder = static_cache.StaticCacheDecoder.build(model, cache, torch.ones_like(prompt),
                                                        None, steps=4)
        last = torch.randn(2, model.config.hidden_size)
        allowed = torch.tensor([3, 70, 4000])
        logits = decoder._head(last, [allowed, None])
        full = model.lm_head(last).float()
    assert torch.allclose(logits[0, allowed], full[0, allowed], atol=1e-5)
    assert torch.isinf(logits[0]).sum() == logits.shape[1] - len(allowed)
    assert torch.allclose(logits[1], full[1], atol=1e-5)
