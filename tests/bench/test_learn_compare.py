"""scripts/bench/learn.py --compare: a variant becomes overrides of the preset in the config."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from agentrl.config import compose_config

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "learn.py"


def learn_module():
    spec = importlib.util.spec_from_file_location("learn_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_variant_overrides_only_its_preset():
    overrides = learn_module().variant_overrides("babyaiGoTo3Agent",
                                                "enable_think=false,max_response_tokens=64")
    assert overrides == ["agents.babyaiGoTo3Agent.enable_think=false",
                         "agents.babyaiGoTo3Agent.max_response_tokens=64"]
    agents = compose_config(overrides).agents
    assert not agents["babyaiGoTo3Agent"].enable_think
    assert agents["babyaiGoTo3Agent"].max_response_tokens == 64
    assert agents["babyaiGoTo5Agent"].enable_think  # other presets keep their settings


def test_a_bad_variant_key_is_named():
    with pytest.raises(ValueError, match="allowed keys"):
        learn_module().variant_overrides("babyaiGoTo3Agent", "thinking=off")
