"""scripts/bench/learn.py --compare: a variant becomes overrides of the preset in the config."""

from __future__ import annotations

import pytest

from agentrl.config import compose_config

@pytest.fixture(scope="module")
def learn(load_script):
    return load_script("scripts/bench/learn.py")


def test_a_variant_overrides_only_its_preset(learn):
    overrides = learn.variant_overrides("babyaiGoTo3Agent",
                                                "enable_think=false,max_response_tokens=64")
    assert overrides == ["agents.babyaiGoTo3Agent.enable_think=false",
                         "agents.babyaiGoTo3Agent.max_response_tokens=64"]
    agents = compose_config(overrides).agents
    assert not agents["babyaiGoTo3Agent"].enable_think
    assert agents["babyaiGoTo3Agent"].max_response_tokens == 64
    assert agents["babyaiGoTo5Agent"].enable_think  # other presets keep their settings


def test_a_bad_variant_key_is_named(learn):
    with pytest.raises(ValueError, match="allowed keys"):
        learn.variant_overrides("babyaiGoTo3Agent", "thinking=off")
