"""``SamplingParams.return_features``: the engine returns, per generated token, the last hidden
state it read that token's logits from, equal (1e-5) to what a fresh forward pass of the model
gives at that position (the input a critic on the actor's backbone reads), on the static-cache
and the ``DynamicCache`` paths, through the prefix cache and identical prompts."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_local import chat_prompts

from agentrl.engines import BatchingLLM, SamplingParams

WITH_FEATURES = SamplingParams(greedy=True, max_new_tokens=8, return_features=True)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def forward_features(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    """The last hidden state before each response token, from one forward pass, no cache."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states[-1]
    return hidden[0, len(prompt) - 1:-1].float()


@pytest.mark.parametrize("static", [True, False], ids=["static-cache", "dynamic-cache"])
def test_features_are_the_forward_pass_hidden_states(tiny, static):
    model, tokenizer = tiny
    llm = BatchingLLM(model, tokenizer, seed=0, eos_token_ids=(), prefix_cache_tokens=10_000)
    llm._static = static
    prompts = chat_prompts(tokenizer, 3)
    prompts = [prompts[0], prompts[1], prompts[0], prompts[2]]  # identical rows read once
    samplings = [WITH_FEATURES, dataclasses.replace(WITH_FEATURES, max_new_tokens=3),
                 dataclasses.replace(WITH_FEATURES, temperature=1.0, greedy=False),
                 SamplingParams(greedy=True, max_new_tokens=8)]  # a row that did not ask
    first = llm.generate_batch(prompts, samplings)
    assert first[3].features is None
    hidden_size = model.config.hidden_size
    for prompt, result in zip(prompts[:3], first[:3]):
        ids, _ = result
        assert result.features.shape == (len(ids), hidden_size)
        assert torch.allclose(result.features, forward_features(model, prompt, ids), atol=1e-5)
    # the next turn extends the first one: its prefix comes from the prefix cache
    follow = [prompts[0] + first[0][0] + chat_prompts(tokenizer, 1)[0]]
    (ids, _), = second = llm.generate_batch(follow, [WITH_FEATURES])
    assert llm.stats.prefill_tokens < sum(map(len, prompts)) + len(follow[0])
    assert torch.allclose(second[0].features, forward_features(model, follow[0], ids), atol=1e-5)


def test_no_features_unless_asked(tiny):
    llm = BatchingLLM(*tiny, seed=0)
    result = llm.generate_batch(chat_prompts(tiny[1], 2), SamplingParams(max_new_tokens=4))
    assert all(r.features is None for r in result)
