"""The frozen policy a KL term pulls the actor toward: the policy PPO starts from.

    reference = Reference(actor)             # the loaded model
    reference.reset_to(actor)                # at the end of an in-run warm start
    with reference(actor) as ref:            # a model to score with (no gradients)
        ref_logprobs = response_logprobs(ref, batch)[0]
    state = reference.state_dict()           # None while it is the loaded model

PPO's KL anchor must be the policy PPO starts from. Without a warm start that is the loaded
model; with ``train.sft_steps`` it is the warm-started one (an anchor on the untrained model
would pull PPO back toward what the warm start taught it to leave), so the trainer calls
:meth:`Reference.reset_to` after the last warm-start step.

Full fine-tuning keeps a frozen copy of the actor. A LoRA actor keeps no second model: until
the reset the reference is the base model (the adapter switched off); after it, the adapter
weights of the reset are swapped into the actor for the reference's passes and swapped back.

A checkpoint stores :meth:`Reference.state_dict` when it is not None (the copy's weights, or the
adapter's), so a run resumed after the warm start scores against the same reference; one
resumed before it resets at the warm start's end like an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Iterator

import torch

__all__ = ["Reference", "needs_reference"]


def needs_reference(config: Any) -> bool:
    """Whether a KL term (in the reward or in the loss) needs the frozen reference policy."""
    return config.algorithm.use_kl_in_reward or config.actor.use_kl_loss


class Reference:
    """The KL reference of ``actor`` (module docstring)."""

    def __init__(self, actor: Any):
        self.lora = hasattr(actor, "peft_config")
        self.model = None if self.lora else copy.deepcopy(actor).requires_grad_(False).eval()
        self.adapter_names = set(_adapter_params(actor)) if self.lora else set()
        self.adapter: dict[str, torch.Tensor] | None = None
        """LoRA: the adapter weights of the reference; None: the base model (adapter off)."""
        self.reset = False
        """Whether the reference was reset away from the loaded model."""

    @contextlib.contextmanager
    def __call__(self, actor: Any) -> Iterator[Any]:
        """A model computing the reference's outputs (use it without gradients)."""
        if self.model is not None:
            yield self.model
        elif self.adapter is None:
            with actor.disable_adapter():
                yield actor
        else:
            params = _adapter_params(actor)
            own = {name: p.detach().clone() for name, p in params.items()}
            _copy_into(params, self.adapter)
            try:
                yield actor
            finally:
                _copy_into(params, own)

    @torch.no_grad()
    def reset_to(self, actor: Any) -> None:
        """The reference becomes ``actor``'s current weights (copied: later updates leave it)."""
        if self.model is not None:
            self.model.load_state_dict(actor.state_dict())
        else:
            self.adapter = {name: p.detach().clone()
                            for name, p in _adapter_params(actor).items()}
        self.reset = True

    def state_dict(self) -> dict[str, torch.Tensor] | None:
        """What a checkpoint must store to restore this reference; None while it is the loaded
        model (rebuilt from ``model.name``)."""
        if not self.reset:
            return None
        return self.model.state_dict() if self.model is not None else dict(self.adapter)

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore a reference saved by :meth:`state_dict`."""
        if self.model is not None:
            self.model.load_state_dict(state)
        else:
            if differ := set(state) ^ self.adapter_names:
                raise ValueError(f"the saved reference's adapter does not match the actor's: "
                                 f"{sorted(differ)[:5]}")
            self.adapter = {name: tensor.clone() for name, tensor in state.items()}
        self.reset = True


def _adapter_params(actor: Any) -> dict[str, torch.nn.Parameter]:
    """A LoRA actor's trainable parameters by name: its adapter (what training changes)."""
    return {name: p for name, p in actor.named_parameters() if p.requires_grad}


@torch.no_grad()
def _copy_into(params: dict[str, torch.nn.Parameter], weights: dict[str, torch.Tensor]) -> None:
    for name, param in params.items():
        param.copy_(weights[name])
