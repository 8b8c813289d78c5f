"""A local generation engine: concurrent ``generate`` calls batched onto one transformers model.

    from agentrl.engines import BatchingLLM, SamplingParams
    from agentrl.models import load_model, end_of_turn_ids
    model, tokenizer = load_model("embedded")
    llm = BatchingLLM(model, tokenizer, max_batch=16, seed=0)
    ids, logprobs = await llm.generate(prompt_ids, SamplingParams(temperature=0.7))

This is the rollout layer's ``llm`` on a laptop: many episodes ``await llm.generate(...)`` at
once; a background task gathers the waiting requests (up to ``max_batch``, waiting at most
``max_wait_ms`` for more once the first arrives) into one left-padded batch and decodes it in a
worker thread, so the event loop keeps stepping environments meanwhile. Each caller gets its own
``(response_ids, logprobs)``.

Decoding is our own loop over the model with a KV cache (not ``model.generate``):

- Left padding: prompts are right-aligned; the attention mask hides the pads and position ids
  count real tokens only, so a prompt decodes the same alone or in a batch (up to float noise).
- Each row stops on its own, at a stop token (kept in the output, as vLLM does) or at its own
  ``max_new_tokens``; finished rows are dropped from the batch and its cache.
- Rows in one batch may use different sampling settings (temperature, top-k, top-p, greedy are
  applied per row).
- **Log-probs** (:mod:`agentrl.engines.sampling`) are ``log_softmax(logits / temperature)`` at the
  sampled token, over the full vocabulary, *before* top-k/top-p truncation. That is what verl's
  actor recomputes for PPO's ratio (it divides logits by the rollout temperature and never
  truncates), so old and new log-probs agree. Greedy rows (``greedy=True`` or ``temperature=0``)
  report ``log_softmax(logits)`` (temperature 1) of the argmax.
- Sampling draws from one seedable ``torch.Generator``: the same requests batched the same way
  give the same tokens. Which requests share a batch depends on timing, so concurrent sampling
  runs are reproducible only through :meth:`generate_batch` or with ``max_batch=1``.
- **Prefix cache** (``prefix_cache_tokens > 0``; :mod:`agentrl.engines.prefix_cache`): a
  finished request's keys and values are kept, and a later prompt that extends it (the next
  turn of the episode) reads only its new tokens. Identical prompts in one batch (a group's
  first turn) are read once and their rows repeated. The stored rows sit left-padded before the
  new tokens, with the same masking and positions, so a row decodes as it would from scratch.
- **Constrained replies** (``SamplingParams.answer_grammar``): each such row's logits are
  masked to the tokens that continue its grammar (:mod:`agentrl.engines.constrained`) before
  sampling; its log-probs are of that masked, renormalized distribution, and its result
  (a :class:`~agentrl.engines.constrained.Generation`) carries each token's mask
  (``token_masks``) so the trainer can recompute the same distribution.
- **Jump-forward** (``jump_forward=True``, the default; :mod:`agentrl.engines.replies`): after a
  constrained row's token, the tokens its grammar then forces (one allowed id: the tags, ``move``,
  ``to``, the end of turn) are appended at once, with log-prob 0 (probability 1 under their one-id
  mask, which they carry like any token) and no decode step of their own; the next step feeds the
  row's chosen token and its forced ones together (rows left-padded to the longest), so a forced
  run costs one forward pass, not one each. The distribution is that of step-by-step decoding;
  greedy decoding gives the same tokens, log-probs and masks (tests compare them), while sampling
  with the same seed draws differently (a forced token draws no random number);
  ``GenerationStats.decode_steps`` counts the forward passes and ``jumped_tokens`` the tokens that
  had none. A row asking for features never jumps its last token (its feature needs the pass over
  the tokens before it); a row that ends in a jump stores in the prefix cache the tokens it fed.
- **Masked head** (``masked_head=True``, the default; static-cache path): a constrained row
  whose mask allows a few ids gets only those logits from the LM head, the rest -inf, which is
  what the mask would leave of the full row (the head is a fifth of the embedded model's step).
- **Decode steps** run over a preallocated key/value cache with matmul attention over the
  grouped heads (:mod:`agentrl.engines.static_cache`) for Llama-style models in float32: no
  per-token cache copies. Other models, and bf16 autocast, step through the model's forward
  with a ``DynamicCache``. Both give the model's own tokens and log-probs (tests compare them).
- Sampled rows draw their token by inverting the CDF (float64) with one uniform number a row,
  not ``torch.multinomial`` (an exponential number per vocabulary entry): the same
  distribution at about a fifth of the cost, but a seed gives other draws than before.
- **Features** (``SamplingParams.return_features``): each generated token's last hidden state
  (after the final norm, the input of the LM head), as the trainer's forward gives it
  (``output_hidden_states``): a shared-backbone critic's values without another backbone pass.
- Like vLLM, generation also stops at end-of-sequence: ``eos_token_ids`` (default
  ``end_of_turn_ids(tokenizer, model.generation_config)``) are added to every request's ``stop_token_ids``; pass
  ``eos_token_ids=()`` to turn that off.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from agentrl.engines import static_cache
from agentrl.engines.constrained import (
    Generation,
    RowConstraint,
    TokenTexts,
    apply_masks,
)
from agentrl.engines.prefix_cache import PrefixCache
from agentrl.engines.replies import Replies, allowed_ids, chunk_inputs
from agentrl.engines.sampling import RowParams, SamplingParams, choose
from agentrl.models.parts import backbone_of, plain_head
from agentrl.models.precision import compute_precision

__all__ = ["BatchingLLM", "GenerationStats", "SamplingParams"]


@dataclass
class GenerationStats:
    """Counters since construction (or ``reset_stats``)."""

    requests: int = 0
    batches: int = 0
    prompt_tokens: int = 0
    prefill_tokens: int = 0
    """Of the prompt tokens, those the model read: the rest came from the prefix cache or
    were an identical prompt of the same batch."""
    generated_tokens: int = 0
    generation_seconds: float = 0.0
    """Wall time inside the decode loop (prefill + decode), summed over batches."""
    prefill_seconds: float = 0.0
    """The part of generation_seconds spent on the prompts' forward pass (and copying its keys
    and values into the decode cache)."""
    constraint_seconds: float = 0.0
    """The part of generation_seconds spent on constrained rows' token masks: building and
    applying them, and moving each row's grammar past its token
    (:mod:`agentrl.engines.constrained`)."""
    max_batch_size: int = 0
    decode_steps: int = 0
    """Batched forward passes after the prefills: each chooses one token a row (a row's
    further tokens that its grammar forces ride along in the same pass: ``jumped_tokens``)."""
    jumped_tokens: int = 0
    """Of the generated tokens, those a constrained row's grammar forced (the only allowed id
    after the previous token), appended without a decode step of their own (jump-forward)."""

    @property
    def mean_batch_size(self) -> float:
        return self.requests / self.batches if self.batches else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per second of generation, prefill included."""
        return self.generated_tokens / self.generation_seconds if self.generation_seconds else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        """Generated tokens per second of the token-by-token part alone."""
        decode = self.generation_seconds - self.prefill_seconds
        return self.generated_tokens / decode if decode > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            **asdict(self),
            "mean_batch_size": self.mean_batch_size,
            "tokens_per_second": self.tokens_per_second,
            "decode_tokens_per_second": self.decode_tokens_per_second,
        }


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    future: asyncio.Future = field(repr=False)


class BatchingLLM:
    """Batches concurrent ``generate`` calls onto one causal LM (CPU or one CUDA device).

    Args:
        model: a transformers causal LM (anything taking ``input_ids, attention_mask,
            position_ids, past_key_values, use_cache, logits_to_keep``).
        tokenizer: its tokenizer; gives the pad id and the default end-of-sequence ids.
        max_batch: the most requests decoded together.
        max_wait_ms: once a request arrives, how long to wait for more before decoding.
        device: where to run; default the model's device (the model is moved if different).
        seed: seeds the sampling generator (None: a random seed).
        eos_token_ids: always stop on these; default ``end_of_turn_ids(tokenizer,
            model.generation_config)`` (every end-of-sequence id the model lists).
        prefix_cache_tokens: keys and values of finished requests kept for prompts that extend
            them, in tokens (0 = off; see :mod:`agentrl.engines.prefix_cache`). After changing
            the model's weights, call :meth:`clear_prefix_cache`.
        compute_dtype: autocast the forward passes to this dtype (``bfloat16``: float32
            weights, bf16 matmuls, as the local trainer computes); None = the weights' dtype.
        jump_forward: where a constrained row's grammar allows one token only, append it
            without a decode step of its own (see the module docstring); False decodes every
            token in its own step (the same distribution, more forward passes).
        masked_head: on the static-cache path, a constrained row whose mask allows a few ids
            gets only their logits from the LM head (a few of its 49k rows), the rest -inf:
            the same masked distribution at a fraction of the head's cost.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch: int = 16,
        max_wait_ms: float = 5,
        device: str | torch.device | None = None,
        seed: int | None = None,
        eos_token_ids: Sequence[int] | None = None,
        prefix_cache_tokens: int = 0,
        compute_dtype: str | torch.dtype | None = None,
        jump_forward: bool = True,
        masked_head: bool = True,
    ):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.device = torch.device(device) if device is not None else _model_device(model)
        if _model_device(model) != self.device:
            model.to(self.device)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.max_wait_ms = max_wait_ms
        self.pad_token_id = _pad_id(tokenizer)
        if eos_token_ids is None:
            from agentrl.models.templates import end_of_turn_ids

            eos_token_ids = end_of_turn_ids(tokenizer, getattr(model, "generation_config", None))
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.turn_end_id = _turn_end(tokenizer)
        self.max_positions = getattr(model.config, "max_position_embeddings", None)
        self.compute_dtype = compute_dtype
        self.jump_forward = jump_forward
        self.masked_head = masked_head
        self.generator = torch.Generator(device=self.device)
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)
        self.stats = GenerationStats()
        self._stats_lock = threading.Lock()
        self.prefix_cache = PrefixCache(prefix_cache_tokens)
        self._cache_usable: bool | None = None  # known after the first prefill
        self._static: bool | None = None  # decode over a static cache (static_cache.supports)
        self._plain_head: bool | None = None  # logits = output embedding (models.parts)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentrl-llm")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue | None = None
        self._worker: asyncio.Task | None = None

    # ----------------------------------------------------------------------- async API

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams = SamplingParams()  # noqa: B008
    ) -> tuple[list[int], list[float]]:
        """Response token ids and the log-prob of each, batched with concurrent callers."""
        prompt = [int(t) for t in prompt_ids]
        self._check(prompt, sampling)
        queue = self._ensure_worker()
        future = asyncio.get_running_loop().create_future()
        queue.put_nowait(_Request(prompt, sampling, future))
        return await future

    def clear_prefix_cache(self) -> None:
        """Forget every stored prefix: they were computed with the weights before a change."""
        self.prefix_cache.clear()

    def reset_stats(self) -> None:
        with self._stats_lock:
            self.stats = GenerationStats()

    async def aclose(self) -> None:
        """:meth:`close` from inside the event loop that ran the requests: also waits for the
        batching task to finish its cancellation, so the loop can close cleanly."""
        worker = self._worker
        self.close()
        if worker is not None:
            await asyncio.gather(worker, return_exceptions=True)

    def close(self) -> None:
        """Stop the batching task and the worker thread (waits for a running batch), and free
        the prefix cache (up to ``prefix_cache_tokens`` of keys and values: gigabytes)."""
        if self._worker is not None and not self._worker.done():
            self._worker.cancel()
        self._executor.shutdown(wait=True)
        self.prefix_cache.clear()

    def _ensure_worker(self) -> asyncio.Queue:
        """The queue of the batching task on the running loop (a new loop gets a new task)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._worker is None or self._worker.done():
            self._loop = loop
            self._queue = asyncio.Queue()
            self._worker = loop.create_task(self._batch_forever(self._queue), name="agentrl-llm")
        return self._queue

    async def _batch_forever(self, queue: asyncio.Queue) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await queue.get()]
            deadline = loop.time() + self.max_wait_ms / 1000
            while len(batch) < self.max_batch:
                if not queue.empty():
                    batch.append(queue.get_nowait())
                    continue
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(queue.get(), remaining))
                except asyncio.TimeoutError:
                    break
            batch = [r for r in batch if not r.future.done()]  # callers cancelled while queued
            if not batch:
                continue
            try:
                results = await loop.run_in_executor(
                    self._executor,
                    self.generate_batch,
                    [r.prompt_ids for r in batch],
                    [r.sampling for r in batch],
                )
            except Exception as error:  # noqa: BLE001 - the batch failed: every caller sees why
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(error)
            else:
                for request, result in zip(batch, results):
                    if not request.future.done():
                        request.future.set_result(result)

    # ----------------------------------------------------------------------- decode loop

    def generate_batch(
        self,
        prompts: Sequence[Sequence[int]],
        samplings: SamplingParams | Sequence[SamplingParams] = SamplingParams(),  # noqa: B008
    ) -> list[Generation]:
        """Decode ``prompts`` together, now, in this thread; one result per prompt.

        The synchronous core of :meth:`generate`; any batch size (not capped by max_batch).
        """
        if isinstance(samplings, SamplingParams):
            samplings = [samplings] * len(prompts)
        if len(samplings) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(samplings)} sampling params")
        prompts = [[int(t) for t in p] for p in prompts]
        for prompt, sampling in zip(prompts, samplings):
            self._check(prompt, sampling)
        if not prompts:
            return []
        start = time.perf_counter()
        with torch.inference_mode():
            results, prefill_seconds, prefill_tokens = self._decode(prompts, list(samplings))
        seconds = time.perf_counter() - start
        with self._stats_lock:
            self.stats.requests += len(prompts)
            self.stats.batches += 1
            self.stats.prompt_tokens += sum(map(len, prompts))
            self.stats.prefill_tokens += prefill_tokens
            self.stats.generated_tokens += sum(len(ids) for ids, _ in results)
            self.stats.generation_seconds += seconds
            self.stats.prefill_seconds += prefill_seconds
            self.stats.max_batch_size = max(self.stats.max_batch_size, len(prompts))
        return results

    def _decode(
        self, prompts: list[list[int]], samplings: list[SamplingParams]
    ) -> tuple[list[Generation], float, int]:
        """Results per prompt, the seconds the prefill took and the tokens it read."""
        device, n = self.device, len(prompts)
        # identical prompts (a group's first turn) are read once, then their rows repeated
        unique: dict[tuple[int, ...], int] = {}
        owner = [unique.setdefault(tuple(prompt), len(unique)) for prompt in prompts]
        cache, input_ids, attention_mask, position_ids = self._prefill_inputs(list(unique))
        prefill_tokens = int(attention_mask[:, -input_ids.shape[1]:].sum())

        rows = RowParams.of(samplings, device)
        stops = [set(s.stop_token_ids) | set(self.eos_token_ids) for s in samplings]
        replies = Replies(samplings, stops, self._constraints(samplings, stops),
                           self.jump_forward)
        with_features = any(s.return_features for s in samplings)
        active = list(range(n))  # original row of each batch row still decoding

        start = time.perf_counter()
        logits, hidden = self._forward(input_ids, attention_mask, position_ids, cache,
                                       with_features)
        rows_index = torch.tensor(owner, device=device) if len(unique) < n else None
        if rows_index is not None:
            logits, position_ids = logits[rows_index], position_ids[rows_index]
            hidden = None if hidden is None else hidden[rows_index]
        decoder = self._decoder(cache, attention_mask, rows_index,
                                max(s.max_new_tokens for s in samplings), with_features)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        prefill_seconds = time.perf_counter() - start
        next_positions = position_ids[:, -1] + 1
        steps = 0
        masks = replies.masks(active)
        while True:
            if masks is not None:  # each constrained row: only tokens that continue its grammar
                mask_start = time.perf_counter()
                logits = apply_masks(logits, masks)
                replies.constraint_seconds += time.perf_counter() - mask_start
            tokens, logprobs = choose(logits, rows, self.generator)
            last = hidden[:, -1].float().cpu() if with_features else None
            keep, chunks = [], []
            for batch_row, (token, logprob) in enumerate(zip(tokens.tolist(), logprobs.tolist())):
                row = active[batch_row]
                chunk = replies.add(row, token, logprob,
                                    None if masks is None else masks[batch_row],
                                    None if last is None else last[batch_row])
                if replies.done(row):
                    self._remember(prompts[row] + replies.cached_ids(row), decoder, batch_row)
                else:
                    keep.append(batch_row)
                    chunks.append(chunk)
            if not keep:
                with self._stats_lock:
                    self.stats.constraint_seconds += replies.constraint_seconds
                    self.stats.decode_steps += steps
                    self.stats.jumped_tokens += replies.jumped
                return replies.results(), prefill_seconds, prefill_tokens
            if len(keep) < len(active):  # drop finished rows from every per-row tensor
                index = torch.tensor(keep, device=device)
                decoder.keep(keep)
                next_positions = next_positions[index]
                rows = rows.select(index)
                active = [active[i] for i in keep]
            inputs, valid, positions, lengths = chunk_inputs(chunks, next_positions,
                                                              self.pad_token_id)
            masks = replies.masks(active)
            logits, hidden = decoder.step(inputs, positions, valid,
                                          allowed_ids(masks) if self.masked_head else None)
            steps += 1
            replies.stepped(active, chunks, hidden if with_features else None)
            next_positions = next_positions + lengths

    def _decoder(self, cache: Any, attention_mask: torch.Tensor, rows: torch.Tensor | None,
                 steps: int, with_features: bool = False) -> Any:
        """The decode steps after the prefill: over a preallocated cache where the model allows
        it (:mod:`agentrl.engines.static_cache`), else the model's forward on its own cache."""
        if self._cache_usable is None:  # a cache we can slice: full attention, every layer
            self._cache_usable = all(type(layer).__name__ == "DynamicLayer"
                                     for layer in getattr(cache, "layers", [None]))
        if self._static is None:
            self._static = static_cache.supports(self.model)
        fp32 = self.compute_dtype in (None, "float32", torch.float32)
        if self._static and fp32 and self._cache_usable:
            return static_cache.StaticCacheDecoder.build(self.model, cache, attention_mask, rows,
                                                         steps)
        return _DynamicCacheDecoder(self, cache, attention_mask, rows, with_features)

    def _constraints(self, samplings: list[SamplingParams],
                     stops: list[set[int]]) -> list[RowConstraint | None]:
        """Per row, its grammar's decoding state (None: unconstrained)."""
        if all(s.answer_grammar is None for s in samplings):
            return [None] * len(samplings)
        texts = TokenTexts.of(self.tokenizer)
        if any(s.answer_grammar is not None and not stop for s, stop in zip(samplings, stops)):
            raise ValueError("a constrained request needs a stop token (stop_token_ids or the "
                             "engine's eos_token_ids) to end its reply on")
        width = getattr(self.model.config, "vocab_size", None)
        return [None if s.answer_grammar is None else
                RowConstraint(s.answer_grammar, texts, self._reply_ends(stop), width)
                for s, stop in zip(samplings, stops)]

    def _reply_ends(self, stops: set[int]) -> set[int]:
        """The tokens that end a constrained reply: the chat template's end-of-turn alone
        where it is a stop token (another end-of-sequence id, e.g. Qwen2.5's
        ``<|endoftext|>``, would leave the chat without its end-of-turn), else every stop."""
        return {self.turn_end_id} if self.turn_end_id in stops else stops

    def _prefill_inputs(self, prompts: list[tuple[int, ...]]):
        """The cache (stored prefixes, left-padded) and the prefill's ids, attention mask over
        cache + ids, and positions. Each prompt's stored prefix comes from the prefix cache; the
        rest of it is right-aligned in ``input_ids``. Pads (in both parts) are masked out and
        positions count real tokens only, so a row decodes as it would alone."""
        from transformers import DynamicCache

        device = self.device
        hits = [self.prefix_cache.longest_prefix(p) if self._cache_usable else None
                for p in prompts]
        cached = [len(hit.ids) if hit else 0 for hit in hits]
        past = max(cached)
        rests = [prompt[c:] for prompt, c in zip(prompts, cached)]
        width = max(map(len, rests))
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), past + width), dtype=torch.long)
        for row, (rest, c) in enumerate(zip(rests, cached)):
            input_ids[row, width - len(rest):] = torch.tensor(rest)
            attention_mask[row, past - c:past] = 1
            attention_mask[row, past + width - len(rest):] = 1
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, past:]
        cache = DynamicCache(config=self.model.config)
        layers = len(next(hit for hit in hits if hit).keys) if past else 0
        for layer in range(layers):  # the stored prefixes, left-padded to ``past``
            cache.update(_left_padded([hit.keys[layer] if hit else None for hit in hits], past),
                         _left_padded([hit.values[layer] if hit else None for hit in hits], past),
                         layer)
        return cache, input_ids, attention_mask, position_ids

    def _remember(self, ids: list[int], decoder: Any, batch_row: int) -> None:
        """Store a finished row's keys and values under ``ids`` (its prompt and reply but the
        last token), for a later prompt that extends them."""
        if self.prefix_cache.max_tokens == 0 or not self._cache_usable:
            return
        keys, values = decoder.row(batch_row)
        if keys[0].shape[1] != len(ids):
            raise RuntimeError(f"prefix cache: {keys[0].shape[1]} cached positions for "
                               f"{len(ids)} ids")
        self.prefix_cache.put(ids, keys, values)

    def _forward(self, input_ids, attention_mask, position_ids, cache,
                 with_features: bool = False, keep: int = 1
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits of the last position, float32, shape [batch, vocab], and the last hidden
        states of the last ``keep`` positions [batch, keep, hidden] if ``with_features`` (else
        None): the backbone's output and the head on it where the head is plain
        (:func:`agentrl.models.parts.plain_head`), not every layer's states of a whole
        prefill."""
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask,
                  "position_ids": position_ids, "past_key_values": cache, "use_cache": True}
        with compute_precision(self.device, self.compute_dtype):
            if not with_features:
                return self.model(**inputs, logits_to_keep=1).logits[:, -1, :].float(), None
            if self._plain_head is None:
                self._plain_head = plain_head(self.model)
            if self._plain_head:  # not the whole prefill's states: a copy of the last positions
                hidden = backbone_of(self.model)(**inputs).last_hidden_state[:, -keep:].clone()
                return self.model.get_output_embeddings()(hidden[:, -1]).float(), hidden
            out = self.model(**inputs, logits_to_keep=1, output_hidden_states=True)
        return out.logits[:, -1, :].float(), out.hidden_states[-1][:, -keep:]

    def _check(self, prompt: list[int], sampling: SamplingParams) -> None:
        if not isinstance(sampling, SamplingParams):
            raise TypeError(f"sampling must be SamplingParams, got {type(sampling).__name__}")
        if not prompt:
            raise ValueError("prompt_ids is empty")
        if self.max_positions and len(prompt) + sampling.max_new_tokens > self.max_positions:
            raise ValueError(
                f"prompt ({len(prompt)} tokens) + max_new_tokens ({sampling.max_new_tokens}) "
                f"exceeds the model's {self.max_positions} positions"
            )


class _DynamicCacheDecoder:
    """Decode steps through the model's own forward and its ``DynamicCache`` (any model): the
    same interface as :class:`~agentrl.engines.static_cache.StaticCacheDecoder`."""

    def __init__(self, llm: BatchingLLM, cache: Any, attention_mask: torch.Tensor,
                 rows: torch.Tensor | None, with_features: bool = False):
        if rows is not None:  # identical prompts were read once: repeat their rows
            cache.batch_select_indices(rows)
            attention_mask = attention_mask[rows]
        self.llm, self.cache, self.attention_mask = llm, cache, attention_mask
        self.with_features = with_features

    def step(self, tokens: torch.Tensor, positions: torch.Tensor,
             valid: torch.Tensor | None = None, allowed: Any = None
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As :meth:`StaticCacheDecoder.step`; every logit is computed (``allowed`` unused)."""
        mask = self.attention_mask
        new = mask.new_ones(tokens.shape) if valid is None else valid.to(mask.dtype)
        self.attention_mask = torch.cat([mask, new], 1)
        return self.llm._forward(tokens, self.attention_mask, positions, self.cache,
                                 self.with_features, keep=tokens.shape[1])

    def keep(self, kept: list[int]) -> None:
        index = torch.tensor(kept, device=self.attention_mask.device)
        self.cache.batch_select_indices(index)
        self.attention_mask = self.attention_mask[index]

    def row(self, batch_row: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        real = self.attention_mask[batch_row].nonzero().squeeze(1)
        return ([layer.keys[batch_row][:, real] for layer in self.cache.layers],
                [layer.values[batch_row][:, real] for layer in self.cache.layers])


def _left_padded(parts: list[torch.Tensor | None], width: int) -> torch.Tensor:
    """``[rows, heads, width, dim]``: each row's ``[heads, length, dim]`` at the right end,
    zeros before it (a whole row of zeros for ``None``)."""
    sample = next(part for part in parts if part is not None)
    heads, _, dim = sample.shape
    out = sample.new_zeros(len(parts), heads, width, dim)
    for row, part in enumerate(parts):
        if part is not None:
            out[row, :, width - part.shape[1]:] = part
    return out


def _model_device(model: Any) -> torch.device:
    return next(model.parameters()).device


def _turn_end(tokenizer: Any) -> int | None:
    """The token the chat template ends an assistant turn with (else eos; None: neither)."""
    from agentrl.models.templates import end_of_turn_ids

    try:
        return end_of_turn_ids(tokenizer)[0]
    except ValueError:
        return None


def _pad_id(tokenizer: Any) -> int:
    for token_id in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if token_id is not None:
            return int(token_id)
    return 0
