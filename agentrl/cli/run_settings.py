"""The settings a training run played its held-out games with, read back from the resolved
config its checkpoint stores, so that `agentrl eval --model <run>` and `agentrl play --model
<run>` play as the run's validation did.

    settings = run_settings("runs/agentrl/quick")   # None: not a run or checkpoint
    settings.decoding.describe(), settings.val_presets, settings.groups

The checkpoint is the one ``--model`` loads (:func:`agentrl.trainers.checkpoint.model_folder`:
a checkpoint folder, its ``actor/``, or a run folder's best checkpoint, else its newest intact
one; for a verl run, its actor's Hugging Face folder, the config in the run folder); its
``config.yaml`` gives the agent presets as the run had them (history windows, prompts), the
validation presets, games and group size, the decoding (:func:`agentrl.evaluation.decoding.
run_decoding`) and the engine's batch and prefix-cache sizes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agentrl.evaluation.decoding import Decoding, run_decoding

__all__ = ["RunSettings", "played_presets", "run_settings"]



@dataclass(frozen=True)
class RunSettings:
    """What a run's validation played with."""

    config_file: Path
    decoding: Decoding
    agents: dict[str, Any]
    """Agent presets by name, as the run resolved them (``AgentConfig``)."""
    val_presets: list[str]
    groups: int
    group_size: int
    max_batch: int | None
    prefix_cache_tokens: int | None


def run_settings(model: str) -> RunSettings | None:
    """The settings of the run or checkpoint ``model`` names; None for anything else (a model
    folder, a built-in model, a hub id, a path that loads nothing: loading says why)."""
    from agentrl.trainers.checkpoint import model_folder

    path = Path(model).expanduser()
    if not path.exists():
        return None
    try:
        folder = model_folder(path)
    except ValueError:
        return None
    config_file = _config_file(folder)
    if config_file is None:
        return None
    config = yaml.safe_load(config_file.read_text()) or {}
    if not isinstance(config, Mapping):
        return None
    val = config.get("val") or {}
    rollout = config.get("rollout") or {}
    return RunSettings(
        config_file=config_file,
        decoding=run_decoding(config, source=f"the run's config {config_file}"),
        agents=_agents(config),
        val_presets=list(val.get("presets") or []),
        groups=int(val.get("group_num") or 4),
        group_size=int(val.get("group_size") or 1),
        max_batch=rollout.get("max_batch"),
        prefix_cache_tokens=rollout.get("prefix_cache_tokens"))


def _config_file(model: Path) -> Path | None:
    """The resolved config of the run that saved ``model``: a local checkpoint's ``actor/``
    has it beside it, a verl checkpoint's actor model in its run folder."""
    from agentrl.trainers.checkpoint import CONFIG_FILE
    from agentrl.trainers.verl_checkpoints import verl_run_of

    run = verl_run_of(model)
    config_file = (run if run is not None else model.parent) / CONFIG_FILE
    if (run is None and model.name != "actor") or not config_file.is_file():
        return None
    return config_file


def _agents(config: Mapping[str, Any]) -> dict[str, Any]:
    """Every preset of this checkout's agents file, with the run's own versions over them."""
    from agentrl.agents import load_agent_presets
    from agentrl.agents.config import agent_presets_from_dict

    presets = dict(load_agent_presets())
    if isinstance(config.get("agents"), Mapping):
        presets.update(agent_presets_from_dict(config["agents"], source="the run's agents",
                                               check_envs=False))
    return presets


def played_presets(presets: Mapping[str, Any], max_new_tokens: int | None) -> dict[str, Any]:
    """The presets as a run plays them: the reply limit folded into ``max_response_tokens``, so
    the limit the prompt states is the one that cuts replies (``TrainConfig.playing_presets``)."""
    if not max_new_tokens:
        return dict(presets)
    return {name: dataclasses.replace(config, max_response_tokens=min(
        config.max_response_tokens, max_new_tokens)) for name, config in presets.items()}
