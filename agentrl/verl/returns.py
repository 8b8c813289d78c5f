"""What verl 0.9.1's PPO lacks for games, patched in: the value clip scaled to the returns.

The launch names this module in ``VERL_USE_EXTERNAL_MODULES`` (verl imports it in every process
it starts) and sets :data:`VALUE_CLIP_ENV` from ``critic.value_clip_scale``; the patches go
through :mod:`agentrl.verl.cpu_platform`'s pinned :class:`~agentrl.verl.cpu_platform.Patch`
(a verl upgrade that moves the code refuses at start-up).

**Value clip** (``critic.value_clip_scale: returns``, the default, as on the local engine).
verl clips the critic's update at ``critic.cliprange_value`` in return units: with Sokoban's
returns spanning -1.6..+11, a clip of 0.5 lets the critic move 0.5 a step and it needs ~20
steps to reach a win's value. The local engine multiplies the clip by the step's return scale,
max(1, RMS of the returns over model tokens) (``PPOUpdate._value_clip`` in
:mod:`agentrl.trainers.ppo_update`); so does this:
:func:`compute_advantage` (the legacy trainer's, patched on the TaskRunner by
:func:`patch_compute_advantage`) stores the step's scale in every row
(:data:`RETURN_SCALE`), and verl's ``value_loss`` (patched at import: the TaskRunner hands the
critic workers a partial of it) clips at ``cliprange_value * scale``, logged as
``critic/cliprange_value``. The V1 trainer selects only its own columns for GAE, so there the
scale is that of the micro-batch's returns.

**A cut episode ends where it is cut**, on both trainers as on the local engine: an episode the
response budget ended (``BudgetedAgent``: the next observation did not fit; flagged
:data:`TRUNCATED`) gets verl's GAE unchanged, a next value of 0 after its last model token. Its
return is what it earned, so the critic's target has a fixed point. Bootstrapping it with the
value at its last model token would count that token's reward twice: verl reads the value of
response token t at the position before t (``no_padding_2_padding``), so that value already
estimates r_T and what follows, and a target of r_T + V_T moves by r_T every time the critic
reaches it (at gamma = 1). The value a bootstrap needs is that of the state after the last
turn, which the row does not hold (its observation did not fit).

**Probe** (``agentrl doctor``): with :data:`PROBE_ENV` naming a folder, the legacy trainer's
``compute_advantage`` also appends, per step, the value, the reward and the return at the last
model token of every cut row to ``cut_episodes.jsonl`` there (:func:`cut_rows`; a cut row's
return there is its reward: nothing bootstrapped), and saves the first step's batch
(``batch.pkl``, verl's ``DataProto.save_to_disk``) for a log-prob check on it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path

import torch

__all__ = ["PROBE_ENV", "RETURN_SCALE", "TRUNCATED", "VALUE_CLIP_ENV", "cut_rows",
           "patch_compute_advantage", "return_scale"]

VALUE_CLIP_ENV = "AGENTRL_VALUE_CLIP_SCALE"
"""``returns`` (scale the value clip) or ``absolute`` (verl's), set by the launch."""
RETURN_SCALE = "agentrl_return_scale"
"""Batch column: the step's return scale, the same in every row."""
TRUNCATED = "agentrl_truncated"
"""``extra_fields`` key (a batch column): the response budget, not the game, ended the episode.
It tells which rows those are; GAE ends them like any other (the module docstring)."""
OWNER = "agentrl/verl/returns.py"
PROBE_ENV = "AGENTRL_PROBE_DIR"
"""A folder: the legacy trainer's GAE writes its probe there (the module docstring)."""
CUT_EPISODES_FILE = "cut_episodes.jsonl"
PROBE_BATCH_FILE = "batch.pkl"


def return_scale(returns: torch.Tensor, mask: torch.Tensor) -> float:
    """max(1, RMS of ``returns`` over ``mask``): the local engine's value-clip scale."""
    mask = mask.float()
    mean_square = ((returns.float() ** 2) * mask).sum() / mask.sum().clamp(min=1)
    return max(1.0, float(mean_square.sqrt()))


def _scales_clip() -> bool:
    return os.environ.get(VALUE_CLIP_ENV, "absolute") == "returns"


def cut_rows(data) -> list[dict[str, float]]:
    """Per cut row of a batch after GAE (verl's ``DataProto``): ``value``, ``reward`` and
    ``return`` at its last model token."""
    flags = data.non_tensor_batch.get(TRUNCATED)
    if flags is None:
        return []
    batch, rows = data.batch, []
    for index, cut in enumerate(flags):
        model_tokens = batch["response_mask"][index].nonzero()
        if not cut or len(model_tokens) == 0:
            continue
        last = int(model_tokens[-1])
        rows.append({key: float(batch[column][index, last]) for key, column in
                     (("value", "values"), ("reward", "token_level_rewards"),
                      ("return", "returns"))})
    return rows


def _write_probe(data, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / CUT_EPISODES_FILE
    step = data.meta_info.get("global_steps")
    if step is None:  # the calls count the steps
        step = 1 + (len(path.read_text().splitlines()) if path.exists() else 0)
    with path.open("a") as file:
        file.write(json.dumps({"step": int(step), "rows": cut_rows(data)}) + "\n")
    if not (folder / PROBE_BATCH_FILE).exists():
        data.save_to_disk(str(folder / PROBE_BATCH_FILE))


# -- the patched functions -------------------------------------------------------------------------
def _compute_advantage(original: Callable) -> Callable:
    def compute_advantage(data, adv_estimator, gamma=1.0, lam=1.0, num_repeat=1,
                          norm_adv_by_std_in_grpo=True, config=None):
        data = original(data, adv_estimator=adv_estimator, gamma=gamma, lam=lam,
                        num_repeat=num_repeat, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
                        config=config)
        is_gae = str(getattr(adv_estimator, "value", adv_estimator)) == "gae"
        if is_gae and _scales_clip():
            scale = return_scale(data.batch["returns"], data.batch["response_mask"])
            data.batch[RETURN_SCALE] = torch.full((len(data),), scale)
        if is_gae and os.environ.get(PROBE_ENV):
            _write_probe(data, Path(os.environ[PROBE_ENV]))
        return data
    return compute_advantage


def _scaled_value_loss(original: Callable) -> Callable:
    def value_loss(config, model_output, data, dp_group=None):
        if not _scales_clip():
            return original(config, model_output, data, dp_group=dp_group)
        if RETURN_SCALE in data.keys():
            scale = float(data[RETURN_SCALE].flatten()[0])
        else:  # V1: the micro-batch's returns
            padded = data.select("returns", "response_mask").to_padded_tensor()
            scale = return_scale(padded["returns"], padded["response_mask"])
        clip = config.cliprange_value * scale
        loss, metrics = original(dataclasses.replace(config, cliprange_value=clip), model_output,
                                 data, dp_group=dp_group)
        metrics["critic/cliprange_value"] = clip
        return loss, metrics
    return value_loss


def _patches() -> tuple:
    from agentrl.verl.cpu_platform import Patch

    return (
        Patch("verl.workers.utils.losses", "value_loss",
              "(config: verl.workers.config.critic.CriticConfig, model_output, data: "
              "tensordict._td.TensorDict, dp_group=None)",
              "cliprange_value=config.cliprange_value", _scaled_value_loss, owner=OWNER),
        Patch("verl.trainer.ppo.ray_trainer", "compute_advantage",
              "(data: verl.protocol.DataProto, adv_estimator: "
              "verl.trainer.ppo.core_algos.AdvantageEstimator, gamma: float = 1.0, lam: float = "
              "1.0, num_repeat: int = 1, norm_adv_by_std_in_grpo: bool = True, config: "
              "Optional[verl.trainer.config.algorithm.AlgoConfig] = None) -> verl.protocol."
              "DataProto", 'token_level_rewards=data.batch["token_level_rewards"]', _compute_advantage,
              owner=OWNER),
    )


def patch_value_loss() -> None:
    """verl's ``value_loss`` with the clip scaled (see the module docstring)."""
    import verl

    from agentrl.verl.cpu_platform import apply_patches

    apply_patches(verl.__version__, names=("value_loss",), patches=_patches())


def patch_compute_advantage() -> None:
    """The legacy trainer's ``compute_advantage`` with the step's return scale stored; called in
    the TaskRunner (by ``GameAgentLoopManager``), where the trainer runs it."""
    import verl

    from agentrl.verl.cpu_platform import apply_patches

    apply_patches(verl.__version__, names=("compute_advantage",), patches=_patches())


if os.environ.get("VERL_USE_EXTERNAL_MODULES") and __name__ in os.environ[
        "VERL_USE_EXTERNAL_MODULES"].split(","):
    patch_value_loss()
