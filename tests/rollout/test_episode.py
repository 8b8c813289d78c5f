"""run_episode: token-in/token-out on two chat templates, masks, length cuts, context budget."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from agentrl.agents import Agent, format_response, load_agent_presets
from agentrl.engines import SamplingParams
from agentrl.models import end_of_turn_ids
from agentrl.rollout import ChatSuffix, run_episode, to_batch
from agentrl.rollout.batch import token_rewards

from rollout_fakes import FakeLLM, game_reply

PRESETS = load_agent_presets()
SOKOBAN = PRESETS["simpleSokobanAgent"]
SAMPLING = SamplingParams(max_new_tokens=64)


def play(config, tokenizer, llm, seed=0, max_context_tokens=8192, sampling=SAMPLING):
    with Agent(config) as agent:
        return asyncio.run(run_episode(agent, seed, llm, tokenizer, sampling,
                                       max_context_tokens=max_context_tokens,
                                       preset="simpleSokobanAgent"))


def check_token_in_token_out(traj, llm):
    """Each generate call saw exactly the stored sequence up to that turn; masks mark outputs."""
    full = traj.input_ids
    assert len(llm.calls) == traj.num_turns
    assert llm.calls[0] == traj.prompt_ids
    for k, (seen, out) in enumerate(zip(llm.calls, llm.outputs)):
        assert full[: len(seen)] == seen, f"turn {k}: the LLM saw ids not in the trajectory"
        assert full[len(seen): len(seen) + len(out)] == out
        start = len(seen) - len(traj.prompt_ids)
        assert traj.response_mask[start: start + len(out)] == [1] * len(out)
        assert traj.turn_end_positions[k] == start + len(out) - 1
        assert traj.response_logprobs[start: start + len(out)] == pytest.approx(
            [-0.5 - 0.001 * i for i in range(len(out))])
    assert sum(traj.response_mask) == sum(map(len, llm.outputs))  # 1 exactly on model tokens
    assert all(lp == 0.0 for lp, m in zip(traj.response_logprobs, traj.response_mask) if not m)
    # the turns' own ids rebuild the sequence
    rebuilt = []
    for turn in traj.turns:
        rebuilt += list(turn.prompt_ids) + list(turn.response_ids)
        if turn.truncated_by_length:
            rebuilt.append(end_of_turn_ids(llm.tokenizer)[0])
    assert rebuilt == full


def test_token_in_token_out_matches_chat_template(tokenizer):
    """Two templates: the calls are prefixes of the stored ids, which render as the full chat."""
    llm = FakeLLM(tokenizer, lambda ids, call: game_reply("Sokoban"))
    traj = play(SOKOBAN, tokenizer, llm)
    assert traj.num_turns >= 2
    check_token_in_token_out(traj, llm)
    # The stored ids decode to the template's rendering of the whole chat (what a re-render
    # would give when nothing shifts), up to the template's trailing whitespace.
    with Agent(SOKOBAN) as agent:
        messages = agent.reset(seed=0)
        for turn in traj.turns:
            result = agent.step(turn.text)
            messages += [{"role": "assistant", "content": turn.text}, *result.messages]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    decoded = tokenizer.decode(traj.input_ids)
    assert rendered.startswith(decoded) and rendered[len(decoded):].strip() == ""


def test_observation_suffix_only_has_mask_zero(chatml_tokenizer):
    tok = chatml_tokenizer
    llm = FakeLLM(tok, lambda ids, call: game_reply("Sokoban"))
    traj = play(SOKOBAN, tok, llm)
    second = traj.turns[1]
    assert tok.decode(list(second.prompt_ids)).startswith("\n<|im_start|>user\n")
    assert tok.decode(list(second.prompt_ids)).endswith("<|im_start|>assistant\n")
    assert traj.metrics["truncated_turns"] == 0
    assert traj.metrics["response_length"] == sum(traj.response_mask)


def test_length_cut_turn_is_closed_with_masked_end_of_turn(tokenizer):
    """Turn 1 hits max_new_tokens: an end-of-turn id with mask 0 closes it, counted."""
    llm = FakeLLM(tokenizer, lambda ids, call: game_reply("Sokoban"), close=lambda call: call != 0)
    sampling = SamplingParams(max_new_tokens=40)
    traj = play(SOKOBAN, tokenizer, llm, sampling=sampling)
    check_token_in_token_out(traj, llm)
    first = traj.turns[0]
    assert first.truncated_by_length and not first.format_ok
    assert len(first.response_ids) == 40
    eot_pos = len(first.response_ids)
    assert traj.response_ids[eot_pos] == end_of_turn_ids(tokenizer)[0]
    assert traj.response_mask[eot_pos] == 0 and traj.response_logprobs[eot_pos] == 0.0
    assert traj.turn_end_positions[0] == eot_pos - 1  # the reward sits on a model token
    assert traj.metrics["truncated_turns"] == 1
    assert traj.turn_rewards[0] == Agent(SOKOBAN).format_penalty
    # the cut reply wrote its opening tags only; the closed ones are well-formed
    assert 0 < first.format_progress < 1 and traj.turns[1].format_ok
    assert traj.turns[1].format_progress == 1.0
    assert traj.metrics["format_progress"] == pytest.approx(sum(t.format_progress
                                                                for t in traj.turns))
    # the observation follows the closing token, as the template writes it after a turn
    assert list(traj.response_ids[eot_pos + 1: eot_pos + 1 + len(traj.turns[1].prompt_ids)]) \
        == list(traj.turns[1].prompt_ids)


def test_max_new_tokens_is_capped_by_preset(chatml_tokenizer):
    config = dataclasses.replace(SOKOBAN, max_response_tokens=12)
    llm = FakeLLM(chatml_tokenizer, lambda ids, call: game_reply("Sokoban"), close=lambda c: False)
    traj = play(config, chatml_tokenizer, llm)
    assert all(len(t.response_ids) == 12 for t in traj.turns)
    assert traj.metrics["truncated_turns"] == traj.num_turns


def check_contexts(traj, llm, budget=None, window=None):
    """Turn k saw the first prompt + the stored response from its ``context_start`` on."""
    assert len(llm.calls) == traj.num_turns
    for k, (seen, turn) in enumerate(zip(llm.calls, traj.turns)):
        begin = traj.turn_end_positions[k] - len(turn.response_ids) + 1
        assert seen == traj.prompt_ids + traj.response_ids[turn.context_start: begin]
        if budget is not None:
            assert len(seen) + SAMPLING.max_new_tokens <= budget
        if window is not None and k >= window:  # the reply `window` turns back starts it
            assert turn.context_start == traj.turn_end_positions[k - window] - len(
                traj.turns[k - window].response_ids) + 1


def wandering_reply(ids, call):
    """Moves that never solve a 6x6 room on their own: the episode uses all its turns."""
    return format_response(["Left", "Right"][call % 2:][:1], separator="||", think="go")


def test_context_budget_drops_oldest_turns_and_goes_on(chatml_tokenizer):
    tok = chatml_tokenizer
    full = play(SOKOBAN, tok, FakeLLM(tok, wandering_reply))
    assert full.num_turns >= 3 and full.metrics["context_truncated"] == 0
    block = len(full.response_ids) // full.num_turns
    budget = len(full.prompt_ids) + 2 * block + SAMPLING.max_new_tokens
    llm = FakeLLM(tok, wandering_reply)
    cut = play(SOKOBAN, tok, llm, max_context_tokens=budget)
    assert cut.num_turns == full.num_turns and cut.response_ids == full.response_ids
    assert cut.response_mask == full.response_mask
    assert cut.metrics["context_truncated"] == 1 and cut.metrics["dropped_turns"] >= 1
    assert cut.metrics["context_exhausted"] == 0
    assert cut.turns[-1].context_start > 0
    check_contexts(cut, llm, budget=budget)


def test_history_window_keeps_the_last_turns(chatml_tokenizer):
    tok = chatml_tokenizer
    config = dataclasses.replace(SOKOBAN, history_window=1)
    llm = FakeLLM(tok, wandering_reply)
    traj = play(config, tok, llm)
    assert traj.num_turns >= 3 and traj.metrics["dropped_turns"] == traj.num_turns - 2
    check_contexts(traj, llm, window=1)


def test_context_exhausted_ends_episode_without_dangling_observation(chatml_tokenizer):
    tok = chatml_tokenizer
    full = play(SOKOBAN, tok, FakeLLM(tok, wandering_reply))
    budget = len(full.prompt_ids) + len(full.turns[0].response_ids) + SAMPLING.max_new_tokens + 5
    cut = play(SOKOBAN, tok, FakeLLM(tok, wandering_reply), max_context_tokens=budget)
    assert cut.num_turns == 1 and cut.metrics["context_exhausted"] == 1
    assert cut.response_ids == list(full.turns[0].response_ids)  # no dangling observation
    with pytest.raises(ValueError, match="max_context_tokens"):
        play(SOKOBAN, tok, FakeLLM(tok, lambda ids, call: ""), max_context_tokens=10)


def test_turn_rewards_land_on_turn_ends_in_batch(tokenizer):
    llm = FakeLLM(tokenizer, lambda ids, call: game_reply("Sokoban") if call else "junk")
    traj = play(SOKOBAN, tokenizer, llm)
    assert traj.turn_rewards[0] == Agent(SOKOBAN).format_penalty
    batch = to_batch([traj], pad_token_id=0, reward_placement="turn")
    rewards = batch["token_level_rewards"][0]
    for pos, reward in zip(traj.turn_end_positions, traj.turn_rewards):
        assert rewards[pos].item() == pytest.approx(reward)
        assert batch["response_mask"][0, pos] == 1
    assert rewards.sum().item() == pytest.approx(traj.episode_return)


def test_chat_suffix_rejects_templates_that_rewrite_history(chatml_tokenizer):
    class Weird:
        """A template that puts text between an assistant reply and its end-of-turn token."""

        def __init__(self, tok):
            self.tok = tok

        def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=False):
            return "".join(f"{m['content']} END<|im_end|>" for m in messages)

        def __getattr__(self, name):
            return getattr(self.tok, name)

    with pytest.raises(ValueError, match="close an assistant turn"):
        ChatSuffix(Weird(chatml_tokenizer))


def test_goal_distances_follow_the_oracle_and_shaping_lands_on_each_turn(chatml_tokenizer):
    """The oracle's moves close one action of distance each; a legal move the wrong way opens
    some. Shaped turn rewards carry exactly those differences, and only when asked."""
    from agentrl.envs.blocksworld import BlocksWorldEnv
    from agentrl.rollout import distance_shaping

    config = dataclasses.replace(PRESETS["tightBlocksworldTurnsAgent"], max_turns=6)
    with Agent(config) as agent:  # find a game whose first oracle move has a legal alternative
        agent.reset(seed=3)
        env: BlocksWorldEnv = agent.env.unwrapped
        first = env.oracle_plan()[0]
        detour = next(a for a in env.valid_actions() if a != first)

    def reply(ids, call):  # turn 1: a detour; then the oracle from wherever it stands
        with Agent(config) as probe:
            probe.reset(seed=3)
            if call == 0:
                return format_response([detour], separator=",", think=None,
                                       answer_format=config.answer_format)
            for past in replies:
                probe.step(past)
            return probe.oracle_response()

    replies: list[str] = []

    def recording(ids, call):
        text = reply(ids, call)
        replies.append(text)
        return text

    with Agent(config) as agent:
        traj = asyncio.run(run_episode(agent, 3, FakeLLM(chatml_tokenizer, recording),
                                       chatml_tokenizer, SAMPLING, max_context_tokens=8192,
                                       goal_distances=True))
        start = Agent(config)
        start.reset(seed=3)
        d0 = start.goal_distance()
    distances = traj.goal_distances
    assert traj.success and distances[0] == d0 and distances[-1] == 0
    assert len(distances) == traj.num_turns + 1
    assert distances[1] >= distances[0]  # the detour brought the goal no nearer
    assert all(b - a == -1 for a, b in zip(distances[1:], distances[2:]))  # oracle: one a move
    shaped = distance_shaping([traj], weight=0.5)[0]
    assert shaped.turn_shaping == pytest.approx(
        [0.5 * (a - b) for a, b in zip(distances, distances[1:])])
    assert shaped.turn_shaping[0] <= 0 < shaped.turn_shaping[1]
    rewards = token_rewards(shaped, "turn")  # the whole episode (the batch cuts it in windows)
    for pos, reward, extra in zip(traj.turn_end_positions, traj.turn_rewards,
                                  shaped.turn_shaping):
        assert rewards[pos] == pytest.approx(reward + extra)
    assert shaped.episode_return == traj.episode_return  # metrics never see the shaping
    unasked = play(SOKOBAN, chatml_tokenizer, FakeLLM(chatml_tokenizer,
                                                       lambda ids, call: game_reply("Sokoban")))
    assert unasked.goal_distances is None
    with pytest.raises(ValueError, match="goal_distances=True"):
        distance_shaping([unasked], weight=1.0)


def test_turn_branches_play_other_replies_on_copies_of_the_game(chatml_tokenizer):
    """``branches=2``: every turn samples two more replies at the same context; each is played
    one action on a copy of the game (a detour: no nearer the goal) while the episode goes on
    with the first reply (the oracle's) exactly as without branches."""
    from agentrl.rollout import branch_metrics, turn_samples

    config = dataclasses.replace(PRESETS["tightBlocksworldTurnsAgent"], max_turns=6)
    executed: list[str] = []  # the first reply of each turn: the one the episode plays

    def reply(ids, call):  # calls 3k, 3k+1, 3k+2 are turn k's three replies
        with Agent(config) as probe:
            probe.reset(seed=3)
            for past in executed[:call // 3]:
                probe.step(past)
            env = probe.env.unwrapped
            if call % 3 == 0:
                executed.append(probe.oracle_response())
                return executed[-1]
            move = next(a for a in env.valid_actions() if a != env.oracle_plan()[0])
            return format_response([move], separator=",", think=None,
                                   answer_format=config.answer_format)

    llm = FakeLLM(chatml_tokenizer, reply)
    with Agent(config) as agent:
        traj = asyncio.run(run_episode(agent, 3, llm, chatml_tokenizer, SAMPLING,
                                       max_context_tokens=8192, goal_distances=True,
                                       branches=2, preset="blocks", group_index=5))
    assert traj.success and len(traj.turn_branches) == traj.num_turns
    assert len(llm.calls) == 3 * traj.num_turns
    for k, samples in enumerate(traj.turn_branches):
        context = llm.calls[3 * k]
        assert [s.prompt_ids for s in samples] == [context] * 3  # the context sampled from
        assert llm.calls[3 * k + 1] == llm.calls[3 * k + 2] == context
        taken, *others = samples
        assert taken.turns[0].text == traj.turns[k].text  # the executed reply comes first
        assert taken.response_ids[:len(traj.turns[k].response_ids)] == list(
            traj.turns[k].response_ids)
        assert taken.goal_distances == traj.goal_distances[k:k + 2]
        before = traj.goal_distances[k]
        assert taken.goal_distances[1] == before - 1  # the oracle's move
        for other in others:
            assert other.goal_distances[0] == before and other.goal_distances[1] >= before
            assert other.num_turns == 1 and other.turn_rewards == [other.episode_return]
            assert (other.preset, other.seed, other.group_index) == ("blocks", 3, 5)
    samples = turn_samples([traj])
    assert len(samples) == 3 * traj.num_turns
    assert [s.group_index for s in samples] == [k for k in range(traj.num_turns) for _ in "abc"]
    metrics = branch_metrics(samples)
    assert metrics["branch/turns"] == traj.num_turns and metrics["branch/spread"] == 1.0
    with pytest.raises(ValueError, match="branches > 0"):
        turn_samples([dataclasses.replace(traj, turn_branches=None)])


def test_branches_leave_the_episode_as_it_was(chatml_tokenizer):
    """The same replies with and without branches: the same episode, token for token."""
    config = PRESETS["tightBlocksworldTurnsAgent"]
    reply = lambda ids, call: format_response(  # noqa: E731
        ["move 1 to 0"], separator=",", think=None, answer_format=config.answer_format)
    runs = []
    for branches in (0, 2):
        with Agent(config) as agent:
            runs.append(asyncio.run(run_episode(
                agent, 7, FakeLLM(chatml_tokenizer, reply), chatml_tokenizer, SAMPLING,
                max_context_tokens=8192, branches=branches)))
    plain, branched = runs
    assert plain.turn_branches is None and len(branched.turn_branches) == branched.num_turns
    assert branched.response_ids == plain.response_ids
    assert branched.turn_rewards == plain.turn_rewards and branched.success == plain.success
    with pytest.raises(ValueError, match="branches must be >= 0"):
        with Agent(config) as agent:
            asyncio.run(run_episode(agent, 7, FakeLLM(chatml_tokenizer, reply),
                                    chatml_tokenizer, SAMPLING, max_context_tokens=8192,
                                    branches=-1))
