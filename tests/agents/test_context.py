"""``context: state`` (every turn a fresh chat) and ``rules: brief``, on the default preset."""

from __future__ import annotations

import dataclasses
import random

import pytest

from agentrl.agents import Agent, agent_presets_from_dict, load_agent_presets
from agentrl.envs.blocksworld import BlocksWorldEnv, render_compact

PRESETS = load_agent_presets(check_envs=False)
DEFAULT = "tightBlocksworldTurnsAgent"  # quick_train.sh's training preset


def history_layout():
    """The default preset as it was: a growing chat, one past turn kept, the full rules."""
    return dataclasses.replace(PRESETS[DEFAULT], context="history", rules="full",
                               history_window=1,
                               env_kwargs={"preset": "text", "min_blocks": 3})


def test_the_default_preset_shows_each_turn_the_state_alone():
    config = PRESETS[DEFAULT]
    assert (config.context, config.rules, config.history_window) == ("state", "brief", 0)
    assert config.windowed
    with Agent(config) as agent:
        chat = agent.reset(seed=3)
        replies = []
        while True:
            env: BlocksWorldEnv = agent.env.unwrapped
            user = chat[-1]["content"]
            assert [m["role"] for m in chat] == ["system", "user"]
            assert f"Turns left: {config.max_turns - agent.turn}." in user
            assert f"Current state: {render_compact(env.state)}\n" in user
            assert user.endswith(f"Goal state: {render_compact(env.goal)}")
            assert "move X to Y" in user and "<answer>move 2 to 0</answer>" in user
            assert not any(reply in user for reply in replies)  # no earlier reply
            assert "Reward" not in user and "You took" not in user  # no feedback
            reply = agent.oracle_response()
            replies.append(reply)
            result = agent.step(reply)
            if result.done:
                break
            assert result.fresh
            assert Agent.next_chat(chat, reply, result) == result.messages
            chat = result.messages
        assert result.success and result.messages == [] and not result.fresh
    assert len(replies) >= 2


def test_a_history_chat_still_grows_turn_by_turn():
    config = history_layout()
    with Agent(config) as agent:
        chat = agent.reset(seed=3)
        reply = agent.oracle_response()
        result = agent.step(reply)
        assert not result.fresh and len(result.messages) == 1
        grown = Agent.next_chat(chat, reply, result)
        assert grown == [*chat, {"role": "assistant", "content": reply}, *result.messages]
        assert "You took 1 action(s)" in grown[-1]["content"]
        assert "Turn 2 of 6; 5 actions left." in grown[-1]["content"]


def test_the_layouts_play_the_same_game_with_the_same_moves_and_grammar():
    """Only the prompt changed: the oracle wins every game, in the same moves, and a reply's
    grammar and parse are those of the old layout."""
    new, old = PRESETS[DEFAULT], history_layout()
    rng = random.Random(0)
    for seed in range(40):
        with Agent(new) as a, Agent(old) as b:
            a.reset(seed=seed)
            b.reset(seed=seed)
            assert a.env.unwrapped.instance_key() == b.env.unwrapped.instance_key()
            while not a.done:
                assert a.answer_grammar() == b.answer_grammar()
                assert a.oracle_response() == b.oracle_response()
                reply = a.oracle_response() if rng.random() < 0.7 else a.random_response(rng)
                ra, rb = a.step(reply), b.step(reply)
                assert (ra.reward, ra.done, ra.success, ra.info["actions"]) == (
                    rb.reward, rb.done, rb.success, rb.info["actions"])
    for seed in range(40):
        with Agent(new) as agent:
            agent.reset(seed=seed)
            while not agent.done:
                result = agent.step(agent.oracle_response())
            assert result.success


def test_a_turns_prompt_names_the_actions_left_where_the_budget_binds():
    config = dataclasses.replace(PRESETS[DEFAULT], max_actions_per_turn=2,
                                 max_actions_all_turns=5)
    with Agent(config) as agent:
        agent.reset(seed=1)
        result = agent.step("<answer>move 1 to 0 || move 2 to 0</answer>")
        if not result.done:
            assert "Turns left: 5. Actions left: " in result.messages[-1]["content"]


def test_context_and_rules_are_checked_at_load():
    base = {"game": "BlocksWorld", "env_kwargs": {"preset": "text"}}
    with pytest.raises(ValueError, match=r"context='chat' is not allowed; allowed: "
                                         r"one of \['history', 'state'\]"):
        agent_presets_from_dict({"p": {**base, "context": "chat"}})
    with pytest.raises(ValueError, match=r"history_window=1 is not allowed with "
                                         r"context='state'.*allowed: 0"):
        agent_presets_from_dict({"p": {**base, "context": "state", "history_window": 1}})
    with pytest.raises(ValueError, match=r"rules='brief' is not allowed for Sokoban: the game "
                                         r"has no brief_rules; allowed: 'full'"):
        agent_presets_from_dict({"p": {"game": "Sokoban", "rules": "brief"}})
    with pytest.raises(ValueError, match="rules='brief' is not allowed for Sokoban"):
        Agent(dataclasses.replace(PRESETS["simpleSokobanAgent"], rules="brief"))


def test_compact_states_list_what_sits_on_another_block():
    assert render_compact((0, 1, 2)) == "2 on 1, 3 on 2"
    assert render_compact((0, 0, 0)) == "all on the table"
    env = BlocksWorldEnv.from_state((0, 1, 0), (0, 0, 1), render_style="compact")
    assert env.render() == "Current state: 2 on 1\nGoal state: 3 on 1"
    assert "unlisted blocks: on the table" in env.brief_rules
    assert "unlisted" not in BlocksWorldEnv(render_style="text").brief_rules


def test_the_decoding_line_says_a_state_preset_shows_no_past_turn():
    """``agentrl eval`` and ``play --model`` describe a run's presets: a ``context: state``
    preset keeps no past turn (its ``history_window`` 0 does not mean "all turns" there)."""
    from agentrl.evaluation.decoding import Decoding, history_shown, run_decoding

    assert history_shown(PRESETS[DEFAULT]) == "state"
    assert history_shown(history_layout()) == 1
    assert history_shown(PRESETS["banditAgent"]) == 0
    run = {"val": {"presets": [DEFAULT, "banditAgent"]},
           "agents": {DEFAULT: dataclasses.asdict(PRESETS[DEFAULT]), "banditAgent": {}}}
    decoding = run_decoding(run)
    assert decoding.history_windows == {DEFAULT: "state", "banditAgent": 0}
    assert (f"history {DEFAULT} none (each turn its own chat), banditAgent all turns"
            in Decoding(constrained=True, history_windows=decoding.history_windows).describe())
