"""Constrained action decoding on verl: the local engine's automaton on both of verl's sides.

    rollout.constrained_actions=true backend=verl        # launch.py wires the pieces below

The local engine masks each reply to the well-formed answers of the turn's valid actions
(:mod:`agentrl.engines.constrained`) and trains on the masked distribution. On verl the same
automaton runs in three processes, with no fork of verl or vLLM:

1. **The sampler** (a vLLM server):
   :class:`agentrl.verl.logits_processor.ConstrainedActionsProcessor`, a vLLM v1 logits
   processor registered through ``rollout.engine_kwargs.vllm.logits_processors``, masks each
   request's logits to the tokens its :class:`TurnConstraint` allows given the tokens
   generated so far in this reply. The AgentLoop sends the constraint in the request's
   ``sampling_params["extra_args"]`` (:data:`EXTRA_ARGS_KEY`).
2. **The AgentLoop** replays the same automaton over the ids the server returned
   (:func:`replay_masks`), so ``run_episode`` stores one mask per reply token as it does
   locally, and the row carries them compactly (:class:`RowMasks`, in
   ``extra_fields[MASKS_FIELD]``: verl makes it a ``non_tensor_batch`` column that travels with
   the row through micro-batching). A token the mask does not allow (the processor was not
   applied) is counted (``constraint_violations``) and the rest of that reply left free, so
   the trainer never scores a sampled token at the mask's fill value.
3. **The trainer**: :class:`agentrl.verl.masked_engine.MaskedLMEngine`, verl's FSDP engine with
   the masks applied to the logits before verl computes log-probs and entropy
   (:func:`mask_logits_`), so old, new and reference log-probs are the sampler's masked
   distribution. The fill is :data:`MASK_FILL`, large and finite (verl's entropy multiplies
   probabilities by logits: ``0 * -inf`` would be NaN), and applied before verl divides by the
   temperature, where the lowest float would overflow to ``-inf``.

Both sides build the automaton from the same :class:`TurnConstraint` (grammar, the reply's end
token, the logits' width and the request's token limit), so the masks agree token for token;
``training/rollout_probs_diff_*`` checks it end to end. Pure Python and torch: no verl, no vLLM.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from agentrl.agents.grammar import AnswerGrammar
from agentrl.engines.constrained import RowConstraint, TokenMask, TokenTexts, apply_masks

__all__ = ["ENGINE_MODULE", "ENGINE_VENDOR", "EXTRA_ARGS_KEY", "MASKS_FIELD", "MASK_FILL",
           "PROCESSOR", "RowMasks", "TurnConstraint", "TurnMasker", "check_verl_config",
           "launch_env", "mask_logits_", "processor_configured", "replay_masks",
           "response_logit_rows", "token_allowed"]

EXTRA_ARGS_KEY = "agentrl_constraint"
"""Key of a request's ``sampling_params["extra_args"]`` holding its :class:`TurnConstraint`."""
MASKS_FIELD = "agentrl_token_masks"
"""``extra_fields`` key (then ``non_tensor_batch`` column) of a row's :class:`RowMasks`."""
PROCESSOR = "agentrl.verl.logits_processor:ConstrainedActionsProcessor"
"""The vLLM logits processor, as vLLM's ``logits_processors`` engine argument names it."""
ENGINE_VENDOR = "agentrl_masked"
"""The vendor :class:`~agentrl.verl.masked_engine.MaskedLMEngine` is registered under in verl's
``EngineRegistry``; ``VERL_ENGINE_VENDOR`` set to it makes verl's actor and reference pick it."""
ENGINE_MODULE = "agentrl.verl.masked_engine"
"""The module that registers the masked engine (imported by every verl process)."""
MASK_FILL = -1.0e9
"""The logit of a token the mask excludes: its probability is exactly 0 in float32 and bfloat16
(as with ``-inf``), and it stays finite after division by any temperature >= 1e-29."""
GRAMMAR_FIELDS = ("actions", "separator", "max_actions", "opening", "closing", "think")


@dataclasses.dataclass(frozen=True)
class TurnConstraint:
    """Everything that determines one reply's masks: both sides build the automaton from it."""

    grammar: AnswerGrammar
    reply_ends: tuple[int, ...]
    """The tokens that end a complete reply (the chat template's end-of-turn)."""
    width: int
    """The model's logits per token (ids past the tokenizer's are never allowed)."""
    max_tokens: int
    """The request's token limit: the automaton keeps room to finish the reply within it."""

    def to_wire(self) -> dict[str, Any]:
        """Plain data for the request's ``extra_args`` (vLLM serializes it to its engine)."""
        grammar = {key: getattr(self.grammar, key) for key in GRAMMAR_FIELDS}
        grammar["actions"] = list(grammar["actions"])
        return {"grammar": grammar, "reply_ends": list(self.reply_ends), "width": self.width,
                "max_tokens": self.max_tokens}

    @classmethod
    def from_wire(cls, data: Any) -> TurnConstraint:
        """The constraint of :meth:`to_wire`'s data; ValueError naming what is malformed."""
        if not isinstance(data, Mapping):
            raise ValueError(f"extra_args.{EXTRA_ARGS_KEY} must be a mapping, got "  # noqa: TRY004
                             f"{type(data).__name__}")
        try:
            grammar = dict(data["grammar"])
            grammar["actions"] = tuple(str(a) for a in grammar["actions"])
            constraint = cls(AnswerGrammar(**{key: grammar[key] for key in GRAMMAR_FIELDS}),
                             tuple(int(t) for t in data["reply_ends"]), int(data["width"]),
                             int(data["max_tokens"]))
        except (KeyError, TypeError) as error:
            raise ValueError(f"extra_args.{EXTRA_ARGS_KEY} is malformed ({error!r}); it needs "
                             f"grammar {list(GRAMMAR_FIELDS)}, reply_ends, width and "
                             "max_tokens") from None
        if not constraint.reply_ends or constraint.max_tokens < 1 or constraint.width < 1:
            raise ValueError(f"extra_args.{EXTRA_ARGS_KEY}: reply_ends must be non-empty and "
                             f"width, max_tokens >= 1, got {data!r}")
        return constraint

    def automaton(self, texts: TokenTexts) -> RowConstraint:
        """The reply's decoding state, at its start."""
        return RowConstraint(self.grammar, texts, self.reply_ends, self.width)


class TurnMasker:
    """One request's reply on the sampler's side (vLLM's per-request logits processor): advances
    the automaton over the ids generated since the last call and masks the logits row for the
    next one (excluded ids at -inf, as the local engine samples)."""

    def __init__(self, constraint: TurnConstraint, texts: TokenTexts):
        self.constraint = constraint
        self.row = constraint.automaton(texts)
        self.seen = 0

    def __call__(self, output_ids: Sequence[int], logits: torch.Tensor) -> torch.Tensor:
        for token in output_ids[self.seen:]:
            self.row.advance(int(token))
        self.seen = len(output_ids)
        mask = self.row.mask(self.constraint.max_tokens - self.seen)
        apply_masks(logits.view(1, -1), [mask])
        return logits


def processor_configured(rollout_config: Any) -> bool:
    """Whether verl's rollout config (``actor_rollout_ref.rollout``) gives vLLM our logits
    processor: the AgentLoop constrains replies exactly then (a constraint vLLM ignored would
    leave the sampler unmasked)."""
    engine_kwargs = (rollout_config.get("engine_kwargs") or {}).get("vllm") or {}
    return PROCESSOR in list(engine_kwargs.get("logits_processors") or ())


def launch_env() -> dict[str, str]:
    """Environment every verl process of a constrained run gets: verl's engine lookup picks
    the masked engine (device ``cuda``, as verl registers its FSDP engines; the CPU platform
    sets the same). The launch adds :data:`ENGINE_MODULE` to ``VERL_USE_EXTERNAL_MODULES``."""
    return {"VERL_ENGINE_VENDOR": ENGINE_VENDOR, "VERL_ENGINE_DEVICE": "cuda"}


INCOMPATIBLE = (
    ("actor_rollout_ref.model.use_fused_kernels", lambda v: bool(v), False,
     "fused kernels compute log-probs without the logits the masks apply to"),
    *((f"actor_rollout_ref.actor.{where}ulysses_sequence_parallel_size", lambda v: (v or 1) > 1,
       1, "Ulysses sequence parallelism splits a row's logits over ranks")
      for where in ("", "fsdp_config.")),
    ("actor_rollout_ref.model.mtp.enable", lambda v: bool(v), False,
     "speculative decoding: vLLM refuses custom logits processors with it"),
    ("actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config", lambda v: v is not None,
     None, "speculative decoding: vLLM refuses custom logits processors with it"),
)
"""verl settings a constrained run refuses: (key, refused when, allowed value, why)."""


def check_verl_config(verl_config: Any) -> None:
    """Refuse what cannot train on the masks (:data:`INCOMPATIBLE`), naming the key, when
    verl's composed config constrains replies."""
    from omegaconf import OmegaConf

    if not processor_configured(verl_config.actor_rollout_ref.rollout):
        return
    for key, refused, allowed, why in INCOMPATIBLE:
        value = OmegaConf.select(verl_config, key, default=None)
        if refused(value):
            raise ValueError(f"{key}={value!r} is not allowed with rollout.constrained_actions="
                             f"true: {why}; allowed: {allowed!r}")


def token_allowed(mask: TokenMask, token: int) -> bool:
    return (token in mask.ids) == mask.allow


def replay_masks(constraint: TurnConstraint, texts: TokenTexts, ids: Sequence[int]
                 ) -> tuple[list[TokenMask | None], int]:
    """The mask each of ``ids`` was sampled under, and how many were outside their mask (0
    when the sampler applied the constraint). From the first such token on, the reply's
    masks are None (free): the trainer never scores a sampled token at the fill value."""
    row = constraint.automaton(texts)
    masks: list[TokenMask | None] = []
    for step, token in enumerate(ids):
        mask = row.mask(constraint.max_tokens - step)
        if not token_allowed(mask, token):
            return masks + [None] * (len(ids) - step), 1
        masks.append(mask)
        row.advance(token)
    return masks, 0


@dataclasses.dataclass(frozen=True)
class RowMasks:
    """One row's masks, compactly: its distinct masks once, and per response position the index
    of its mask (-1 = free: observations, unconstrained tokens and padding)."""

    allow: tuple[bool, ...]
    ids: tuple[tuple[int, ...], ...]
    index: tuple[int, ...]

    @classmethod
    def pack(cls, token_masks: Sequence[TokenMask | None] | None) -> RowMasks | None:
        """The masks of a row's response tokens (None where free); None when all are free."""
        if token_masks is None or all(m is None for m in token_masks):
            return None
        distinct: dict[tuple[bool, tuple[int, ...]], int] = {}
        index = [-1 if m is None else distinct.setdefault((m.allow, m.ids), len(distinct))
                 for m in token_masks]
        return cls(tuple(allow for allow, _ in distinct), tuple(ids for _, ids in distinct),
                   tuple(index))

    @classmethod
    def of(cls, value: RowMasks | Mapping[str, Any] | None) -> RowMasks | None:
        """``value`` as a RowMasks: in the V1 trainer a row's masks reach the engine as their
        fields' dict (``AgentLoopOutput.as_dict`` is pydantic's ``model_dump``, which turns a
        dataclass into one; lists may stand for tuples)."""
        if value is None or isinstance(value, RowMasks):
            return value
        return cls(tuple(value["allow"]), tuple(tuple(ids) for ids in value["ids"]),
                   tuple(value["index"]))

    def token_masks(self) -> list[TokenMask | None]:
        """Per response position, its mask (None where free): the inverse of :meth:`pack`."""
        masks = [TokenMask(ids, allow) for allow, ids in zip(self.allow, self.ids)]
        return [None if k < 0 else masks[k] for k in self.index]


def response_logit_rows(sequence_ends: Sequence[int], response_lengths: Sequence[int]
                        ) -> list[int]:
    """Per row, the logits row that predicts its first response token: responses end their
    row's sequence, and position ``p``'s logits predict the token at ``p + 1`` (the labels
    verl rolls by one), as in verl's ``no_padding_2_padding``. ``sequence_ends``: where each
    row's sequence ends in the logits' rows (packed: the cumulative lengths; padded: row
    ``i``'s start ``i * width`` plus its length)."""
    return [int(end) - int(length) - 1 for end, length in zip(sequence_ends, response_lengths)]


def mask_logits_(logits: torch.Tensor, first_rows: Sequence[int],
                 rows: Sequence[RowMasks | None]) -> torch.Tensor:
    """``logits`` ``(positions, vocab)`` with each constrained response token's excluded ids at
    :data:`MASK_FILL`, in place (autograd sees one index_put); ``first_rows[i]``: the logits
    row predicting row ``i``'s first response token (:func:`response_logit_rows`).

    One gather of the constrained positions' rows and one write back, whatever the number of
    distinct masks: every write into the logits in place costs the backward pass a copy of the
    whole logits' gradient, so one write per distinct mask made the update grow with the masks
    of a micro-batch. The exclusions are a boolean of the constrained positions only
    (``(constrained tokens, vocab)``, a quarter of their fp32 rows' gather), built from each
    distinct mask once."""
    vocab = logits.shape[-1]
    groups: dict[tuple[bool, tuple[int, ...]], list[int]] = {}
    for first, row in zip(first_rows, rows):
        if row is None:
            continue
        for column, k in enumerate(row.index):
            if k >= 0:
                groups.setdefault((row.allow[k], row.ids[k]), []).append(first + column)
    if not groups:
        return logits
    positions = [position for group in groups.values() for position in group]
    excluded = torch.empty(len(positions), vocab, dtype=torch.bool, device=logits.device)
    start = 0
    for (allow, ids), group in groups.items():
        listed = torch.zeros(vocab, dtype=torch.bool, device=logits.device)
        listed[torch.tensor([t for t in ids if 0 <= t < vocab], dtype=torch.long,
                            device=logits.device)] = True
        excluded[start:start + len(group)] = ~listed if allow else listed
        start += len(group)
    where = torch.tensor(positions, dtype=torch.long, device=logits.device)
    logits[where] = logits[where].masked_fill(excluded, MASK_FILL)
    return logits
