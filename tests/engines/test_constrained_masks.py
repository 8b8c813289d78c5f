"""Constrained decoding in the local engine (tiny model): masks, renormalized log-probs, the
token budget, and free rows of the same batch left alone."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from agentrl.agents.grammar import AnswerGrammar
from agentrl.engines import BatchingLLM, SamplingParams
from agentrl.engines.constrained import RowConstraint, TokenTexts

GRAMMARS = [
    AnswerGrammar(actions=("Up", "Down", "Left", "Right"), max_actions=5),
    AnswerGrammar(actions=("take key", "take key from box", "open box"), max_actions=2,
                  think=True),
    AnswerGrammar(actions=("move 1 to 2", "move 2 to 0"), max_actions=3, opening="",
                  closing=""),
]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def llm(tiny):
    engine = BatchingLLM(*tiny, max_batch=16, seed=0)
    yield engine
    engine.close()


def prompts(tokenizer, count: int) -> list[list[int]]:
    return [tokenizer.apply_chat_template([{"role": "user", "content": "play " * (1 + 2 * i)}],
                                          add_generation_prompt=True, tokenize=True,
                                          return_dict=False) for i in range(count)]


@pytest.mark.parametrize("grammar", GRAMMARS)
@pytest.mark.parametrize("max_new_tokens", [48, 20])
def test_replies_follow_the_grammar_and_logprobs_are_masked(llm, tiny, grammar, max_new_tokens):
    """Sampled replies are complete replies of the grammar (even with a short budget); each
    token is in its mask; its log-prob is log_softmax over the allowed tokens only, from a
    fresh forward pass (the distribution the trainer recomputes)."""
    model, tokenizer = tiny
    texts = TokenTexts.of(tokenizer)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens,
                              answer_grammar=grammar)
    batch = prompts(tokenizer, 4)
    for prompt, result in zip(batch, llm.generate_batch(batch, sampling)):
        ids, logprobs = result
        assert ids[-1] in llm.eos_token_ids  # finished within the budget, with end-of-turn
        text = "".join(texts.texts[t] for t in ids[:-1])
        assert grammar.can_stop(grammar.run(grammar.start(), text)), text
        assert len(result.token_masks) == len(ids)
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float()
        for step, (token, mask) in enumerate(zip(ids, result.token_masks)):
            allowed = torch.zeros(logits.shape[-1], dtype=torch.bool)
            allowed[list(mask.ids)] = True
            allowed = allowed if mask.allow else ~allowed
            assert allowed[token]
            expected = torch.log_softmax(logits[step].masked_fill(~allowed, float("-inf")), -1)
            assert logprobs[step] == pytest.approx(expected[token].item(), abs=1e-4)


def test_a_free_row_decodes_as_it_would_alone(llm, tiny):
    """Greedy: a free request batched with constrained ones gets the same tokens and
    log-probs as alone, and no masks."""
    _, tokenizer = tiny
    batch = prompts(tokenizer, 3)
    free = SamplingParams(greedy=True, max_new_tokens=12)
    constrained = dataclasses.replace(free, answer_grammar=GRAMMARS[0])
    mixed = llm.generate_batch(batch, [constrained, free, constrained])
    alone = llm.generate_batch([batch[1]], free)[0]
    assert mixed[1][0] == alone[0] and mixed[1].token_masks is None
    assert mixed[1][1] == pytest.approx(alone[1], abs=1e-5)
    assert mixed[0].token_masks is not None


def test_only_the_templates_end_of_turn_ends_a_constrained_reply(tiny):
    """With two end-of-sequence ids (Qwen2.5: ``<|im_end|>`` and ``<|endoftext|>``), a
    constrained reply ends only on the template's end-of-turn: the other would leave the chat
    without its end-of-turn before the next observation (issue 22, defect 8)."""
    model, tokenizer = tiny
    turn_end, other = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    engine = BatchingLLM(model, tokenizer, eos_token_ids=(other, turn_end), seed=0)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=24, answer_grammar=GRAMMARS[0])
    for result in engine.generate_batch(prompts(tokenizer, 4), sampling):
        assert result[0][-1] == turn_end
        assert all(other not in mask.ids for mask in result.token_masks if mask.allow)
        assert result.token_masks[-1].ids == (turn_end,)
    engine.close()


def test_ids_past_the_tokenizer_are_never_sampled(tiny):
    """A model whose logits are wider than its tokenizer (Qwen2.5: 151,936 vs 151,665), with
    those extra ids the most likely: free thinking under constraints never samples them, and
    the automaton survives one (issue 22, defect 9)."""
    model, tokenizer = tiny
    wide = copy.deepcopy(model)
    vocab, hidden = model.lm_head.weight.shape
    head = torch.nn.Linear(hidden, vocab + 64, bias=True)
    with torch.no_grad():
        head.weight[:vocab] = model.lm_head.weight
        head.weight[vocab:] = 0
        head.bias.zero_()
        head.bias[vocab:] = 50.0
    wide.lm_head = head
    wide.config.vocab_size = vocab + 64
    engine = BatchingLLM(wide, tokenizer, seed=0)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=24, answer_grammar=GRAMMARS[1])
    for result in engine.generate_batch(prompts(tokenizer, 2), sampling):
        assert max(result[0]) < len(tokenizer)
    engine.close()
    row = RowConstraint(GRAMMARS[1], TokenTexts.of(tokenizer), stop_ids={2})
    row.advance(tokenizer.encode("<think>")[0])
    before = row.states
    row.advance(vocab + 5)  # no text: the reply's text, and so its state, is unchanged
    assert row.states == before
