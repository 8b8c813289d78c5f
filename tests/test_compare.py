"""`agentrl eval --compare`: variants parsed and checked, played on the same seeds, one table."""

from __future__ import annotations

import json

import pytest

from agentrl.agents import load_agent_presets
from agentrl.cli import main
from agentrl.evaluation.compare import apply_variant, parse_variant


def test_a_variant_is_key_value_pairs_read_as_yaml():
    variant = parse_variant("enable_think=false, max_response_tokens=64")
    assert variant.settings == {"enable_think": False, "max_response_tokens": 64}


@pytest.mark.parametrize("text, message", [
    ("enable_thinking=false", "allowed keys: .*'enable_think'"),
    ("game=Sokoban", "allowed keys"),  # a variant may not change the game
    ("enable_think", "not KEY=VALUE"),
    ("", "empty variant"),
])
def test_bad_variants_name_the_allowed_keys(text, message):
    with pytest.raises(ValueError, match=message):
        parse_variant(text)


def test_a_bad_value_names_the_variant_and_key():
    presets = {"banditAgent": load_agent_presets(check_envs=False)["banditAgent"]}
    with pytest.raises(ValueError, match="'max_turns=0'.*max_turns=0 is not allowed"):
        apply_variant(presets, parse_variant("max_turns=0"))


def test_model_variants_play_the_same_seeds_into_one_table_and_a_plot(
        tiny, tmp_path, capsys, one_torch_thread, monkeypatch):
    """The tiny model with and without a think block: same seeds, both rows, a PNG."""
    import agentrl.cli.eval as eval_cli

    monkeypatch.setattr(eval_cli, "model_path", lambda name, *flag: name)
    out = tmp_path / "compare.json"
    code = main(["eval", "--model", "tiny", "--presets", "babyaiGoTo3Agent", "--groups", "2",
                 "--max-new-tokens", "6", "--device", "cpu", "--out", str(out), "--no-progress",
                 "--compare", "enable_think=true", "enable_think=false,max_turns=1"])
    assert code == 0
    data = json.loads(out.read_text())
    think, direct = data["variants"]["enable_think=true"], data["variants"][
        "enable_think=false,max_turns=1"]
    assert think["seeds"] == direct["seeds"]
    assert direct["presets"]["babyaiGoTo3Agent"]["turns"] == 1.0  # the variant took effect
    assert think["presets"]["babyaiGoTo3Agent"]["turns"] > 1.0
    assert [(r["variant"], r["preset"]) for r in data["comparison"]] == [
        ("enable_think=true", "babyaiGoTo3Agent"),
        ("enable_think=false,max_turns=1", "babyaiGoTo3Agent")]
    assert all(r["response_length"] > 0 and r["seconds_per_episode"] > 0
               for r in data["comparison"])
    assert (tmp_path / "compare.png").stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "reply tokens / episode" in printed and "s / episode" in printed


def test_a_bad_variant_fails_before_playing(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--policy", "oracle", "--presets", "babyaiGoTo3Agent", "--compare",
              "answer_format=plain", "--no-progress", "--out", str(tmp_path / "x.json")])
    assert exit_info.value.code == 2
    assert "enable_think" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_a_variant_given_twice_is_played_once(tmp_path, capsys):
    """``enable_think=true`` and ``enable_think=True``, the same settings: one variant, and the
    console says which was dropped."""
    out = tmp_path / "compare.json"
    assert main(["eval", "--policy", "random", "--presets", "banditAgent", "--groups", "1",
                 "--out", str(out), "--no-progress", "--compare", "enable_think=true",
                 "max_turns=2", "enable_think=True", "enable_think=true"]) == 0
    data = json.loads(out.read_text())
    assert list(data["variants"]) == ["enable_think=true", "max_turns=2"]
    assert [row["variant"] for row in data["comparison"]] == ["enable_think=true", "max_turns=2"]
    printed = capsys.readouterr().out
    assert "'enable_think=True', 'enable_think=true' repeat 'enable_think=true'" in printed
