"""Compose ``configs/base.yaml`` with hydra and validate it: how a run gets its config.

    >>> from agentrl.config import compose_config
    >>> config = compose_config(["model=tiny", "train.total_steps=2", "actor.lr=3e-6"])
    >>> config.model.name, config.train.total_steps, config.hardware.name
    ('tiny', 2, 'cpu')

``agentrl train key=value ...`` hands its arguments here unchanged, so the command line speaks
hydra's override grammar: ``group=option`` picks a preset (``hardware=cpu``, ``model=tiny``),
``a.b=value`` sets a key, ``+a.b=value`` adds one (and then fails validation, naming the key).
``agents.<preset>.<key>=value`` sets a preset's key even where the preset takes it from
``preset_defaults`` (it is passed to hydra as ``++agents...``, add-or-override); the agent layer
then rejects an unknown key or preset with its own message. ``model=<path>`` with an existing
path that names no preset (a model folder, a checkpoint, a PPO or ``agentrl sft`` run folder)
becomes ``model.name=<its model folder>``, verified
(:func:`agentrl.trainers.checkpoint.model_folder`): the hand-off ``agentrl sft`` prints.

The config folder is ``config_dir`` when given, else ``$AGENTRL_CONFIGS`` when set, else the
checkout's ``configs/`` (found from the package, which works for the editable install; a wheel
has no ``configs/`` and needs one of the other two).

Every failure is a ``ValueError`` naming the key or the preset and what is allowed: hydra's own
message, plus the options of a config group or the keys of a section.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, get_type_hints

import agentrl
from agentrl.config.fields import Section
from agentrl.config.schema import TrainConfig, build_config

__all__ = ["CONFIGS_ENV", "CONFIG_NAME", "compose_config", "default_config_dir", "group_options"]

CONFIG_NAME = "base"
CONFIGS_ENV = "AGENTRL_CONFIGS"


def default_config_dir() -> Path:
    """``$AGENTRL_CONFIGS`` when set, else ``<checkout>/configs``."""
    if os.environ.get(CONFIGS_ENV):
        return Path(os.environ[CONFIGS_ENV])
    return Path(agentrl.__file__).resolve().parents[1] / "configs"


def compose_config(overrides: Sequence[str] = (), config_dir: str | Path | None = None
                   ) -> TrainConfig:
    """``base.yaml`` + its presets + ``overrides`` (hydra syntax), validated."""
    folder = Path(config_dir if config_dir is not None else default_config_dir()).resolve()
    if not (folder / f"{CONFIG_NAME}.yaml").is_file():
        raise ValueError(f"no {CONFIG_NAME}.yaml in the config folder {folder}; pass config_dir "
                         f"or set {CONFIGS_ENV} to a folder holding the project's configs/")
    given = [overrides] if isinstance(overrides, str) else list(overrides)
    given = [_model_path(override, folder) for override in given]
    data = _compose([_agents_add_or_override(override) for override in given], folder)
    if data.get("agents_file") is not None:
        _use_agents_file(data, given)
    config = build_config(data)
    if config.run_dir.exists() and not config.run_dir.is_dir():
        raise ValueError(f"run_dir={str(config.run_dir)!r} is a file; allowed: a folder (made "
                         "if missing), or null for runs/<project>/<experiment>")
    return config


def group_options(folder: Path, group: str) -> list[str]:
    """The presets of a config group: the YAML files in ``<folder>/<group>/``."""
    return sorted(path.stem for path in (folder / group).glob("*.yaml"))


def _compose(overrides: list[str], folder: Path) -> dict[str, Any]:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    GlobalHydra.instance().clear()  # left initialized by an earlier caller: start afresh
    try:
        with initialize_config_dir(version_base=None, config_dir=str(folder)):
            composed = compose(CONFIG_NAME, overrides=overrides)
        return OmegaConf.to_container(composed, resolve=True)
    except (HydraException, OmegaConfBaseException) as error:
        message = str(error).split("\nConfig search path:")[0].strip()  # hydra's, less noise
        hints = [hint for override in overrides if (hint := _override_hint(override, folder))]
        # one line: what is allowed where we know it, else hydra's own words
        raise ValueError(f"bad config override: {'; '.join(hints) or ' '.join(message.split())}"
                         ) from None


def _model_path(override: str, folder: Path) -> str:
    """``model=<existing path>`` -> ``model.name=<its model folder>``; a path-like value that
    does not exist fails here, naming both what it is not and what is allowed."""
    if _override_key(override) != "model" or override[:1] in "+~" or "=" not in override:
        return override
    value = override.split("=", 1)[1].strip()
    if value in group_options(folder, "model"):
        return override
    path = Path(value).expanduser()
    if not path.exists() and "/" not in value and not value.startswith((".", "~")):
        return override  # a mistyped preset: hydra's message lists the presets
    # config's floor is above trainers' (tests/test_layers.py): model_folder stays with the
    # checkpoint layout it reads (markers, the newest intact checkpoint) in trainers.checkpoint.
    from agentrl.trainers.checkpoint import model_folder

    try:
        return f"model.name={model_folder(path.resolve())}"
    except ValueError as error:
        raise ValueError(f"model={value!r} is neither a model preset "
                         f"{group_options(folder, 'model')} nor a usable path: {error}") from None


def _agents_add_or_override(override: str) -> str:
    """``agents.X.max_turns=3`` -> ``++agents.X.max_turns=3``: most preset keys live only in
    ``preset_defaults``, and hydra's plain override refuses keys the node does not have."""
    if override[:1] not in "+~" and _override_key(override).startswith("agents."):
        return f"++{override}"
    return override


def _use_agents_file(data: dict[str, Any], overrides: list[str]) -> None:
    """Drop the composed ``agents`` section so the presets are read from ``agents_file``."""
    edits = [o for o in overrides if _override_key(o).split(".")[0] == "agents"]
    if edits:
        raise ValueError(f"overrides {edits} change configs/agents.yaml, but agents_file="
                         f"{data['agents_file']!r} replaces it; allowed: edit that file, or "
                         "drop agents_file")
    path = Path(data["agents_file"]).expanduser()
    if path.is_file():
        import yaml

        try:
            yaml.safe_load(path.read_text())
        except (yaml.YAMLError, UnicodeDecodeError) as error:
            where = getattr(error, "problem_mark", None)
            at = f" at line {where.line + 1}" if where is not None else ""
            raise ValueError(f"agents_file={str(path)!r} is not valid YAML{at} "
                             f"({getattr(error, 'problem', None) or error}); allowed: an agent "
                             "presets file like configs/agents.yaml") from None
    data["agents"] = None


def _override_key(override: str) -> str:
    """``"+train.x=3"`` -> ``"train.x"``; ``"hardware@pkg=cpu"`` -> ``"hardware"``."""
    key = override.split("=", 1)[0].lstrip("~+").strip()
    return key.split("@", 1)[0]


def _override_hint(override: str, folder: Path) -> str | None:
    """What is allowed where ``override`` points: a group's presets or a section's keys."""
    key = _override_key(override)
    if (folder / key).is_dir():
        value = override.split("=", 1)[1].strip() if "=" in override else ""
        options = group_options(folder, key)
        if value not in options:
            return f"{key}={value!r} is not allowed; allowed {key} presets: {options}"
        return None
    return _key_hint(key)


def _key_hint(key: str) -> str | None:
    """``"unknown key 'train.grop_num'; allowed: [...]"`` when no such key exists."""
    section: type[Section] = TrainConfig
    parts = key.split(".")
    for depth, part in enumerate(parts):
        if section is TrainConfig and part == "agents":
            return None  # presets are checked by the agent layer, with its own messages
        names = [spec.name for spec in dataclasses.fields(section)]
        if part not in names:
            return f"unknown key '{'.'.join(parts[:depth + 1])}'; allowed: {names}"
        hint = get_type_hints(section)[part]
        if not (isinstance(hint, type) and issubclass(hint, Section)):
            return None
        section = hint
    return None
