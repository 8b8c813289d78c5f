"""How one request is decoded, and the choice of each row's next token in a mixed batch.

    from agentrl.engines import SamplingParams
    SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=64, stop_token_ids=(2,))

Why apart from :mod:`agentrl.engines.local`: rows in one batch may use different settings, so
:class:`RowParams` holds them as tensors and :func:`choose` applies them per row, whatever
decodes the batch. **Log-probs** are ``log_softmax(logits / temperature)`` at the chosen token,
over the full vocabulary, *before* top-k/top-p truncation: what verl's actor recomputes for
PPO's ratio (it divides logits by the rollout temperature and never truncates). Greedy rows
report ``log_softmax(logits)`` (temperature 1) of the argmax. Sampled rows draw by inverting the
CDF (:func:`draw`), one uniform number a row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["RowParams", "SamplingParams", "choose", "draw", "truncate"]


@dataclass(frozen=True)
class SamplingParams:
    """How one request is decoded."""

    temperature: float = 1.0
    """Logits are divided by this before sampling and before log-probs; 0 means greedy."""
    top_p: float = 1.0
    """Sample from the smallest set of tokens whose probability reaches top_p (1 = off)."""
    top_k: int = 0
    """Sample from the k most likely tokens (0 = off)."""
    max_new_tokens: int = 256
    """At most this many tokens are generated (a stop token counts)."""
    greedy: bool = False
    """Take the argmax; log-probs are then at temperature 1."""
    stop_token_ids: tuple[int, ...] = ()
    """Generation ends after any of these; it is the last token of the response."""
    constrained_actions: bool = False
    """Asks ``run_episode`` to constrain each reply to the turn's valid actions (it sets
    ``answer_grammar`` per turn); engines read only ``answer_grammar``."""
    answer_grammar: Any = None
    """The replies allowed (an :class:`agentrl.agents.grammar.AnswerGrammar`); None = free.
    Log-probs are then of the masked, renormalized distribution, and the engine returns each
    token's mask (:mod:`agentrl.engines.constrained`)."""
    return_features: bool = False
    """Also return, per generated token, the model's last hidden state before it
    (``Generation.features``): what a critic on the actor's backbone reads, so the trainer
    need not run the backbone again for the rollout's values."""

    def __post_init__(self):
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0


@dataclass
class RowParams:
    """Per-row sampling settings as tensors, so one batch can mix them."""

    greedy: torch.Tensor  # bool [B]
    temperature: torch.Tensor  # float [B]; 1 for greedy rows
    top_k: torch.Tensor  # long [B]; 0 = off
    top_p: torch.Tensor  # float [B]; 1 = off

    @classmethod
    def of(cls, samplings: list[SamplingParams], device: torch.device) -> RowParams:
        greedy = [s.is_greedy for s in samplings]
        return cls(
            greedy=torch.tensor(greedy, device=device),
            temperature=torch.tensor(
                [1.0 if g else s.temperature for g, s in zip(greedy, samplings)], device=device
            ),
            top_k=torch.tensor([s.top_k for s in samplings], device=device),
            top_p=torch.tensor([s.top_p for s in samplings], device=device),
        )

    def select(self, index: torch.Tensor) -> RowParams:
        return RowParams(
            *(t[index] for t in (self.greedy, self.temperature, self.top_k, self.top_p))
        )


def choose(
    logits: torch.Tensor, rows: RowParams, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next token per row and its log-prob (after temperature, before top-k/top-p)."""
    logprobs = torch.log_softmax(logits / rows.temperature[:, None], dim=-1)
    tokens = logits.argmax(dim=-1)
    sampled = ~rows.greedy
    if sampled.any():
        index = sampled.nonzero().squeeze(1)
        sample_lp = truncate(logprobs[index], rows.top_k[index], rows.top_p[index])
        tokens = tokens.index_put((index,), draw(sample_lp.exp(), generator))
    return tokens, logprobs.gather(1, tokens[:, None]).squeeze(1)


def draw(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row from ``probs`` ``[rows, vocab]`` (any scale), by inverting its CDF
    with one uniform number a row: ``torch.multinomial`` draws an exponential number for every
    token of the 49k vocabulary, ~30 ms a batch-16 step on a CPU core, this ~6 ms. The CDF is
    summed in float64, so a token's chance is its probability to ~1e-12."""
    cdf = probs.cumsum(dim=-1, dtype=torch.float64)
    point = torch.rand(len(probs), 1, generator=generator, dtype=torch.float64,
                       device=probs.device) * cdf[:, -1:]
    # the first token whose CDF passes the point: one with probability > 0
    return torch.searchsorted(cdf, point, right=True).squeeze(1).clamp_(max=probs.shape[1] - 1)


def truncate(logprobs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Log-probs with tokens outside each row's top-k / top-p set at -inf (not renormalized)."""
    vocab = logprobs.shape[-1]
    use_k, use_p = (top_k > 0) & (top_k < vocab), top_p < 1
    if not (use_k.any() or use_p.any()):
        return logprobs
    sorted_lp, order = logprobs.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=logprobs.device)
    k = torch.where(use_k, top_k, vocab)
    sorted_lp = sorted_lp.masked_fill(rank[None, :] >= k[:, None], float("-inf"))
    if use_p.any():  # on the top-k-renormalized distribution, as vLLM and transformers do
        probs = torch.softmax(sorted_lp, dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass ranked above each token; keeps >= 1 token
        sorted_lp = sorted_lp.masked_fill(
            use_p[:, None] & (before >= top_p[:, None]), float("-inf")
        )
    return torch.empty_like(logprobs).scatter_(-1, order, sorted_lp)
