"""The training config: hydra composition, validation messages, defaults kept in one place."""

import ast
import dataclasses
import inspect
import itertools
import re
import shutil
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from agentrl.config import (
    TrainConfig,
    build_config,
    compose_config,
    default_config_dir,
    schema,
)
from agentrl.config.fields import Section

CONFIGS = default_config_dir()
SECTIONS = [spec for spec in dataclasses.fields(TrainConfig) if spec.name != "agents"]


def yaml_body(path: Path) -> dict:
    """A config file's keys without hydra's defaults list."""
    data = OmegaConf.to_container(OmegaConf.load(path))
    data.pop("defaults", None)
    return data


def leaves(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def changed(config: TrainConfig, key: str, value) -> TrainConfig:
    """``config`` with one key replaced (validated like any construction; no hydra call)."""
    section, _, name = key.rpartition(".")
    if not section:
        return dataclasses.replace(config, **{name: value})
    inner = dataclasses.replace(getattr(config, section), **{name: value})
    return dataclasses.replace(config, **{section: inner})


@pytest.fixture(scope="module")
def default() -> TrainConfig:
    return compose_config()


def lookup(config: TrainConfig, key: str):
    for part in key.split("."):
        config = getattr(config, part)
    return list(config) if isinstance(config, tuple) else config


# -- composition -----------------------------------------------------------------------------------
def test_defaults_compose_into_frozen_dataclasses(default):
    assert isinstance(default, TrainConfig)
    for spec in SECTIONS:
        section = getattr(default, spec.name)
        if isinstance(section, Section):
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(section, dataclasses.fields(section)[0].name, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        default.seed = 1
    assert "simpleSokobanAgent" in default.agents
    assert default.hardware.name == "cpu" and default.model.name == "embedded"


def test_preset_values_win_over_base_yaml(default):
    """``_self_`` comes first in base.yaml's defaults list: a preset's value is the one used."""
    base = leaves(yaml_body(CONFIGS / "base.yaml"))
    preset = leaves(yaml_body(CONFIGS / "hardware" / "cpu.yaml"))
    assert any(base[key] != value for key, value in preset.items())  # else nothing is tested
    for key, value in preset.items():
        assert lookup(default, key) == value, key


def test_overrides_change_values_and_calls_repeat(default):
    steps = default.train.total_steps + 1
    config = compose_config(["model=tiny", f"train.total_steps={steps}", "actor.lr=2e-5"])
    assert (config.model.name, config.train.total_steps, config.actor.lr) == ("tiny", steps, 2e-5)
    assert compose_config() == default  # nothing carries over from one call to the next


def test_agent_preset_keys_can_be_overridden(default):
    """Most preset keys come from preset_defaults; a plain ``agents.X.key=v`` still sets them."""
    name = "simpleSokobanAgent"
    turns = default.agents[name].max_turns + 2
    config = compose_config([f"agents.{name}.max_turns={turns}"])
    assert config.agents[name].max_turns == turns
    assert all(config.agents[n] == default.agents[n] for n in default.agents if n != name)
    with pytest.raises(ValueError, match="max_turnz"):
        compose_config([f"agents.{name}.max_turnz=3"])


def test_configs_folder_from_the_environment(tmp_path, monkeypatch):
    """``AGENTRL_CONFIGS`` points at another folder: its presets are the allowed ones."""
    folder = tmp_path / "configs"
    shutil.copytree(CONFIGS, folder)
    (folder / "hardware" / "big.yaml").write_text(
        "# @package _global_\ntrain:\n  group_num: 6\nhardware:\n  name: big\n")
    monkeypatch.setenv("AGENTRL_CONFIGS", str(folder))
    config = compose_config(["hardware=big"])
    assert (config.train.group_num, config.hardware.name) == (6, "big")
    with pytest.raises(ValueError) as error:
        compose_config(["hardware=nope"])
    presets = sorted(p.stem for p in (folder / "hardware").glob("*.yaml"))
    assert "big" in presets and f"allowed hardware presets: {presets}" in str(error.value)


def test_agents_file_replaces_the_composed_presets(tmp_path):
    path = tmp_path / "agents.yaml"
    path.write_text("mySokoban:\n  game: Sokoban\n  env_kwargs: {preset: 6x6}\n  max_turns: 2\n")
    overrides = [f"agents_file={path}", "train.presets=[mySokoban]", "val.presets=[mySokoban]"]
    config = compose_config(overrides)
    assert list(config.agents) == ["mySokoban"] and config.agents["mySokoban"].max_turns == 2
    assert build_config(config.to_dict()) == config
    with pytest.raises(ValueError, match=r"agents\.mySokoban\.max_turns=3.*agents_file"):
        compose_config([*overrides, "agents.mySokoban.max_turns=3"])
    with pytest.raises(ValueError, match="agents_file="):
        compose_config([f"agents_file={tmp_path / 'missing.yaml'}"])


def test_run_dir_defaults_under_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = compose_config(["project=p", "experiment=e"])
    assert config.run_dir == tmp_path / "runs" / "p" / "e"
    assert compose_config(["run_dir=out"]).run_dir == tmp_path / "out"


# -- errors ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("override", ["+train.grop_num=3", "train.grop_num=3"])
def test_unknown_key_names_it_and_the_allowed_keys(override):
    with pytest.raises(ValueError) as error:
        compose_config([override])
    message = str(error.value)
    assert "'train.grop_num'" in message
    for spec in dataclasses.fields(schema.TrainGroupsConfig):
        assert spec.name in message


def test_unknown_key_in_a_dict(default):
    data = default.to_dict()
    data["rollout"]["temprature"] = 0.5
    with pytest.raises(ValueError, match=r"unknown key 'rollout\.temprature'; allowed: .*"
                                         r"'temperature'"):
        build_config(data)


def test_bad_enum_names_the_allowed_values():
    with pytest.raises(ValueError) as error:
        compose_config(["rollout.filter_mode=median"])
    message = str(error.value)
    assert "rollout.filter_mode='median'" in message
    assert "'std'" in message and "'std_rev'" in message


def test_gamma_unit_names_its_allowed_values():
    assert compose_config(["algorithm.gamma_unit=turn"]).algorithm.gamma_unit == "turn"
    with pytest.raises(ValueError, match=r"algorithm.gamma_unit='step'.*'token'.*'turn'"):
        compose_config(["algorithm.gamma_unit=step"])


def test_bad_type_from_the_command_line_names_the_key_and_the_value():
    with pytest.raises(ValueError, match=r"^train\.group_num='abc' is not allowed: expected an "
                                         r"integer, got str"):
        compose_config(["train.group_num=abc"])


@pytest.mark.parametrize("key, value", [("val.before_train", 3), ("lora.target_modules", "q_proj"),
                                        ("actor.lr", float("nan")), ("train.group_num", 2.0),
                                        ("seed", True), ("trainer.logger", ["console", "mail"])])
def test_bad_type_names_the_key_and_the_value(default, key, value):
    with pytest.raises(ValueError, match=rf"^{re.escape(key)}.*=.*is not allowed"):
        changed(default, key, value)


@pytest.mark.parametrize("section", ["train", "val"])
def test_unknown_preset_names_the_allowed_presets(default, section):
    with pytest.raises(ValueError) as error:
        changed(default, f"{section}.presets", ["simpleSokobanAgent", "nopeAgent"])
    message = str(error.value)
    assert f"{section}.presets" in message and "nopeAgent" in message
    assert all(name in message for name in default.agents)


def test_unknown_preset_from_the_command_line():
    with pytest.raises(ValueError, match=r"train\.presets: unknown agent preset.*'nopeAgent'.*"
                                         r"allowed: .*'simpleSokobanAgent'"):
        compose_config(["train.presets=[nopeAgent]"])


def test_unknown_hardware_preset_lists_the_presets():
    presets = sorted(path.stem for path in (CONFIGS / "hardware").glob("*.yaml"))
    with pytest.raises(ValueError) as error:
        compose_config(["hardware=nope"])
    assert f"allowed hardware presets: {presets}" in str(error.value)


def test_bad_override_syntax_is_a_value_error():
    with pytest.raises(ValueError, match="train.group_num"):
        compose_config(["train.group_num"])


def test_grpo_needs_groups_of_two():
    with pytest.raises(ValueError, match=r"train\.group_size=1 .*grpo"):
        compose_config(["algorithm.adv_estimator=grpo", "train.group_size=1"])
    assert compose_config(["algorithm.adv_estimator=grpo",
                           "train.group_size=2"]).algorithm.adv_estimator == "grpo"


def test_mini_batches_divide_the_kept_batch(default):
    config = changed(changed(default, "train.group_num", 4), "train.group_size", 3)
    config = changed(changed(config, "rollout.filter_ratio", 0.5), "actor.micro_batch_size", 2)
    assert config.kept_trajectories == 6
    assert changed(config, "actor.ppo_mini_batch_size", 3).actor.ppo_mini_batch_size == 3
    with pytest.raises(ValueError, match=r"ppo_mini_batch_size=4 .*\[1, 2, 3, 6\]"):
        changed(config, "actor.ppo_mini_batch_size", 4)
    # micro-batches count rows, mini-batches trajectories (a trajectory is a row per turn):
    # more rows in a micro-batch than trajectories in a mini-batch is a valid set-up
    config = changed(config, "actor.ppo_mini_batch_size", 1)
    assert changed(config, "actor.micro_batch_size", 3).actor.micro_batch_size == 3


@pytest.mark.parametrize("key, value", [
    ("actor.clip_ratio_c", 1.0), ("actor.lr", 0.0), ("val.presets", []), ("train.group_num", 0),
    ("rollout.filter_ratio", 0.0), ("rollout.filter_ratio", 1.5), ("train.total_steps", 0),
    ("experiment", "a/b"), ("resume", "/no/such/dir"),
    ("lora.dropout", 1.0), ("model.chat_template", "chatmll"), ("trainer.keep_last", 0)])
def test_out_of_range_values_fail(default, key, value):
    with pytest.raises(ValueError, match=rf"^{re.escape(key)}=.* is not allowed.*allowed: "):
        changed(default, key, value)


def test_a_reply_limit_past_the_context_budget_names_both_keys(default):
    """The rule is between two keys, and either may be the one the user changed: both are named,
    each with what it may be."""
    with pytest.raises(ValueError, match=r"^rollout\.max_context_tokens=2048 cannot hold a reply "
                       r"of rollout\.max_new_tokens=1000000 .*allowed: .*rollout\.max_new_tokens "
                       r"in \[1, 2047\]"):
        changed(default, "rollout.max_new_tokens", 1_000_000)


def test_in_range_values_pass(default):
    assert changed(default, "model.chat_template", "llama3").model.chat_template == "llama3"
    assert changed(default, "resume", "never").resume == "never"
    assert changed(default, "val.max_new_tokens", 32).val.max_new_tokens == 32


@pytest.mark.slow
def test_policy_loss_names_come_from_verl():
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    other = min(set(POLICY_LOSS_REGISTRY) - {"vanilla"})
    assert compose_config([f"actor.policy_loss={other}"]).actor.policy_loss == other
    with pytest.raises(ValueError, match="actor.policy_loss='nope'"):
        compose_config(["actor.policy_loss=nope"])


# -- saving and documentation ----------------------------------------------------------------------
def test_to_dict_is_plain_and_round_trips():
    config = compose_config(["model=tiny", "trainer.logger=[console]", "lora.rank=8"])
    data = config.to_dict()
    assert yaml.safe_load(yaml.safe_dump(data)) == data  # plain values only
    assert build_config(data) == config


def test_base_yaml_defaults_are_the_dataclass_defaults():
    """Values written in base.yaml and in the dataclasses agree (both document the default)."""
    assert build_config(yaml_body(CONFIGS / "base.yaml")) == TrainConfig()


def test_every_key_is_documented_in_yaml_and_schema():
    """base.yaml holds exactly the schema's keys, each with a comment (on its line or just
    above), and every dataclass field has a docstring."""
    commented, section, comment_above = set(), "", False
    for line in (CONFIGS / "base.yaml").read_text().splitlines():
        match = re.match(r"^( *)([a-z_]+):(.*)$", line)
        if match and match[2] != "defaults":
            indent, key, rest = match.groups()
            section = key if not indent else section
            if "#" in rest or comment_above:
                commented.add(f"{section}.{key}" if indent else key)
        comment_above = line.strip().startswith("#")
    base = yaml_body(CONFIGS / "base.yaml")
    yaml_keys = set(leaves(base)) | set(base)
    schema_keys = {spec.name for spec in SECTIONS} | {
        f"{spec.name}.{inner.name}" for spec in SECTIONS if isinstance(spec.default_factory, type)
        for inner in dataclasses.fields(spec.default_factory)}
    assert yaml_keys == schema_keys
    assert schema_keys <= commented
    documented = _field_docstrings()
    assert [key for key in schema_keys
            if key.split(".")[-1] not in documented.get(_owner(key), set())] == []


def _owner(key: str) -> str:
    if "." not in key:
        return "TrainConfig"
    spec = next(spec for spec in SECTIONS if spec.name == key.split(".")[0])
    return spec.default_factory.__name__


def _field_docstrings() -> dict[str, set[str]]:
    """Class name -> fields followed by a docstring, read from schema.py's source."""
    tree = ast.parse(inspect.getsource(schema))
    out: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            body = node.body
            out[node.name] = {
                item.target.id for item, after in itertools.pairwise(body)
                if isinstance(item, ast.AnnAssign) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)}
    return out


def test_enumerations_match_the_layers_that_use_them():
    from agentrl.rollout.batch import REWARD_PLACEMENTS
    from agentrl.rollout.groups import FILTER_MODES, GROUPINGS, METHODS
    from agentrl.trainers.tracking import WANDB_MODES

    def allowed(cls, name):
        return set(_literal_args(cls, name))

    assert allowed(schema.RolloutConfig, "filter_mode") == set(FILTER_MODES)
    assert allowed(schema.RolloutConfig, "grouping") == set(GROUPINGS)
    assert allowed(schema.RolloutConfig, "norm_method") == set(METHODS)
    assert allowed(schema.RolloutConfig, "reward_placement") == set(REWARD_PLACEMENTS)
    assert allowed(schema.TrainerConfig, "wandb_mode") == set(WANDB_MODES)


def _literal_args(cls, name):
    from typing import Literal, get_args, get_origin, get_type_hints

    hint = get_type_hints(cls)[name]
    while get_origin(hint) is not Literal:
        hint = next(a for a in get_args(hint) if a is not type(None))
    return get_args(hint)


def test_a_training_pool_holds_training_seeds_only():
    """``train.pool`` takes training seeds; a held-out seed is refused naming the key."""
    assert compose_config(["train.pool=[3,5]"]).train.pool == (3, 5)
    with pytest.raises(ValueError, match=r"train\.pool"):
        compose_config(["train.pool=[1000001]"])
