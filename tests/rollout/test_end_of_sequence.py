"""Every end-of-sequence id of the model stops a reply and closes the turn (no closing token added).

Qwen2.5's generation config lists ``<|im_end|>`` and ``<|endoftext|>``; here the tiny model's
lists its template's end of turn and a second id the model is known to produce.
"""

from __future__ import annotations

import asyncio
import dataclasses

from agentrl.agents import Agent, load_agent_presets
from agentrl.engines import BatchingLLM, SamplingParams
from agentrl.models import end_of_turn_ids, load_model
from agentrl.rollout import run_episode

GREEDY = SamplingParams(greedy=True, max_new_tokens=16)


def _play(llm, tokenizer):
    config = dataclasses.replace(load_agent_presets()["simpleSokobanAgent"], max_turns=1,
                                 max_response_tokens=16)
    return asyncio.run(run_episode(Agent(config), 0, llm, tokenizer, GREEDY,
                                   max_context_tokens=4096))


def test_a_second_generation_eos_id_stops_the_reply_and_is_not_cut(one_torch_thread):
    model, tokenizer = load_model("tiny")  # its own copy: the generation config is edited
    template_eos = end_of_turn_ids(tokenizer)
    said = _play(BatchingLLM(model, tokenizer, eos_token_ids=template_eos), tokenizer)
    reply = list(said.turns[0].response_ids)
    assert said.turns[0].truncated_by_length  # 16 tokens without an end: the rollout closed it
    k = next(i for i in range(1, len(reply))
             if reply[i] not in reply[:i] and reply[i] not in template_eos)
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, reply[k]]

    llm = BatchingLLM(model, tokenizer)  # stops on every id the generation config lists
    assert reply[k] in llm.eos_token_ids
    again = _play(llm, tokenizer)
    assert list(again.turns[0].response_ids) == reply[:k + 1]  # stopped on the second id
    assert not again.turns[0].truncated_by_length  # a finished reply, not a cut one
    assert again.response_ids == reply[:k + 1]  # no end-of-turn token appended
    assert again.metrics["truncated_turns"] == 0


def test_a_model_folder_keeps_every_eos_id_of_its_generation_config(tmp_path):
    model, tokenizer = load_model("tiny")
    other = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, other]
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, loaded_tokenizer = load_model(str(tmp_path))
    assert loaded.generation_config.eos_token_id == [tokenizer.eos_token_id, other]
    assert other in end_of_turn_ids(loaded_tokenizer, loaded.generation_config)
    assert other in BatchingLLM(loaded, loaded_tokenizer).eos_token_ids
