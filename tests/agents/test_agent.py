"""The Agent on real games: oracle episodes, penalties, limits, feedback, history window."""

from __future__ import annotations

import dataclasses
import random

import gymnasium
import numpy as np
import pytest

from agentrl.agents import (
    Agent, AgentConfig, agent_presets_from_dict, load_agent_presets,
)
from agentrl.agents.parsing import parse_response
from agentrl.envs import env_id

PRESETS = load_agent_presets(check_envs=False)
ONE_PER_GAME = ["simpleSokobanAgent", "tetrisType1Agent", "blocksworldTextAgent",
                "textworldEasyAgent", "banditAgent", "babyaiDoorKeyAgent", "twxCookingAgent"]


def config(name: str = "tetrisType1Agent", **changes) -> AgentConfig:
    return dataclasses.replace(PRESETS[name], **changes)


def play(agent: Agent, policy) -> tuple[list[dict], list]:
    """Run a reset episode to its end; returns the chat after turn 1 and the turn results."""
    messages, results = [], []
    while not agent.done:
        reply = policy()
        result = agent.step(reply)
        messages += [{"role": "assistant", "content": reply}, *result.messages]
        results.append(result)
    return messages, results


@pytest.mark.parametrize("name", ONE_PER_GAME)
def test_oracle_episode_succeeds_under_the_preset_limits(name):
    with Agent(PRESETS[name]) as agent:
        agent.reset(seed=0)
        plan = agent.env.unwrapped.oracle_plan()
        _, results = play(agent, agent.oracle_response)
    last = results[-1]
    assert last.done and last.success and last.messages == []
    assert last.info["terminated"] and not last.info["truncated"]
    assert all(r.format_ok and r.num_valid_actions == r.num_actions for r in results)
    assert sum(r.num_actions for r in results) == len(plan)
    assert sum(r.reward for r in results) == pytest.approx(agent.episode_return)
    assert all(not r.done and r.messages for r in results[:-1])


def test_turn_reward_is_the_sum_of_env_rewards():
    agent = Agent(config())
    agent.reset(seed=3)
    plan = agent.env.unwrapped.oracle_plan()
    env = gymnasium.make(env_id("Tetris"), **agent.config.env_kwargs)
    env.reset(seed=3)
    expected = [env.step(action)[1] for action in plan]
    _, results = play(agent, agent.oracle_response)
    assert len(results) >= 2  # the plan spans turns: feedback messages were made
    per_turn = [sum(expected[i:i + 5]) for i in range(0, len(expected), 5)]
    assert [r.reward for r in results] == pytest.approx(per_turn)


def test_bad_format_costs_the_penalty_and_steps_nothing():
    agent = Agent(config(format_penalty=-0.25))
    first = agent.reset(seed=0)[-1]["content"]
    board = agent.env.unwrapped.render()
    result = agent.step("Left || Down")  # no tags
    assert not result.format_ok and result.reward == -0.25
    assert result.num_actions == 0 and agent.env.unwrapped.num_steps == 0
    assert agent.env.unwrapped.render() == board and agent.actions_used == 0
    assert result.info["format_error"] == "no <answer> block"
    feedback = result.messages[0]["content"]
    assert result.messages[0]["role"] == "user"
    assert "broke the answer format (no <answer> block)" in feedback and "-0.25" in feedback
    assert "Turn 2 of 11; 40 actions left." in feedback and board in feedback
    assert "Turn 1 of 11; 40 actions left." in first


def test_invalid_actions_follow_the_game_and_are_counted():
    agent = Agent(config("simpleSokobanAgent"))
    agent.reset(seed=0)
    result = agent.step("<think>x</think><answer>Jump || Fly</answer>")
    assert result.format_ok and result.num_actions == 2
    assert result.num_valid_actions == 0 and result.num_effective_actions == 0
    assert result.reward == pytest.approx(-0.2)  # Sokoban's own -0.1 per action
    assert result.info["invalid_actions"] == ["Jump", "Fly"]
    assert "Invalid, so nothing happened: Jump, Fly." in result.messages[0]["content"]


def test_action_budget_is_enforced_across_turns():
    # Left at the wall never ends a Tetris game: only the budget can.
    agent = Agent(config(max_actions_per_turn=3, max_actions_all_turns=5, max_turns=9))
    agent.reset(seed=0)
    moves = "<think>x</think><answer>Left || Left || Left || Left</answer>"
    first = agent.step(moves)
    assert (first.num_actions, first.dropped_actions, first.done) == (3, 1, False)
    assert first.info["dropped_over_turn_limit"] == 1
    assert "Ignored 1 action(s) over the limit of 3 a turn." in first.messages[0]["content"]
    assert "2 actions left" in first.messages[0]["content"]
    second = agent.step(moves)
    assert (second.num_actions, second.dropped_actions, second.done) == (2, 2, True)
    assert second.info["truncated"] and not second.info["terminated"]
    assert second.messages == [] and agent.env.unwrapped.num_steps == 5
    with pytest.raises(RuntimeError, match="reset"):
        agent.step(moves)


def test_max_turns_ends_the_episode():
    agent = Agent(config(max_turns=2))
    agent.reset(seed=0)
    assert not agent.step("nonsense").done
    last = agent.step("<think>x</think><answer>Left</answer>")
    assert last.done and not last.success and last.info["truncated"]


def test_actions_after_the_game_ends_are_dropped():
    agent = Agent(config("simpleSokobanAgent"))
    for seed in range(50):  # a room solved in <= 3 moves (a third of 6x6 rooms are)
        agent.reset(seed=seed)
        plan = agent.env.unwrapped.oracle_plan()
        if len(plan) <= 3:
            break
    result = agent.step("<think>x</think><answer>" + " || ".join(plan + ["Up"]) + "</answer>")
    assert result.success and result.done and result.info["terminated"]
    assert result.num_actions == len(plan) and result.dropped_actions == 1


def test_step_before_reset_raises():
    with pytest.raises(RuntimeError):
        Agent(config()).step("<answer>Left</answer>")


def test_reset_starts_afresh():
    agent = Agent(config())
    agent.reset(seed=0)
    play(agent, agent.oracle_response)
    agent.reset(seed=0)
    assert (agent.turn, agent.actions_used, agent.done, agent.success) == (0, 0, False, False)


def test_prompt_shows_rules_format_and_limits_with_a_custom_separator():
    agent = Agent(config("blocksworldTextAgent", action_separator=";", enable_think=False,
                         system_prompt="", max_actions_per_turn=1))
    messages = agent.reset(seed=0)
    assert [m["role"] for m in messages] == ["user"]  # empty system prompt: no system message
    text = messages[0]["content"]
    assert text.startswith(PRESETS["blocksworldTextAgent"].instructions)
    assert agent.env.unwrapped.rules in text
    assert "Example: <answer>move 2 to 0</answer>" in text and "separated by ';'" in text
    assert "<think>" not in text and "up to 1 actions" in text
    reply = agent.oracle_response()
    assert "<think>" not in reply
    assert agent.step(reply).format_ok


@pytest.mark.parametrize("rng", [np.random.default_rng(0), random.Random(0)])
@pytest.mark.parametrize("name", ONE_PER_GAME)
def test_random_and_oracle_replies_are_well_formed(name, rng):
    agent = Agent(PRESETS[name])
    agent.reset(seed=0)  # the seed other tests use: no extra TextWorld game to generate
    legal = set(agent.env.unwrapped.valid_actions())
    c = agent.config
    for reply in (agent.random_response(rng), agent.oracle_response()):
        parsed = parse_response(reply, enable_think=c.enable_think, separator=c.action_separator,
                                max_actions=c.max_actions_per_turn)
        assert parsed.format_ok and parsed.dropped_actions == 0
        assert 1 <= len(parsed.actions) <= c.max_actions_per_turn
    assert set(parse_response(agent.random_response(rng), enable_think=c.enable_think,
                              separator=c.action_separator, max_actions=9).actions) <= legal
    agent.close()


# -- plain answers (Bandit) ------------------------------------------------------------------------
PLAIN_BANDIT = {
    "game": "Bandit", "env_kwargs": {"arms": ["the", "of", "and"], "golden_arm": "of"},
    "answer_format": "plain", "enable_think": False, "max_turns": 1,
    "max_actions_per_turn": 1, "max_actions_all_turns": 1,
}


def plain_bandit(**changes) -> Agent:
    return Agent(agent_presets_from_dict({"plainBandit": {**PLAIN_BANDIT, **changes}})
                 ["plainBandit"])


def test_plain_prompt_shows_a_plain_example_and_no_tags():
    agent = plain_bandit()
    text = agent.reset(seed=0)[-1]["content"]
    assert "Pick one arm: the, of, and" in text and agent.env.unwrapped.rules in text
    assert "Example: A" in text and "one action" in text
    assert "<answer>" not in text and "<think>" not in text


@pytest.mark.parametrize("reply", ["of", " Of\n", "OF"])
def test_plain_reply_that_is_just_the_arm_wins(reply):
    agent = plain_bandit()
    agent.reset(seed=0)
    result = agent.step(reply)
    assert result.format_ok and result.success and result.done and result.reward == 1.0
    assert result.info["actions"] == [reply.strip()]


def test_plain_oracle_and_random_replies_are_plain_and_play():
    agent = plain_bandit()
    agent.reset(seed=5)
    oracle = agent.oracle_response()
    assert oracle == "of"
    result = agent.step(oracle)
    assert result.success and result.reward == 1.0 and result.messages == []
    rng = random.Random(0)
    pulls = set()
    for seed in range(30):
        agent.reset(seed=seed)
        reply = agent.random_response(rng)
        assert "<" not in reply
        result = agent.step(reply)
        assert result.format_ok and result.num_valid_actions == 1 and result.done
        assert result.reward == float(reply == "of")
        pulls.add(reply)
    assert pulls == {"the", "of", "and"}


def test_plain_other_arm_pays_zero_and_empty_reply_costs_the_penalty():
    agent = plain_bandit(format_penalty=-0.5)
    agent.reset(seed=0)
    other = agent.step("and")
    assert other.format_ok and not other.success and other.reward == 0.0 and other.done
    agent.reset(seed=0)
    empty = agent.step("   ")
    assert not empty.format_ok and empty.reward == -0.5 and empty.done
    assert empty.info["format_error"] == "empty reply: no action"
    assert agent.env.unwrapped.num_steps == 0


def test_tagged_bandit_agent_reads_tags_and_plain_agent_does_not():
    reply = "<answer>of</answer>"
    tagged = Agent(config("banditAgent", env_kwargs=PLAIN_BANDIT["env_kwargs"]))
    tagged.reset(seed=0)
    assert tagged.step(reply).success
    plain = plain_bandit()
    plain.reset(seed=0)
    result = plain.step(reply)
    assert result.format_ok and not result.success and result.num_valid_actions == 0


@pytest.mark.parametrize("changes, words", [
    ({"answer_format": "xml"}, ["'plainBandit'", "answer_format='xml'", "['tagged', 'plain']"]),
    ({"answer_format": None}, ["answer_format=None", "['tagged', 'plain']"]),
    ({"enable_think": True}, ["'plainBandit'", "enable_think=True", "answer_format='plain'"]),
])
def test_answer_format_is_validated(changes, words):
    with pytest.raises(ValueError) as error:
        plain_bandit(**changes)
    assert all(word in str(error.value) for word in words), str(error.value)


def test_format_credit_grades_malformed_replies_below_every_well_formed_turn():
    """With ``format_credit`` a reply that wrote more of the tags earns more, and the best
    malformed reply still earns less than the worst well-formed turn; without it both pay the
    flat penalty."""
    replies = ["move it", "<answer>move 1 to 0", "<answer></answer>"]

    def rewards(credit: bool) -> list[float]:
        agent = Agent(config("tightBlocksworldTurnsAgent", format_credit=credit))
        out = []
        for reply in replies:
            agent.reset(seed=3)
            out.append(agent.step(reply).reward)
        agent.reset(seed=3)
        worst = agent.step("<answer>not a move</answer>")   # well-formed: the game's worst text
        assert worst.format_ok and worst.reward == config(
            "tightBlocksworldTurnsAgent").worst_turn_reward(agent.env.unwrapped.worst_action_reward)
        assert all(r < worst.reward for r in out)
        return out

    flat, graded = rewards(False), rewards(True)
    assert len(set(flat)) == 1
    assert graded[0] == flat[0] and graded[0] < graded[1] < graded[2]


def test_format_credit_gives_no_credit_where_the_penalty_is_above_the_worst_turn():
    agent = Agent(config("tightBlocksworldTurnsAgent", format_credit=True, format_penalty=-0.5))
    agent.reset(seed=0)
    assert agent.step("<answer>").reward == -0.5
