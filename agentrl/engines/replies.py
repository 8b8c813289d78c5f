"""One batch's replies as the engine decodes them: per row its tokens, log-probs, token masks,
features and grammar state, jump-forward, and the inputs of the next decode step.

Why apart from :mod:`agentrl.engines.local`: the engine's loop runs the model and keeps the
batch's tensors; what a row has said so far, when it is done, and which tokens its grammar forces
next (fed in one chunk, jump-forward) is bookkeeping on plain lists that needs no model.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from agentrl.engines.constrained import Generation, RowConstraint, TokenMask

if TYPE_CHECKING:
    from agentrl.engines.sampling import SamplingParams

__all__ = ["Replies", "allowed_ids", "chunk_inputs"]


class Replies:
    """One batch's replies as they are decoded: per row its tokens, log-probs, masks, features
    and grammar, and how many of its tokens the decoder's cache holds."""

    def __init__(self, samplings: list[SamplingParams], stops: list[set[int]],
                 constraints: list[RowConstraint | None], jump_forward: bool):
        self.ids: list[list[int]] = [[] for _ in samplings]
        self.logprobs: list[list[float]] = [[] for _ in samplings]
        self.token_masks = [[] if c is not None else None for c in constraints]
        self.features = [[] if s.return_features else None for s in samplings]
        self.limits = [s.max_new_tokens for s in samplings]
        self.stops, self.constraints, self.jump_forward = stops, constraints, jump_forward
        self.constrained = any(c is not None for c in constraints)
        self.cached = [0] * len(samplings)  # reply tokens whose keys and values are cached
        self.jumped = 0
        self.constraint_seconds = 0.0

    def masks(self, active: list[int]) -> list[TokenMask | None] | None:
        """Each active row's mask for its next token (None: no row is constrained)."""
        if not self.constrained:
            return None
        start = time.perf_counter()
        masks = [None if self.constraints[row] is None else
                 self.constraints[row].mask(self.limits[row] - len(self.ids[row]))
                 for row in active]
        self.constraint_seconds += time.perf_counter() - start
        return masks

    def add(self, row: int, token: int, logprob: float, mask: TokenMask | None,
            feature: torch.Tensor | None) -> list[int]:
        """Append the chosen token and, with jump-forward, the tokens the grammar forces after
        it (log-prob 0: probability 1 under their one-token mask): the tokens the next decode
        step feeds for this row."""
        self._append(row, token, logprob, mask, feature)
        constraint = self.constraints[row]
        if constraint is None:
            return [token]
        start = time.perf_counter()
        constraint.advance(token)
        chunk = [token]
        while self.jump_forward and not self.done(row):
            forced = constraint.mask(self.limits[row] - len(self.ids[row]))
            if not forced.allow or len(forced.ids) != 1:
                break
            token = forced.ids[0]
            if self.features[row] is not None and self._ends(row, token):
                break  # its feature is the hidden state after the chunk: a step reads it
            self._append(row, token, 0.0, forced, None)  # feature: after the next step
            constraint.advance(token)
            chunk.append(token)
            self.jumped += 1
        self.constraint_seconds += time.perf_counter() - start
        return chunk

    def stepped(self, active: list[int], chunks: list[list[int]],
                hidden: torch.Tensor | None) -> None:
        """After a decode step fed ``chunks``: their tokens are cached, and each jumped
        token's feature is the hidden state ``[rows, width, hidden]`` at the token before it."""
        width = max(map(len, chunks))
        for batch_row, (row, chunk) in enumerate(zip(active, chunks)):
            self.cached[row] += len(chunk)
            if hidden is not None and len(chunk) > 1 and self.features[row] is not None:
                states = hidden[batch_row, width - len(chunk):width - 1].float().cpu()
                self.features[row][1 - len(chunk):] = list(states)

    def done(self, row: int) -> bool:
        ids = self.ids[row]
        return bool(ids) and (ids[-1] in self.stops[row] or len(ids) >= self.limits[row])

    def cached_ids(self, row: int) -> list[int]:
        """The reply tokens the decoder's cache holds for ``row`` (all but those never fed)."""
        return self.ids[row][:self.cached[row]]

    def results(self) -> list[Generation]:
        return [Generation(ids, lps, masks, None if feats is None else torch.stack(feats))
                for ids, lps, masks, feats in zip(self.ids, self.logprobs, self.token_masks,
                                                  self.features)]

    def _append(self, row: int, token: int, logprob: float, mask: TokenMask | None,
                feature: torch.Tensor | None) -> None:
        self.ids[row].append(token)
        self.logprobs[row].append(logprob)
        if self.token_masks[row] is not None:
            self.token_masks[row].append(mask)
        if self.features[row] is not None:
            self.features[row].append(feature)

    def _ends(self, row: int, token: int) -> bool:
        return token in self.stops[row] or len(self.ids[row]) + 1 >= self.limits[row]


def allowed_ids(masks: list[TokenMask | None] | None) -> list[torch.Tensor | None] | None:
    """Per row, the only ids its next token may be (an allow mask's), else None."""
    if masks is None:
        return None
    return [mask.index if mask is not None and mask.allow else None for mask in masks]


def chunk_inputs(chunks: list[list[int]], positions: torch.Tensor, pad_id: int):
    """A decode step's inputs: the rows' chunks left-padded to the widest ``[rows, width]``,
    which of them are real (None when every chunk is one token), their positions (each row's
    continue from ``positions``) and each chunk's length."""
    device = positions.device
    lengths = torch.tensor([len(chunk) for chunk in chunks], device=device)
    width = max(map(len, chunks))
    if width == 1:
        return torch.tensor(chunks, device=device), None, positions[:, None], lengths
    ids = torch.full((len(chunks), width), pad_id, dtype=torch.long)
    for batch_row, chunk in enumerate(chunks):
        ids[batch_row, width - len(chunk):] = torch.tensor(chunk)
    offsets = torch.arange(width, device=device)[None, :] - (width - lengths)[:, None]
    return ids.to(device), offsets >= 0, positions[:, None] + offsets.clamp(min=0), lengths
