"""PPO's AdamW started from the warm start's moments (``actor.warm_optimizer``).

    moments = saved_moments(config.model.name)       # an `agentrl sft` checkpoint's optimizer.pt
    carry_moments(moments, ppo_optimizer)            # or warm_start.optim.state_dict() in a run

Why: a fresh AdamW's first update is ``lr * sign(gradient)`` for every weight (its second
moment is the square of that one gradient), however few tokens stand behind the gradient, so
the first PPO steps after a warm start move all weights by about ``lr`` whatever the signal.
Carried moments scale each weight's PPO step by the warm start's gradient history instead, and
the first moment keeps pulling toward the imitation target for a few steps. The learning rate,
weight decay and betas stay PPO's own (``actor.*``); only the per-weight state is carried.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

__all__ = ["OPTIMIZER_TENSORS", "carry_moments", "saved_moments"]

OPTIMIZER_TENSORS = "optimizer"
"""The checkpoint entry (``optimizer.pt``) ``agentrl sft`` writes with ``sft.save_optimizer``."""


def carry_moments(source: Mapping[str, Any], optimizer: torch.optim.Optimizer) -> None:
    """Load the per-parameter state of ``source`` (an optimizer ``state_dict()`` over the same
    parameters in the same order) into ``optimizer``, keeping ``optimizer``'s hyperparameters.
    ``ValueError`` when the parameters differ in number or shape."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = source["state"]
    if sorted(state) != list(range(len(params))):
        raise ValueError(f"the warm start's optimizer holds moments of {len(state)} parameters, "
                         f"PPO's actor has {len(params)}: actor.warm_optimizer needs the same "
                         "model with the same trainable parameters (no LoRA)")
    for index, param in enumerate(params):
        for key in ("exp_avg", "exp_avg_sq"):
            if state[index][key].shape != param.shape:
                raise ValueError(f"the warm start's {key} of parameter {index} has shape "
                                 f"{tuple(state[index][key].shape)}, PPO's actor "
                                 f"{tuple(param.shape)}: actor.warm_optimizer needs the same "
                                 "model")
    optimizer.load_state_dict({"state": state,
                               "param_groups": optimizer.state_dict()["param_groups"]})


def saved_moments(model_name: str | Path) -> Mapping[str, Any]:
    """The optimizer state saved beside the model ``model_name`` points to (an ``agentrl sft``
    checkpoint, or its run folder); ``ValueError`` naming the fix when there is none."""
    from agentrl.trainers.checkpoint import model_folder

    try:
        checkpoint = model_folder(model_name).parent
    except ValueError as error:
        raise ValueError(f"actor.warm_optimizer=true needs model.name to be an `agentrl sft` "
                         f"checkpoint saved with sft.save_optimizer=true: {error}") from None
    path = checkpoint / f"{OPTIMIZER_TENSORS}.pt"
    if not path.is_file():
        raise ValueError(f"actor.warm_optimizer=true: {checkpoint} holds no {path.name}; allowed: "
                         "a checkpoint of `agentrl sft sft.save_optimizer=true`, or "
                         "train.sft_steps > 0 (the run's own warm start)")
    return torch.load(path, map_location="cpu", weights_only=True)
