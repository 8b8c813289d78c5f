"""Demonstrations for a supervised warm start: the oracle plays through the RL episode code.

    trajectories = await play_demonstrations(presets, tokenizer, seeds, max_context_tokens=2048,
                                             max_new_tokens=128, random_action_share=0.2, seed=0)
    messages = demonstration_messages(config, seed)   # the same play as a chat (verl's SFT data)

**Same ids as RL.** A demonstration is a :func:`run_episode` call whose ``llm`` is a
:class:`ScriptedReplies`: on each turn it writes the game's oracle reply
(``Agent.oracle_response()``: the next actions of the oracle's plan, in the preset's answer
format, with a short templated reason when the preset thinks), tokenized by the model's own
tokenizer and closed by the chat template's end-of-turn token, as a model that stops would
close it. Everything else (chat template, observation suffixes, masks, context window, reply
limit) is the rollout's, so SFT trains on exactly the token layout PPO later samples from.

**Recoveries.** With ``random_action_share`` > 0 each turn is, with that probability, a random
legal reply instead (``Agent.random_response``). The game moves off the oracle's path and the
oracle replans from the new state on the next turn, so the demonstrations show recoveries.
A random turn stays in the episode (the model sees it in its context) but is not learned: its
``response_mask`` is set to 0. An episode with a random turn that ends unsolved is dropped
(a random move can make a game unsolvable, and the oracle's later replies are then a fallback
move, not a solution); pure oracle episodes are always kept.

**A flawed teacher.** With ``flawed_first_move`` the first turn's reply is one legal move
drawn uniformly (:func:`flawed_reply`, written as the oracle writes its replies), and it IS
learned: its tokens keep ``response_mask`` 1, so the warm start imitates a teacher whose
opening is random. The oracle then plays on from the board that move left. Every such episode
is kept, won or lost: dropping the losses would keep mostly the harmless openings and hide the
flaw (PPO's task in ``scripts/bench/flawed_teacher.py`` is to unlearn it). With both options,
the random turns of ``random_action_share`` come after the first and are handled as above.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.agents import Agent, AgentConfig, format_response
from agentrl.agents.agent import ORACLE_THINK
from agentrl.models.templates import end_of_turn_ids
from agentrl.rollout.batch import turn_values_on_tokens
from agentrl.rollout.episode import ChatSuffix, run_episode
from agentrl.rollout.records import Trajectory

__all__ = ["DEMO_SEED_OFFSET", "ScriptedReplies", "choose_reply", "demonstration_chats",
           "demonstration_messages", "demonstration_seeds", "flawed_reply", "play_demonstrations",
           "scripted_reply_ids"]

DEMO_SEED_OFFSET = 500_000
"""Demonstrations play training seeds from here on past the run's first PPO game: half the
training range away from the seeds PPO's steps play (:func:`agentrl.envs.splits.train_seeds`)."""


def demonstration_seeds(count: int, seed: int) -> list[int]:
    """The training seeds of ``count`` demonstrations of the run with seed ``seed`` (the same
    for both backends): consecutive seeds from ``DEMO_SEED_OFFSET`` past the run's first PPO
    game, wrapping around inside the training range. Demonstration ``i``'s seed depends only on
    ``(seed, i)``: another run seed plays other games, a resumed run the same ones."""
    from agentrl.envs.splits import SEED_RANGES, train_seeds

    train = SEED_RANGES["train"]
    start = train_seeds(1, 1, seed)[0] - train.start + DEMO_SEED_OFFSET
    return [train[(start + i) % len(train)] for i in range(count)]


def choose_reply(agent: Agent, rng: random.Random, random_action_share: float,
                 flawed: bool = False) -> tuple[str, bool]:
    """This turn's demonstration reply and whether it is a random one (not to be learned);
    ``flawed``: the flawed teacher's opening (:func:`flawed_reply`, learned)."""
    if flawed:
        return flawed_reply(agent, rng), False
    if random_action_share > 0 and rng.random() < random_action_share:
        return agent.random_response(rng), True
    return agent.oracle_response(), False


def flawed_reply(agent: Agent, rng: random.Random) -> str:
    """One of this turn's legal moves (``agent.answer_grammar().actions``), drawn uniformly,
    in the reply the oracle would write for it (its think text where the preset thinks): the
    move is the only thing that tells a flawed teacher's reply from the oracle's."""
    legal = agent.answer_grammar().actions
    config = agent.config
    return format_response([legal[rng.randrange(len(legal))]],
                           separator=config.action_separator,
                           think=ORACLE_THINK if config.enable_think else None,
                           answer_format=config.answer_format)


class ScriptedReplies:
    """An ``llm`` for :func:`run_episode` that answers with :func:`choose_reply`'s text.

    One per episode (it reads its agent's game state). ``random_turns`` records, per turn,
    whether the reply was a random one. ``flawed_first_move``: the first reply is
    :func:`flawed_reply`'s (learned). Log-probs are 0.0: nothing sampled them.
    """

    def __init__(self, agent: Agent, tokenizer: Any, rng: random.Random,
                 random_action_share: float = 0.0, flawed_first_move: bool = False):
        self.agent = agent
        self.tokenizer = tokenizer
        self.rng = rng
        self.random_action_share = random_action_share
        self.flawed_first_move = flawed_first_move
        self.end_of_turn_id = end_of_turn_ids(tokenizer)[0]
        self.random_turns: list[bool] = []

    async def generate(self, prompt_ids: Sequence[int], sampling: Any
                       ) -> tuple[list[int], list[float]]:
        text, is_random = choose_reply(self.agent, self.rng, self.random_action_share,
                                       flawed=self.flawed_first_move and not self.random_turns)
        self.random_turns.append(is_random)
        ids = scripted_reply_ids(text, self.tokenizer, sampling.max_new_tokens,
                                 self.end_of_turn_id)
        return ids, [0.0] * len(ids)


def scripted_reply_ids(text: str, tokenizer: Any, max_new_tokens: int,
                       end_of_turn_id: int | None = None) -> list[int]:
    """The ids a model that writes ``text`` and stops would generate: ``text`` tokenized, closed
    by the chat template's end-of-turn token, cut at ``max_new_tokens`` as a model's reply is."""
    if end_of_turn_id is None:
        end_of_turn_id = end_of_turn_ids(tokenizer)[0]
    ids = list(tokenizer.encode(text, add_special_tokens=False)) + [end_of_turn_id]
    return ids[:max_new_tokens]


def unlearned_turns(trajectory: Trajectory, turns: Sequence[bool]) -> Trajectory:
    """``trajectory`` with ``response_mask`` 0 on the replies of the turns flagged in ``turns``."""
    kept = turn_values_on_tokens(trajectory, [0.0 if flagged else 1.0 for flagged in turns], 1.0)
    return dataclasses.replace(trajectory, response_mask=[
        int(model * keep) for model, keep in zip(trajectory.response_mask, kept)])


async def play_demonstrations(
    presets: Sequence[tuple[str, AgentConfig]],
    tokenizer: Any,
    seeds: Sequence[int],
    *,
    max_context_tokens: int,
    max_new_tokens: int,
    random_action_share: float = 0.0,
    flawed_first_move: bool = False,
    seed: int = 0,
    on_episode_done: Callable[[Trajectory], None] | None = None,
) -> list[Trajectory]:
    """One demonstration per seed: episode ``i`` plays ``presets[i % len(presets)]`` on
    ``seeds[i]``. Returns the kept trajectories (see the module docstring), in seed order;
    ``flawed_first_move``: each opens with a learned random legal move."""
    if not presets:
        raise ValueError("no presets given")
    if not 0 <= random_action_share <= 1:
        raise ValueError(f"random_action_share must be in [0, 1], got {random_action_share}")
    from agentrl.engines import SamplingParams

    sampling = SamplingParams(greedy=True, max_new_tokens=max_new_tokens)
    suffix = ChatSuffix(tokenizer)
    agents = {name: Agent(config) for name, config in presets}
    kept = []
    try:
        for index, game_seed in enumerate(seeds):
            name, _ = presets[index % len(presets)]
            agent = agents[name]
            llm = ScriptedReplies(agent, tokenizer, random.Random(seed * 1_000_003 + game_seed),
                                  random_action_share, flawed_first_move)
            trajectory = await run_episode(agent, int(game_seed), llm, tokenizer, sampling,
                                           max_context_tokens=max_context_tokens,
                                           group_index=index, preset=name, suffix=suffix)
            if on_episode_done is not None:
                on_episode_done(trajectory)
            if any(llm.random_turns):
                if not trajectory.success:
                    continue
                trajectory = unlearned_turns(trajectory, llm.random_turns)
            if any(trajectory.response_mask):  # else every reply was a random one
                kept.append(trajectory)
    finally:
        for agent in agents.values():
            agent.close()
    return kept


def demonstration_messages(config: AgentConfig, seed: int, *, random_action_share: float = 0.0,
                           flawed_first_move: bool = False, rng_seed: int = 0
                           ) -> tuple[list[dict], bool]:
    """The demonstration of ``seed`` as chat messages (system, user, assistant, user, ...,
    assistant: the last reply ends it) and whether it used a random turn; the text of the
    episode :func:`play_demonstrations` plays with the same settings. One chat: a preset
    whose turns are fresh chats (``context: state``) has :func:`demonstration_chats`."""
    chats, used_random = demonstration_chats(config, seed, random_action_share=random_action_share,
                                             flawed_first_move=flawed_first_move,
                                             rng_seed=rng_seed)
    if len(chats) > 1:
        raise ValueError(f"context={config.context!r} makes a chat a turn; allowed here: "
                         "context 'history' (demonstration_chats gives one chat a turn)")
    return chats[0], used_random


def demonstration_chats(config: AgentConfig, seed: int, *, random_action_share: float = 0.0,
                        flawed_first_move: bool = False, rng_seed: int = 0
                        ) -> tuple[list[list[dict]], bool]:
    """The demonstration of ``seed`` as the chats its replies answer, each ending with its
    reply: one chat (the whole episode) for ``context: history``, one a turn for ``context:
    state`` (:meth:`Agent.next_chat`); and whether it used a random turn."""
    rng = random.Random(rng_seed * 1_000_003 + seed)
    with Agent(config) as agent:
        chats = [agent.reset(seed=seed)]
        used_random = False
        first = True
        while not agent.done:
            text, is_random = choose_reply(agent, rng, random_action_share,
                                           flawed=flawed_first_move and first)
            first = False
            used_random = used_random or is_random
            result = agent.step(text)
            chats[-1] = [*chats[-1], {"role": "assistant", "content": text}]
            if result.fresh:
                chats.append(list(result.messages))
            else:
                chats[-1] += result.messages
        return chats, used_random
