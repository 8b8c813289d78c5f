"""The local batching engine on the tiny model: exact log-probs, padding, stops, batching."""

from __future__ import annotations

import asyncio

import pytest
import torch

from agentrl.engines import BatchingLLM, SamplingParams
from agentrl.engines.sampling import truncate as _truncate
from agentrl.models import end_of_turn_ids, load_model

GREEDY = SamplingParams(greedy=True, max_new_tokens=12)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture()
def llm(tiny):
    engine = BatchingLLM(*tiny, max_batch=16, max_wait_ms=20, seed=0)
    yield engine
    engine.close()


def chat_prompts(tokenizer, count: int = 6) -> list[list[int]]:
    """Chat prompts of clearly different lengths (so left padding matters)."""
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "move the box " * (1 + 3 * i)}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for i in range(count)
    ]


def teacher_forced_logprobs(model, prompt, response, temperature=1.0) -> torch.Tensor:
    """log_softmax(logits / T) of each response token from one full forward pass, no cache."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return logprobs.gather(1, torch.tensor(response)[:, None]).squeeze(1)


def test_left_padded_batch_matches_each_prompt_alone(llm, tiny):
    prompts = chat_prompts(tiny[1])
    assert len({len(p) for p in prompts}) == len(prompts)
    batched = llm.generate_batch(prompts, GREEDY)
    for prompt, (ids, logprobs) in zip(prompts, batched):
        alone_ids, alone_logprobs = llm.generate_batch([prompt], GREEDY)[0]
        assert ids == alone_ids
        assert torch.allclose(torch.tensor(logprobs), torch.tensor(alone_logprobs), atol=1e-5)


@pytest.mark.parametrize(
    "sampling, temperature",
    [
        (SamplingParams(greedy=True, max_new_tokens=10), 1.0),
        (SamplingParams(temperature=0.0, max_new_tokens=10), 1.0),
        (SamplingParams(temperature=1.0, max_new_tokens=10), 1.0),
        (SamplingParams(temperature=0.7, top_k=40, top_p=0.9, max_new_tokens=10), 0.7),
        (SamplingParams(temperature=1.3, top_p=0.5, max_new_tokens=10), 1.3),
    ],
)
def test_logprobs_equal_a_fresh_forward_pass(llm, tiny, sampling, temperature):
    model, tokenizer = tiny
    prompts = chat_prompts(tokenizer, 4)
    for prompt, (ids, logprobs) in zip(prompts, llm.generate_batch(prompts, sampling)):
        expected = teacher_forced_logprobs(model, prompt, ids, temperature)
        assert torch.allclose(torch.tensor(logprobs), expected, atol=1e-4)


def test_greedy_tokens_are_the_argmax(llm, tiny):
    model, tokenizer = tiny
    prompt = chat_prompts(tokenizer, 1)[0]
    ids, _ = llm.generate_batch([prompt], GREEDY)[0]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
    assert logits.argmax(-1).tolist() == ids


def test_stop_token_ends_the_sequence_and_is_included(llm, tiny):
    prompts = chat_prompts(tiny[1], 3)
    full = [ids for ids, _ in llm.generate_batch(prompts, GREEDY)]
    # stop row 0 at the first token not seen before in its response, at index >= 2
    k = next(i for i in range(2, len(full[0])) if full[0][i] not in full[0][:i])
    stop = full[0][k]
    samplings = [SamplingParams(greedy=True, max_new_tokens=12, stop_token_ids=[stop])] + [
        GREEDY
    ] * 2
    results = llm.generate_batch(prompts, samplings)
    assert results[0][0] == full[0][: k + 1] and results[0][0][-1] == stop
    assert len(results[0][1]) == k + 1
    for row in (1, 2):  # the other rows are unaffected by row 0 finishing early
        assert results[row][0] == full[row]


def test_eos_ids_stop_every_request(tiny):
    model, tokenizer = tiny
    assert BatchingLLM(model, tokenizer).eos_token_ids == tuple(end_of_turn_ids(tokenizer))
    prompt = chat_prompts(tokenizer, 1)[0]
    full, _ = BatchingLLM(model, tokenizer, eos_token_ids=()).generate_batch([prompt], GREEDY)[0]
    stopped, _ = BatchingLLM(model, tokenizer, eos_token_ids=[full[3]]).generate_batch(
        [prompt], GREEDY
    )[0]
    assert stopped == full[: full.index(full[3]) + 1]


def test_each_row_keeps_its_own_max_new_tokens(llm, tiny):
    prompts = chat_prompts(tiny[1], 4)
    limits = [1, 5, 2, 9]
    samplings = [SamplingParams(temperature=1.0, max_new_tokens=n) for n in limits]
    results = llm.generate_batch(prompts, samplings)
    assert [len(ids) for ids, _ in results] == limits
    assert [len(lps) for _, lps in results] == limits
    assert llm.stats.generated_tokens == sum(limits)


def test_mixed_sampling_in_one_batch(llm, tiny):
    model, tokenizer = tiny
    prompts = chat_prompts(tokenizer, 3)
    hot = SamplingParams(temperature=2.0, top_k=5, max_new_tokens=8)
    results = llm.generate_batch(
        prompts, [GREEDY, hot, SamplingParams(top_p=0.3, max_new_tokens=8)]
    )
    alone_ids, alone_logprobs = llm.generate_batch([prompts[0]], GREEDY)[0]
    assert results[0][0] == alone_ids
    assert torch.allclose(torch.tensor(results[0][1]), torch.tensor(alone_logprobs), atol=1e-5)
    hot_ids, hot_logprobs = results[1]
    expected = teacher_forced_logprobs(model, prompts[1], hot_ids, temperature=2.0)
    assert torch.allclose(torch.tensor(hot_logprobs), expected, atol=1e-4)
    with torch.no_grad():  # every sampled token is among the top 5 at its step
        logits = model(torch.tensor([prompts[1] + hot_ids])).logits[0, len(prompts[1]) - 1 : -1]
    top5 = logits.topk(5, dim=-1).indices
    assert all(token in row for token, row in zip(hot_ids, top5.tolist()))


def test_top_k_one_is_greedy(llm, tiny):
    prompt = chat_prompts(tiny[1], 1)[0]
    greedy_ids, _ = llm.generate_batch([prompt], GREEDY)[0]
    ids, _ = llm.generate_batch(
        [prompt], SamplingParams(temperature=0.5, top_k=1, max_new_tokens=12)
    )[0]
    assert ids == greedy_ids


def test_seeded_sampling_is_reproducible(tiny):
    prompts = chat_prompts(tiny[1], 4)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8)
    run = lambda seed: BatchingLLM(*tiny, seed=seed).generate_batch(prompts, sampling)
    assert run(1) == run(1)
    assert [ids for ids, _ in run(1)] != [ids for ids, _ in run(2)]


def test_truncate_keeps_top_k_and_nucleus():
    logprobs = torch.log_softmax(torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]] * 3), dim=-1)
    out = _truncate(logprobs, torch.tensor([2, 0, 0]), torch.tensor([1.0, 0.8, 1e-6]))
    kept = torch.isfinite(out)
    probs = logprobs[0].exp()
    n_nucleus = int((probs.cumsum(0) - probs < 0.8).sum())  # smallest prefix reaching 0.8
    assert kept[0].tolist() == [True, True, False, False, False]
    assert kept[1].sum() == n_nucleus and kept[1, :n_nucleus].all()
    assert kept[2].tolist() == [True, False, False, False, False]  # always keeps the best
    assert torch.equal(out[kept], logprobs[kept])


def test_concurrent_generate_calls_are_batched(llm, tiny):
    prompts = chat_prompts(tiny[1], 8)

    async def main():
        return await asyncio.gather(*(llm.generate(p, GREEDY) for p in prompts))

    results = asyncio.run(main())
    assert llm.stats.requests == 8 and llm.stats.batches < 8
    assert llm.stats.max_batch_size > 1 and llm.stats.mean_batch_size > 1
    assert llm.stats.generated_tokens == 8 * GREEDY.max_new_tokens
    assert llm.stats.generation_seconds > 0
    for prompt, result in zip(prompts, results):  # each caller got its own answer
        assert result[0] == llm.generate_batch([prompt], GREEDY)[0][0]


def test_max_batch_caps_a_batch(tiny):
    llm = BatchingLLM(*tiny, max_batch=3, max_wait_ms=20)
    prompts = chat_prompts(tiny[1], 7)

    async def main():
        return await asyncio.gather(*(llm.generate(p, GREEDY) for p in prompts))

    asyncio.run(main())
    assert llm.stats.max_batch_size == 3 and llm.stats.batches >= 3
    llm.close()


def test_event_loop_keeps_running_while_decoding(tiny):
    llm = BatchingLLM(*tiny, eos_token_ids=())
    prompt = chat_prompts(tiny[1], 1)[0]

    async def main():
        ticks, done = 0, asyncio.Event()

        async def ticker():
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0.001)

        task = asyncio.create_task(ticker())
        await llm.generate(prompt, SamplingParams(greedy=True, max_new_tokens=60))
        done.set()
        await task
        return ticks

    assert asyncio.run(main()) >= 3
    llm.close()


def test_engine_survives_new_event_loops_and_cancelled_callers(llm, tiny):
    prompts = chat_prompts(tiny[1], 3)

    async def main():
        tasks = [asyncio.create_task(llm.generate(p, GREEDY)) for p in prompts]
        tasks[1].cancel()
        return await asyncio.gather(*tasks, return_exceptions=True)

    first = asyncio.run(main())
    second = asyncio.run(main())
    assert isinstance(first[1], asyncio.CancelledError)
    assert first[0] == second[0] and first[2] == second[2]


def test_bad_requests_raise_in_the_caller(llm, tiny):
    with pytest.raises(ValueError, match="empty"):
        asyncio.run(llm.generate([], GREEDY))
    with pytest.raises(ValueError, match="positions"):
        llm.generate_batch(
            [[1] * 10], SamplingParams(max_new_tokens=tiny[0].config.max_position_embeddings)
        )
    with pytest.raises(TypeError):
        llm.generate_batch([[1, 2]], {"temperature": 1.0})
    for bad in ({"temperature": -1}, {"top_p": 0}, {"top_k": -1}, {"max_new_tokens": 0}):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
    assert SamplingParams(stop_token_ids=[1, 2]).stop_token_ids == (1, 2)


def test_llama3_template_prompts_decode_too():
    model, tokenizer = load_model("tiny-llama3")
    llm = BatchingLLM(model, tokenizer, seed=0)
    assert llm.eos_token_ids == (tokenizer.convert_tokens_to_ids("<|eot_id|>"),)
    prompts = chat_prompts(tokenizer, 3)
    assert all(p[0] == tokenizer.bos_token_id for p in prompts)
    for prompt, (ids, logprobs) in zip(prompts, llm.generate_batch(prompts, GREEDY)):
        assert torch.allclose(
            torch.tensor(logprobs), teacher_forced_logprobs(model, prompt, ids), atol=1e-4
        )
