"""Agent presets: every preset of configs/agents.yaml loads and plays; bad files fail clearly."""

from __future__ import annotations

import dataclasses
import textwrap

import pytest
import yaml

from agentrl.agents import (
    GAME_SPECS, Agent, AgentConfig, agent_presets_from_dict, load_agent_presets,
)
from agentrl.agents.config import DEFAULT_PATH, DEFAULTS_KEY, RULES
from agentrl.envs import GAMES
from agentrl.envs.splits import VARIANTS

PRESETS = load_agent_presets()


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_builds_an_agent_that_resets(name):
    with Agent(PRESETS[name]) as agent:
        messages = agent.reset(seed=0)
        assert [m["role"] for m in messages] == ["system", "user"]
        rules = (agent.env.unwrapped.brief_rules if agent.config.rules == "brief"
                 else agent.env.unwrapped.rules)
        assert rules in messages[-1]["content"]
        assert agent.env.unwrapped.render() in messages[-1]["content"]
        assert not agent.done


def test_the_file_has_the_anchor_presets():
    expected = {
        "simpleSokobanAgent", "largeSokobanAgent", "sokoban2BoxAgent", "tetrisType1Agent",
        "tetrisType2Agent", "blocksworldTextAgent", "blocksworld1dAgent", "blocksworld2dAgent",
        "textworldEasyAgent", "textworldMediumAgent", "textworldHardAgent",
    }
    assert expected <= set(PRESETS)
    simple = PRESETS["simpleSokobanAgent"]  # GRL's numbers
    assert (simple.max_turns, simple.max_actions_per_turn, simple.max_actions_all_turns,
            simple.action_separator) == (6, 5, 10, "||")
    assert simple.format_penalty == "auto"  # docs/TRAINING.md, "Format penalty"
    assert simple.env_kwargs == {"preset": "6x6"}


def test_every_game_has_a_spec():
    assert GAME_SPECS.keys() == GAMES.keys()


def test_yaml_defaults_match_the_dataclass_defaults():
    raw = yaml.safe_load(DEFAULT_PATH.read_text())[DEFAULTS_KEY]
    assert list(raw) == list(RULES) == [f.name for f in dataclasses.fields(AgentConfig)]
    for field in dataclasses.fields(AgentConfig):
        default = (field.default_factory() if field.default is dataclasses.MISSING
                   and field.default_factory is not dataclasses.MISSING else field.default)
        if field.name != "game":  # required: no default
            assert raw[field.name] == default, field.name


def test_held_out_twins_match_the_seed_splits():
    held_out = {(v.game, v.preset) for v in VARIANTS if v.held_out}
    known = {(v.game, v.preset) for v in VARIANTS}
    for name, config in PRESETS.items():
        variant = (config.game, config.env_kwargs["preset"])
        assert variant in known, name
        if variant in held_out:
            assert config.held_out_of is not None, f"{name} plays a held-out variant"
        if config.held_out_of:
            assert PRESETS[config.held_out_of].held_out_of is None


# -- errors --------------------------------------------------------------------------------------
def load(tmp_path, text: str, **kwargs):
    path = tmp_path / "agents.yaml"
    path.write_text(textwrap.dedent(text))
    return load_agent_presets(path, **kwargs)


def test_unknown_key_names_preset_key_and_allowed(tmp_path):
    with pytest.raises(ValueError) as error:
        load(tmp_path, "mine: {game: Sokoban, max_turn: 3}")
    message = str(error.value)
    assert "'mine'" in message and "max_turn" in message and "'max_turns'" in message


def test_unknown_key_in_the_defaults_block(tmp_path):
    with pytest.raises(ValueError, match=f"'{DEFAULTS_KEY}'.*'colour'"):
        load(tmp_path, f"{DEFAULTS_KEY}: {{colour: red}}\nmine: {{game: Sokoban}}")


@pytest.mark.parametrize("key, value, allowed", [
    ("game", "Chess", "'Sokoban', 'Tetris', 'BlocksWorld', 'TextWorld'"),
    ("max_turns", -1, "an integer >= 1"),
    ("max_turns", "3", "an integer >= 1"),
    ("max_turns", 2.5, "an integer >= 1"),
    ("max_actions_per_turn", 0, "an integer >= 1"),
    ("max_actions_all_turns", True, "an integer >= 1"),
    ("history_window", -2, "an integer >= 0"),
    ("max_response_tokens", 0, "an integer >= 1"),
    ("enable_think", "yes", "true or false"),
    ("format_penalty", 0.5, "a finite number <= 0"),
    ("format_penalty", ".nan", "a finite number <= 0"),
    ("format_penalty", "cheap", "'auto' or a finite number <= 0"),
    ("action_separator", "", "punctuation"),
    ("action_separator", " ", "punctuation"),
    ("action_separator", "and", "punctuation"),
    ("action_separator", "</", "punctuation"),
    ("action_separator", "|| ", "punctuation"),
    ("env_kwargs", [1, 2], "a mapping"),
    ("system_prompt", 3, "a string"),
    ("held_out_of", "nobody", "a training Sokoban preset"),
])
def test_bad_value_names_preset_key_and_allowed(tmp_path, key, value, allowed):
    body = {"game": "Sokoban", key: value}
    if key == "format_penalty" and value == ".nan":
        body[key] = float("nan")
    with pytest.raises(ValueError) as error:
        load(tmp_path, yaml.safe_dump({"mine": body}), check_envs=False)
    message = str(error.value)
    assert "'mine'" in message and key in message and allowed in message, message


def test_a_value_that_cannot_merge_over_the_defaults(tmp_path):
    with pytest.raises(ValueError, match="'mine': cannot merge"):
        load(tmp_path, f"{DEFAULTS_KEY}: {{env_kwargs: {{}}}}\nmine: {{game: Tetris, env_kwargs: [1]}}")


def test_held_out_of_must_be_a_training_preset(tmp_path):
    text = """
        base: {game: Tetris}
        twin: {game: Tetris, held_out_of: base}
        twin2: {game: Tetris, held_out_of: twin}
    """
    with pytest.raises(ValueError, match=r"'twin2'.*held_out_of='twin'.*\['base'\]"):
        load(tmp_path, text, check_envs=False)


@pytest.mark.parametrize("env_kwargs, words", [
    ({"preset": "9x9"}, ["'mine'", "env_kwargs", "'6x6'", "'8x8'"]),
    ({"preset": "6x6", "colour": 1}, ["'mine'", "env_kwargs", "dim_room", "num_boxes"]),
    ({"num_boxes": 0}, ["'mine'", "num_boxes", "[1, 15]"]),
])
def test_bad_env_kwargs_are_caught_at_load(tmp_path, env_kwargs, words):
    with pytest.raises(ValueError) as error:
        load(tmp_path, yaml.safe_dump({"mine": {"game": "Sokoban", "env_kwargs": env_kwargs}}))
    assert all(word in str(error.value) for word in words), str(error.value)


def test_missing_game_and_non_mapping_preset(tmp_path):
    with pytest.raises(ValueError, match="'mine': game is required; allowed: one of"):
        load(tmp_path, "mine: {max_turns: 3}")
    with pytest.raises(ValueError, match="'mine' must be a mapping"):
        load(tmp_path, "mine: 3")
    with pytest.raises(FileNotFoundError):
        load_agent_presets(tmp_path / "absent.yaml")


def test_defaults_merge_under_presets(tmp_path):
    presets = load(tmp_path, f"""
        {DEFAULTS_KEY}: {{max_turns: 3, env_kwargs: {{max_steps: 20}}}}
        a: {{game: Tetris, env_kwargs: {{preset: 4x4-type1}}}}
        b: {{game: Tetris, max_turns: 7}}
    """)
    assert presets["a"].max_turns == 3 and presets["b"].max_turns == 7
    assert presets["a"].env_kwargs == {"max_steps": 20, "preset": "4x4-type1"}
    assert presets["b"].action_separator == "||"


def test_direct_construction_is_validated_and_copies_env_kwargs():
    with pytest.raises(ValueError, match="max_turns=0 is not allowed; allowed: an integer >= 1"):
        AgentConfig(game="Sokoban", max_turns=0)
    kwargs = {"preset": "6x6"}
    config = AgentConfig(game="Sokoban", env_kwargs=kwargs, format_penalty=-1)
    kwargs["preset"] = "8x8"
    assert config.env_kwargs == {"preset": "6x6"} and config.format_penalty == -1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_turns = 3


def test_hydra_composes_the_file(tmp_path):
    """The file is composed by Hydra later: a `defaults` mapping there would break it."""
    from hydra import compose, initialize_config_dir

    (tmp_path / "agents.yaml").write_text(DEFAULT_PATH.read_text())
    (tmp_path / "base.yaml").write_text("defaults:\n  - agents@agents\n  - _self_\n")
    with initialize_config_dir(str(tmp_path), version_base=None):
        cfg = compose("base", overrides=[f"agents.{DEFAULTS_KEY}.max_turns=4",
                                         "+agents.simpleSokobanAgent.max_turns=3"])
    presets = agent_presets_from_dict(cfg.agents, check_envs=False)
    assert presets.keys() == PRESETS.keys()
    assert presets["simpleSokobanAgent"].max_turns == 3
    assert presets["blocksworldTextAgent"].max_turns == 11  # its own key beats the defaults
    assert presets["largeSokobanAgent"].max_turns == 4


@pytest.mark.parametrize("limits, worst, expected", [
    ((6, 5, 10), -0.1, -0.6),     # Sokoban 6x6: a turn of 5 wasted moves is -0.5
    ((6, 5, 10), -1.1, -5.6),     # two boxes: a push can take a box off its target
    ((11, 5, 20), -1.0, -5.1),    # BlocksWorld: 5 legal moves a turn
    ((2, 1, 10), -0.1, -0.6),     # 2 turns for 10 actions: a malformed turn stands for 5
    ((1, 1, 1), 0.0, -0.1),       # Bandit, TextWorld: moves cost nothing, the margin stays
])
def test_auto_format_penalty_sits_below_the_worst_legal_turn(limits, worst, expected):
    turns, per_turn, in_all = limits
    config = AgentConfig(game="Sokoban", max_turns=turns, max_actions_per_turn=per_turn,
                         max_actions_all_turns=in_all)
    assert config.format_penalty == "auto"
    assert config.format_penalty_for(worst) == pytest.approx(expected)
    assert turns * config.format_penalty_for(worst) < in_all * worst  # the episode bound
    explicit = AgentConfig(game="Sokoban", format_penalty=-0.3)
    assert explicit.format_penalty_for(worst) == -0.3  # a number is used as given
