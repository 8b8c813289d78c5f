"""Config sections that check themselves: typed fields, ranges, and building from a mapping.

    @dataclasses.dataclass(frozen=True)
    class LoraConfig(Section):
        KEY: ClassVar[str] = "lora"
        rank: int = setting(0, at_least(0), "an integer >= 0")

    build_section(LoraConfig, {"rank": 8}, "lora")     # a LoraConfig with rank 8
    build_section(LoraConfig, {"rnk": 8}, "lora")      # ValueError: unknown key 'lora.rnk'; ...

A :class:`Section` coerces and checks every field in ``__post_init__`` (types from the
annotations, ranges from :func:`setting`), so a bad value fails at construction naming its key
and what is allowed. The sections themselves, and the rules that span them, are in
:mod:`agentrl.config.schema`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from types import UnionType
from typing import Any, ClassVar, Literal, Union, get_args, get_origin, get_type_hints

from agentrl.agents.config import AgentConfig

__all__ = ["Section", "at_least", "build_section", "non_empty", "positive", "setting",
           "unit_interval"]


def setting(default: Any, check: Callable[[Any], bool] | None = None, allowed: str = "") -> Any:
    """A field whose value must pass ``check``; ``allowed`` says in words what passes."""
    return dataclasses.field(default=default, metadata={"check": check, "allowed": allowed})


def at_least(low: float) -> Callable[[Any], bool]:
    return lambda value: value >= low


def positive(value: float) -> bool:
    return value > 0


def unit_interval(value: float) -> bool:
    return 0 <= value <= 1


def non_empty(value: Any) -> bool:
    return len(value) > 0


class Section:
    """Checks every field of a config dataclass on construction.

    Types come from the annotations: ``int`` (not bool), ``float`` (ints become floats),
    ``bool``, ``str``, ``Path`` (from a string), ``Literal[...]`` (the allowed names),
    ``tuple[str, ...]`` (from a list), ``X | None``. Ranges come from :func:`setting`.
    """

    KEY: ClassVar[str] = ""
    """Where the section sits in the config (``"train"``): prefixes the keys in messages."""

    def __post_init__(self) -> None:
        hints = get_type_hints(type(self))
        for spec in dataclasses.fields(self):
            key = f"{self.KEY}.{spec.name}" if self.KEY else spec.name
            value = _coerce(getattr(self, spec.name), hints[spec.name], key,
                            spec.metadata.get("allowed", ""))
            object.__setattr__(self, spec.name, value)
            check = spec.metadata.get("check")
            if check is not None and value is not None and not check(value):
                raise ValueError(f"{key}={_plain(value)!r} is not allowed; allowed: "
                                 f"{spec.metadata['allowed']}")

    def to_dict(self) -> dict[str, Any]:
        """Plain values (lists, strings), as the YAML would write them."""
        return {spec.name: _plain(getattr(self, spec.name)) for spec in dataclasses.fields(self)}


def _plain(value: Any) -> Any:
    if isinstance(value, Section):
        return value.to_dict()
    if isinstance(value, AgentConfig):
        return dataclasses.asdict(value)
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    return value


# -- types -----------------------------------------------------------------------------------------
TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a finite number", str: "a string",
              Path: "a path"}


def _describe(hint: Any) -> str:
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, UnionType):
        return "null or " + " or ".join(_describe(a) for a in args if a is not type(None))
    if origin is Literal:
        return f"one of {list(args)}"
    if origin is tuple:
        return f"a list, each {_describe(args[0])}"
    if origin is Mapping:
        return "a mapping"
    return TYPE_WORDS.get(hint, getattr(hint, "__name__", str(hint)))


def _coerce(value: Any, hint: Any, key: str, allowed: str) -> Any:
    """``value`` as the annotated type (int -> float, list -> tuple, str -> Path) or ValueError."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _coerce(value, inner[0], key, allowed or _describe(hint))
    elif origin is Literal:
        if isinstance(value, str) and value in args:
            return value
        raise ValueError(f"{key}={value!r} is not allowed; allowed: {allowed or list(args)}")
    elif origin is tuple and isinstance(value, (list, tuple)):
        return tuple(_coerce(item, args[0], f"{key}[{i}]", "") for i, item in enumerate(value))
    elif hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        if math.isfinite(value):
            return float(value)
    elif hint is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    elif hint is Path and isinstance(value, (str, Path)) and str(value):
        return Path(value)
    elif isinstance(value, origin or hint) and (hint in (bool, str) or origin is Mapping
                                                 or dataclasses.is_dataclass(hint)):
        return value
    raise ValueError(f"{key}={value!r} is not allowed: expected {_describe(hint)}, got "
                     f"{type(value).__name__}; allowed: {allowed or _describe(hint)}")


def build_section(cls: type[Section], data: Any, prefix: str) -> Any:
    """``cls`` built from the plain mapping ``data`` (nested sections too); ``prefix`` names its
    keys in messages. Unknown keys fail with the allowed ones; missing keys take defaults."""
    where = prefix or "the config"
    if not isinstance(data, Mapping):
        raise ValueError(f"{where} must be a mapping of settings, got {data!r}")  # noqa: TRY004
    names = [spec.name for spec in dataclasses.fields(cls)]
    unknown = [f"{prefix}.{key}" if prefix else str(key) for key in data if key not in names]
    if unknown:
        listed = ", ".join(f"'{key}'" for key in unknown)
        raise ValueError(f"unknown key{'s' if len(unknown) > 1 else ''} {listed}; "
                         f"allowed: {names}")
    hints = get_type_hints(cls)
    kwargs = {}
    for key, value in data.items():
        nested = hints[key]
        if isinstance(nested, type) and issubclass(nested, Section):
            value = build_section(nested, value, nested.KEY)
        kwargs[key] = value
    return cls(**kwargs)
