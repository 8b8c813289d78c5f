"""The networks PPO trains: response log-probs of the actor, and a critic that is a value head.

    logprobs, entropy, _ = response_logprobs(actor, batch, temperature=1.0, with_entropy=True)
    critic = ValueModel.from_actor(actor, share_backbone=False)
    values = critic(batch)                                   # (B, R)
    # a critic on the actor's own backbone reads the features of the actor's forward pass:
    _, _, features = response_logprobs(actor, batch, with_features=True)
    values = shared_critic.values_from(features)

Positions follow verl's layout (:func:`agentrl.rollout.to_batch`): ``input_ids = prompts |
responses`` with ``P`` prompt and ``R`` response columns. Response token ``i`` is predicted from
position ``P - 1 + i``, so its log-prob and its value both come from that position (the state
*before* the token), as in verl's actor and critic.

Constrained decoding: when the batch has ``constraint_kind`` / ``constraint_ids``
(:func:`agentrl.rollout.to_batch`), each constrained position's logits are masked to the tokens
the sampler could choose from before the softmax, so the log-probs (and the entropy) are those
of the masked, renormalized distribution the sampler drew from (docs/TRAINING.md,
"Constrained action decoding").

Only the last ``R + 1`` positions go through the LM head (``logits_to_keep``): the prompt's
logits are never materialised, which is most of the memory of a long multi-turn episode. With
``head_mask`` (the trainer passes ``response_mask``) only the masked positions do: in a
multi-turn row most response tokens are observations, whose vocabulary-wide logits the losses
never read (on the default CPU preset 13 of a turn row's ~150 response tokens are the model's).

Shared prefix: with ``shared_prefix_tokens > 0`` the leading tokens all rows have in common (a
group's first prompt) run once and every row reads their keys and values
(:mod:`agentrl.trainers.shared_prefix`); the results are the same.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Iterator

import torch
from torch import nn

from agentrl.models.parts import backbone_of, plain_head
from agentrl.trainers.shared_prefix import SharedPrefix, shared_prefix_inputs

__all__ = ["FeatureStandardizer", "ValueModel", "backbone_of", "checkpointing", "choice_mask",
           "masked_logits", "response_logprobs", "value_head"]


def _model_inputs(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {key: batch[key].to(device) for key in ("input_ids", "attention_mask", "position_ids")}


def response_logprobs(
    model: Any,
    batch: dict[str, torch.Tensor],
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    with_features: bool = False,
    shared_prefix_tokens: int = 0,
    prefix: SharedPrefix | None = None,
    head_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Log-prob of each response token under ``model``, ``(B, R)``; its entropy (``B, R``) and
    the last hidden state before each token (``B, R, H``: a shared critic's input) on request.

    Differentiable: call under ``torch.no_grad()`` for old/reference log-probs. Logits are
    divided by ``temperature`` (the sampler's), so the ratio compares like with like. The
    log-prob is ``logit - logsumexp(logits)``, which keeps no ``(B, R, vocab)`` tensor for the
    backward pass beyond the logits themselves; the entropy is a metric (no gradient) unless
    ``entropy_grad`` (an entropy bonus in the loss). Rows sharing at least
    ``shared_prefix_tokens`` leading tokens run them once (0 = off; the module docstring), or
    read ``prefix``, the prefix of their run of micro-batches
    (:func:`agentrl.trainers.shared_prefix.plan_prefix_runs`). ``head_mask`` ``(B, R)``: the LM
    head runs only where it is 1; log-probs and entropy are 0 elsewhere (module docstring).
    """
    from verl.utils.torch_functional import entropy_from_logits

    device = next(model.parameters()).device
    responses = batch["responses"].to(device)
    length = responses.shape[1]
    backbone = backbone_of(model)
    # (rows, columns) of the positions whose log-probs are kept; None = every response one
    where = None if head_mask is None else head_mask.to(device).bool().nonzero(as_tuple=True)
    if where is not None and plain_head(model):  # the head runs at those positions only
        inputs = shared_prefix_inputs(backbone, backbone, _model_inputs(batch, device),
                                      response_length=length, min_tokens=shared_prefix_tokens,
                                      prefix=prefix)
        hidden = backbone(**inputs).last_hidden_state[:, -length - 1:-1]
        logits = model.get_output_embeddings()(hidden[where]).float()
        features = hidden if with_features else None
    else:
        inputs = shared_prefix_inputs(model, backbone, _model_inputs(batch, device),
                                      response_length=length, min_tokens=shared_prefix_tokens,
                                      prefix=prefix)
        out = model(**inputs, logits_to_keep=length + 1, output_hidden_states=with_features)
        logits = out.logits[:, :-1].float()
        features = out.hidden_states[-1][:, -length - 1:-1] if with_features else None
        if where is not None:  # a head that is more than its output embedding ran full width
            logits = logits[where]
    picked = (lambda t: t) if where is None else (lambda t: t[where])  # noqa: E731
    if temperature != 1.0:
        logits = logits / temperature
    if "constraint_kind" in batch:
        logits = masked_logits(logits, picked(batch["constraint_kind"].to(device)),
                               picked(batch["constraint_ids"].to(device)))
    chosen = logits.gather(-1, picked(responses).unsqueeze(-1)).squeeze(-1)
    logprobs = chosen - torch.logsumexp(logits, dim=-1)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = entropy_from_logits(logits if entropy_grad else logits.detach())
    if where is not None:  # back to (B, R), zeros where the head did not run
        logprobs = responses.new_zeros(responses.shape, dtype=logprobs.dtype).index_put(
            where, logprobs)
        if entropy is not None:
            entropy = responses.new_zeros(responses.shape, dtype=entropy.dtype).index_put(
                where, entropy)
    return logprobs, entropy, features


@contextlib.contextmanager
def checkpointing(model: nn.Module) -> Iterator[None]:
    """Gradient checkpointing for the forward passes inside, when the model has it enabled
    (``gradient_checkpointing_enable()``), with the model still in ``eval()`` mode.

    transformers checkpoints a decoder layer only while that layer is in training mode, and the
    trainer keeps its models in ``eval()`` so that no dropout makes the recomputed log-probs
    differ from the sampled ones. This flips the ``training`` flag of the checkpointing layers
    alone: their submodules (attention, dropout, LoRA dropout) stay in eval mode, so the forward
    computes exactly what it computes without checkpointing, and the backward recomputes each
    layer's activations instead of keeping them.
    """
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules()
              if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]
    modes = [m.training for m in layers]
    for layer in layers:
        layer.training = True
    try:
        yield
    finally:
        for layer, mode in zip(layers, modes):
            layer.training = mode


def masked_logits(logits: torch.Tensor, kind: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``logits`` ``(B, R, V)`` with the tokens a constrained position could not choose at the
    dtype's lowest value (not -inf: the entropy's ``p * logit`` stays 0, not NaN). ``kind``
    ``(B, R)``: 1 = only ``ids`` ``(B, R, K)`` allowed, 0 = all but them, -1 = free."""
    vocab = logits.shape[-1]
    listed = torch.zeros(*logits.shape[:-1], vocab + 1, dtype=torch.bool, device=logits.device)
    listed.scatter_(-1, torch.where(ids < 0, vocab, ids), True)  # -1 padding -> the spare column
    listed = listed[..., :vocab]
    allowed = torch.where((kind == 1)[..., None], listed, ~listed) | (kind < 0)[..., None]
    return logits.masked_fill(~allowed, torch.finfo(logits.dtype).min)


def choice_mask(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """``response_mask`` (float) without the model tokens the constraint forced (one allowed id):
    their log-prob is 0 under every policy and their entropy 0, so they carry no choice. The
    actor's means (policy loss, entropy, KL) run over this mask; the tokens stay in the context
    and in the critic's and the advantages' masks."""
    mask = batch["response_mask"].float()
    if "constraint_kind" not in batch:
        return mask
    allowed = (batch["constraint_ids"] >= 0).sum(-1)
    forced = (batch["constraint_kind"] == 1) & (allowed == 1)
    return mask.masked_fill(forced.to(mask.device), 0.0)


class FeatureStandardizer(nn.Module):
    """Each feature minus its running mean, over its running standard deviation (buffers).

    A transformer's last hidden states share one huge direction (on the embedded model 99.9% of
    their energy: norm 48.5 against 1.42 for the rest, pairwise cosine 0.999), so a head on the
    raw features sees a gradient that is almost all that direction, and the clip cuts the rest
    to nothing. Standardised per feature, the same states read the game's state (a ridge probe
    finds the oracle's distance at R² 0.6-0.7). The statistics are those of every model token
    :meth:`observe` saw (Chan's merge of batch moments), the count capped at ``max_count`` so
    that they follow features that drift (a critic's own backbone trains)."""

    def __init__(self, size: int, *, max_count: float = 65536.0, eps: float = 1e-5):
        super().__init__()
        self.max_count, self.eps = max_count, eps
        self.register_buffer("mean", torch.zeros(size))
        self.register_buffer("var", torch.ones(size))
        self.register_buffer("count", torch.zeros(()))

    @torch.no_grad()
    def observe(self, features: torch.Tensor) -> None:
        """Merge the moments of ``features`` ``(N, H)`` into the running ones."""
        x = features.detach().reshape(-1, features.shape[-1]).to(self.mean.dtype)
        n = x.shape[0]
        if n == 0:
            return
        mean, var = x.mean(0), x.var(0, unbiased=False)
        total = self.count + n
        delta = mean - self.mean
        merged = (self.var * self.count + var * n + delta ** 2 * self.count * n / total) / total
        self.mean.add_(delta * n / total)
        self.var.copy_(merged)
        self.count.copy_(total.clamp(max=self.max_count))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if not bool(self.count > 0):  # nothing seen yet: the features as they are
            return features
        return (features - self.mean) / torch.sqrt(self.var + self.eps)


def value_head(hidden_size: int, *, hidden: int = 0, standardize: bool = False) -> nn.Module:
    """The critic's head on last hidden states ``(..., H)`` -> ``(..., 1)``: a linear layer, or
    with ``hidden > 0`` an MLP of one ``hidden``-wide tanh layer; ``standardize`` puts a
    :class:`FeatureStandardizer` first. The output layer starts at zero (values 0, so the first
    advantages are the returns). Without either, the bare ``nn.Linear`` (the head's parameters
    keep their names, ``head.weight``, in checkpoints written before the others existed)."""
    layers: list[nn.Module] = [FeatureStandardizer(hidden_size)] if standardize else []
    if hidden:
        layers += [nn.Linear(hidden_size, hidden), nn.Tanh()]
    out = nn.Linear(hidden or hidden_size, 1)
    nn.init.zeros_(out.weight)
    nn.init.zeros_(out.bias)
    return nn.Sequential(*layers, out) if layers else out


class ValueModel(nn.Module):
    """A scalar value per response token: a head on a transformer's last hidden state
    (:func:`value_head`: linear or a small MLP, on raw or standardised features).

    ``share_backbone=True`` reads the actor's own backbone, detached: only the head trains, and no
    second copy of the model is held (the choice for tight memory). Otherwise the critic owns a
    copy of the actor's backbone and trains all of it (verl's critic, initialised from the actor),
    or, when the actor has LoRA adapters, only the copy's own adapters.
    The head's output starts at zero, so initial values are 0 and the first advantages are the
    returns.
    """

    def __init__(self, backbone: nn.Module, hidden_size: int, *, shared: bool,
                 head_hidden: int = 0, standardize: bool = False):
        super().__init__()
        self.shared = shared
        if shared:  # not a submodule: its weights belong to the actor (and its checkpoint)
            self.__dict__["backbone"] = backbone
        else:
            self.backbone = backbone
        self.head = value_head(hidden_size, hidden=head_hidden, standardize=standardize)

    @classmethod
    def from_actor(cls, actor: Any, *, share_backbone: bool, head_hidden: int = 0,
                   standardize: bool = False) -> ValueModel:
        backbone = backbone_of(actor)
        if not share_backbone:
            backbone = copy.deepcopy(backbone)
            adapters = [p for name, p in backbone.named_parameters() if "lora_" in name]
            backbone.requires_grad_(not adapters)  # a LoRA actor's critic trains its own adapters
            for param in adapters:
                param.requires_grad_(True)
        hidden = actor.config.hidden_size
        param = next(backbone.parameters())
        return cls(backbone, hidden, shared=share_backbone, head_hidden=head_hidden,
                   standardize=standardize).to(param.device)

    @torch.no_grad()
    def start_from(self, actor: Any) -> None:
        """A critic with its own copy of the backbone copies ``actor``'s current one, in place
        (its optimizer stays valid): after a warm start, it starts from the warm-started
        weights, as verl's critic starts from the actor's. A shared backbone already is."""
        if not self.shared:
            self.backbone.load_state_dict(backbone_of(actor).state_dict())

    @property
    def _out(self) -> nn.Linear:
        """The head's output layer."""
        return self.head[-1] if isinstance(self.head, nn.Sequential) else self.head

    @torch.no_grad()
    def observe(self, features: torch.Tensor, mask: torch.Tensor) -> None:
        """Add the features ``(B, R, H)`` of the model tokens ``mask`` ``(B, R)`` marks to the
        head's running statistics (a no-op without standardisation)."""
        norm = self.head[0] if isinstance(self.head, nn.Sequential) else None
        if isinstance(norm, FeatureStandardizer):
            norm.observe(features[mask.to(features.device).bool()].float())

    def values_from(self, features: torch.Tensor) -> torch.Tensor:
        """Values from last hidden states ``(B, R, H)`` already computed (by the actor's pass).
        The head runs in float32 even under autocast: a bf16 value of 10 is only good to 0.06."""
        with torch.autocast(device_type=features.device.type, enabled=False):
            return self.head(features.to(self._out.weight.dtype)).squeeze(-1).float()

    def features(self, batch: dict[str, torch.Tensor], *, shared_prefix_tokens: int = 0,
                 prefix: SharedPrefix | None = None) -> torch.Tensor:
        """The backbone's last hidden states before each response token, ``(B, R, H)``."""
        device = self._out.weight.device
        length = batch["responses"].shape[1]
        with torch.no_grad() if self.shared else contextlib.nullcontext():
            inputs = shared_prefix_inputs(self.backbone, self.backbone,
                                          _model_inputs(batch, device), response_length=length,
                                          min_tokens=shared_prefix_tokens, prefix=prefix)
            hidden = self.backbone(**inputs).last_hidden_state
        return hidden[:, -length - 1:-1]

    def forward(self, batch: dict[str, torch.Tensor], *, shared_prefix_tokens: int = 0,
                prefix: SharedPrefix | None = None) -> torch.Tensor:
        """Values ``(B, R)`` of ``batch``'s response positions; rows sharing at least
        ``shared_prefix_tokens`` leading tokens run them once (0 = off), or read ``prefix``."""
        return self.values_from(self.features(batch, shared_prefix_tokens=shared_prefix_tokens,
                                              prefix=prefix))

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]
