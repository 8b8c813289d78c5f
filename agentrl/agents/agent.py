"""One agent for every game: game state in, chat messages out; model reply in, env steps out.

    >>> from agentrl.agents import Agent, load_agent_presets
    >>> agent = Agent(load_agent_presets()["simpleSokobanAgent"])
    >>> messages = agent.reset(seed=0)               # system + first user message
    >>> result = agent.step(agent.oracle_response())  # any reply text, e.g. a model's
    >>> messages += [{"role": "assistant", "content": "..."}, *result.messages]

An episode, turn by turn:

1. ``reset(seed)``: the system prompt, then one user message with the preset's instructions,
   the game's ``rules``, the answer format, the limits and the initial state.
2. ``step(reply)``: the reply is parsed (:mod:`agentrl.agents.parsing`).
   - Bad format (by the preset's ``answer_format``): reward = ``Agent.format_penalty`` (the
     preset's number, or with ``auto`` one derived from the game's ``worst_action_reward``:
     below any well-formed turn; with ``format_credit``, raised by the share of the format's
     tags the reply wrote, still below), no env step, the turn is used up.
   - Good format: at most ``max_actions_per_turn`` actions (the rest are dropped), and no more
     than the actions left of ``max_actions_all_turns``, run in order until the game ends.
     Reward = the sum of the env's rewards for them. Invalid actions are the game's business
     (its own penalty) and are counted, not rejected here.
   - The episode ends when the game terminates or truncates, after ``max_turns`` replies, or
     when the all-turns action budget is spent. Otherwise ``TurnResult.messages`` holds the
     next user message: what happened and the reward, the turn and actions left, the new state.
   The caller appends its own assistant message (or response tokens) before those: ``step``
   never repeats the reply back.
``history_window`` is applied by the rollout, on the episode's token spans
(:func:`agentrl.rollout.run_episode`), not here.

**Context** (``AgentConfig.context``). ``history`` is the growing chat above. ``state``: every
turn is a fresh chat: ``TurnResult.messages`` is the whole opening rebuilt for the new state
(the system prompt, then one user message with the instructions, the rules and the state,
its heading naming the turns left), and it *replaces* the chat (``TurnResult.fresh`` says so):
no earlier reply and no feedback reach the model. ``Agent.next_chat`` applies either rule.
**Rules text** (``AgentConfig.rules``): ``full`` opens with the game's rules, the answer
format with an example and the limits; ``brief`` with the game's ``brief_rules`` and a
one-line answer example (the turns left are in every state's heading).

Games differ only by data: ``GAME_SPECS`` (format examples, how the state is labelled). The
game's own text (``rules``, observations) comes from the env.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import gymnasium
import numpy as np

from agentrl.agents.config import AgentConfig
from agentrl.agents.grammar import AnswerGrammar
from agentrl.agents.parsing import (ParsedResponse, format_progress, format_response,
                                    parse_response)
from agentrl.envs import env_id

MAX_ECHO_CHARS = 60
"""An action quoted back in feedback is cut to this many characters (a model may send junk)."""
ORACLE_THINK = "I follow the known solution."
RANDOM_THINK = "I pick random legal actions."


@dataclass(frozen=True)
class GameSpec:
    """What the agent layer needs to know about a game beyond its env."""

    example_actions: tuple[str, ...]
    """Actions shown in the answer-format example (cut to ``max_actions_per_turn``)."""
    state_label: str
    """Heading put before each observation ('' when the observation carries its own)."""
    slow_steps: bool = False
    """Steps take milliseconds (an interpreter, not a few array ops): the rollout runs them in a
    worker thread so they never stall other episodes' requests."""


GAME_SPECS: dict[str, GameSpec] = {
    "Sokoban": GameSpec(("Right", "Right", "Up"), "Room:"),
    "Tetris": GameSpec(("Left", "Down", "Down"), "Board:"),
    "BlocksWorld": GameSpec(("move 2 to 0", "move 1 to 2"), ""),  # "Current state: ... Goal..."
    "TextWorld": GameSpec(("open box", "take key from box"), "", slow_steps=True),  # "Goal: ..."
    "Bandit": GameSpec(("A",), ""),  # "Pick one arm: A, B"
    "BabyAI": GameSpec(("turn left", "go forward"), ""),  # "Mission: ..., You see ..."
    "TextWorldExpress": GameSpec(("move north", "take coin"), "", slow_steps=True),  # "Task: ..."
}


@dataclass(frozen=True)
class TurnResult:
    """What one reply did. Counts are for this turn only."""

    messages: list[dict]
    """New messages for the next turn, empty when the episode is over: one user message to
    append (``context: history``), or the next turn's whole chat (``context: state``, with
    ``fresh``)."""
    reward: float
    """Sum of the env rewards of the actions run, or for a bad format ``Agent.format_penalty``
    (with ``format_credit``, raised by the reply's ``format_progress``)."""
    done: bool
    """The episode is over: game ended, ``max_turns`` replies, or the action budget spent."""
    success: bool
    """The game was won (so far, in this episode)."""
    format_ok: bool
    """The reply followed the answer format."""
    num_actions: int
    """Actions run in the env this turn."""
    num_valid_actions: int
    """Of those, the ones the game accepted (``action_is_valid``)."""
    num_effective_actions: int
    """Of those, the ones that changed the game state (``action_is_effective``)."""
    dropped_actions: int
    """Actions in the reply that were not run: over the per-turn limit, over the episode's
    budget, or after the game ended."""
    info: dict
    """JSON-able details: ``turn``, ``actions_left``, ``terminated`` (the game itself ended:
    solved or lost, vs. a limit), ``truncated``, ``format_error``, ``actions`` (run),
    ``action_valid`` (one flag per run action), ``invalid_actions``, ``dropped_over_turn_limit``,
    ``episode_return``."""
    fresh: bool = False
    """``messages`` is the next turn's whole chat, which replaces the chat so far
    (``context: state``), not a message to append to it."""


class Agent:
    """Plays one game by a preset's rules; one episode at a time (``reset`` starts the next).

    Attributes: ``config``, ``spec`` (the game's :class:`GameSpec`), ``env`` (the Gymnasium env:
    ``env.unwrapped.oracle_plan()`` and ``valid_actions()`` for scripted policies), and the
    episode's ``turn``, ``actions_used``, ``done``, ``success``, ``episode_return``;
    ``format_penalty`` is the reward of a malformed reply (``config.format_penalty`` resolved;
    with ``config.format_credit`` it is the least such a reply earns).
    """

    def __init__(self, config: AgentConfig):
        self.config = config
        self.spec = GAME_SPECS[config.game]
        self.env = gymnasium.make(env_id(config.game), **config.env_kwargs)
        self.format_penalty = config.format_penalty_for(self.env.unwrapped.worst_action_reward)
        if config.rules == "brief" and not getattr(self.env.unwrapped, "brief_rules", ""):
            self.env.close()
            raise ValueError(f"rules='brief' is not allowed for {config.game}: the game has no "
                             "brief_rules; allowed: 'full'")
        self.turn = 0
        self.actions_used = 0
        self.done = True  # until reset
        self.success = False
        self.episode_return = 0.0
        self._observation = ""

    @property
    def observation(self) -> str:
        """The game's newest text observation (the board), as the env returned it."""
        return self._observation

    @property
    def actions_left(self) -> int:
        return max(0, self.config.max_actions_all_turns - self.actions_used)

    # -- the episode -------------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> list[dict]:
        """Start an episode; returns the chat for turn 1 (system message omitted if empty)."""
        self._observation, _ = self.env.reset(seed=seed)
        self.turn, self.actions_used = 0, 0
        self.done, self.success, self.episode_return = False, False, 0.0
        return self._opening()

    @staticmethod
    def next_chat(messages: list[dict], reply: str, result: TurnResult) -> list[dict]:
        """The chat of the next turn after ``messages`` got ``reply`` and it gave ``result``:
        the chat with the reply and the new user message (``context: history``), or the
        fresh chat alone (``context: state``). Empty ``result.messages``: the episode ended
        (returns the chat with the reply)."""
        if result.fresh:
            return list(result.messages)
        return [*messages, {"role": "assistant", "content": reply}, *result.messages]

    def _opening(self) -> list[dict]:
        """The system prompt (if any) and one user message: instructions, rules, the state."""
        messages = []
        if self.config.system_prompt:
            messages.append({"role": "system", "content": self.config.system_prompt})
        content = f"{self.instructions()}\n\n{self._state_text()}"
        messages.append({"role": "user", "content": content})
        return messages

    def step(self, response_text: Any) -> TurnResult:
        """Apply one model reply (any text; a bad one costs ``self.format_penalty``, less with
        ``format_credit``)."""
        if self.done:
            raise RuntimeError("the episode is over (or never started): call reset() first")
        config = self.config
        self.turn += 1
        parsed = parse_response(response_text, enable_think=config.enable_think,
                                separator=config.action_separator,
                                max_actions=config.max_actions_per_turn,
                                answer_format=config.answer_format)
        to_run = parsed.actions[: self.actions_left] if parsed.format_ok else ()
        run, invalid, flags, reward, valid, effective = [], [], [], 0.0, 0, 0
        terminated = truncated = False
        for action in to_run:
            self._observation, step_reward, terminated, truncated, info = self.env.step(action)
            run.append(action)
            reward += float(step_reward)
            valid += bool(info["action_is_valid"])
            flags.append(bool(info["action_is_valid"]))
            effective += bool(info["action_is_effective"])
            if not info["action_is_valid"]:
                invalid.append(action)
            self.success = self.success or bool(info["success"])
            if terminated or truncated:
                break
        self.actions_used += len(run)
        progress = 1.0 if parsed.format_ok else format_progress(
            response_text, enable_think=config.enable_think, answer_format=config.answer_format)
        if not parsed.format_ok:
            reward = config.malformed_reward(progress, self.env.unwrapped.worst_action_reward)
        self.episode_return += reward
        self.done = (terminated or truncated or self.turn >= config.max_turns
                     or self.actions_left == 0)
        dropped = parsed.dropped_actions + len(parsed.actions) - len(run)
        fresh = config.context == "state"
        if self.done:
            messages = []
        elif fresh:
            messages = self._opening()
        else:
            messages = [{"role": "user", "content": self._feedback(parsed, run, invalid, reward)}]
        info = {
            "turn": self.turn,
            "actions_left": self.actions_left,
            "terminated": bool(terminated),
            "truncated": self.done and not terminated,
            "format_error": parsed.error,
            "format_progress": progress,
            "actions": run,
            "action_valid": flags,
            "invalid_actions": invalid,
            "dropped_over_turn_limit": parsed.dropped_actions,
            "episode_return": self.episode_return,
        }
        return TurnResult(messages=messages, reward=reward, done=self.done, success=self.success,
                          format_ok=parsed.format_ok, num_actions=len(run),
                          num_valid_actions=valid, num_effective_actions=effective,
                          dropped_actions=dropped, info=info, fresh=fresh and not self.done)

    # -- prompt text -------------------------------------------------------------------------------
    def instructions(self) -> str:
        """The fixed part of the first user message: instructions, rules, format, limits
        (``rules: full``), or instructions, the game's brief rules and an answer example
        (``rules: brief``)."""
        config = self.config
        if config.rules == "brief":
            parts = [config.instructions.strip(), self.env.unwrapped.brief_rules.strip(),
                     self._brief_format_text()]
            return "\n".join(part for part in parts if part)
        parts = [config.instructions.strip(), self.env.unwrapped.rules.strip(),
                 self._format_text(), self._limits_text()]
        return "\n\n".join(part for part in parts if part)

    def _brief_format_text(self) -> str:
        """One line: an example reply of the preset's answer format."""
        config = self.config
        examples = self.spec.example_actions[: config.max_actions_per_turn]
        example = format_response(examples, separator=config.action_separator,
                                  think="..." if config.enable_think else None,
                                  answer_format=config.answer_format)
        return f"Answer: {example}"

    def _format_text(self) -> str:
        config = self.config
        examples = self.spec.example_actions[: config.max_actions_per_turn]
        separator = config.action_separator
        if config.answer_format == "plain":
            example = format_response(examples, separator=separator, answer_format="plain")
            what = ("one action" if config.max_actions_per_turn == 1
                    else f"your actions, separated by '{separator}',")
            return (f"Answer format: reply with {what} and nothing else: no tags, no "
                    f"explanation.\nExample: {example}")
        if config.enable_think:
            example = format_response(examples, separator=separator, think="...")
            return ("Answer format: first your reasoning inside <think></think>, then your "
                    f"actions inside <answer></answer>, separated by '{separator}'.\n"
                    f"Example: {example}")
        example = format_response(examples, separator=separator)
        return (f"Answer format: only your actions inside <answer></answer>, separated by "
                f"'{separator}'.\nExample: {example}")

    def _limits_text(self) -> str:
        config = self.config
        credit = (" (a little more for each tag of the format it wrote)"
                  if config.format_credit else "")
        return (f"You have {config.max_turns} turns. Each turn you may give up to "
                f"{config.max_actions_per_turn} actions; the whole game allows "
                f"{config.max_actions_all_turns}. Actions over these limits are ignored. A reply "
                f"that breaks the format gets a reward of {self.format_penalty:+.2f}{credit} "
                f"and no action is taken. Replies are cut off after "
                f"{config.max_response_tokens} tokens.")

    def _state_text(self) -> str:
        config = self.config
        if config.rules == "brief":
            heading = f"Turns left: {config.max_turns - self.turn}."
            if config.max_actions_all_turns < config.max_turns * config.max_actions_per_turn:
                heading += f" Actions left: {self.actions_left}."
        else:
            heading = (f"Turn {self.turn + 1} of {config.max_turns}; "
                       f"{self.actions_left} actions left.")
        label = f"{self.spec.state_label}\n" if self.spec.state_label else ""
        return f"{heading}\n{label}{self._observation}"

    def _feedback(self, parsed: ParsedResponse, run: list[str], invalid: list[str],
                  reward: float) -> str:
        if not parsed.format_ok:
            lines = [f"Your reply broke the answer format ({parsed.error}); no action was taken. "
                     f"Reward: {reward:+.2f}."]
        else:
            lines = [f"You took {len(run)} action(s): {', '.join(map(_echo, run))}. "
                     f"Reward: {reward:+.2f}."]
            if invalid:
                lines.append(f"Invalid, so nothing happened: {', '.join(map(_echo, invalid))}.")
            if parsed.dropped_actions:
                lines.append(f"Ignored {parsed.dropped_actions} action(s) over the limit of "
                             f"{self.config.max_actions_per_turn} a turn.")
        return "\n".join(lines) + "\n\n" + self._state_text()

    # -- scripted policies (oracle and random baselines) -----------------------------------------
    def oracle_response(self) -> str:
        """A well-formed reply with the next actions of the game's oracle plan.

        Falls back to one legal action when the oracle has no plan (lost or unsolvable).
        """
        plan = self.env.unwrapped.oracle_plan() or []
        actions = plan[: self._actions_this_turn()] or self._legal_actions()[:1]
        return self._reply(actions, ORACLE_THINK)

    def goal_distance(self) -> int | None:
        """Actions the game's oracle still needs from here: 0 once won, None where it has no
        plan (a lost game). The potential of distance shaping (``algorithm.distance_shaping``)."""
        if self.success:
            return 0
        plan = self.env.unwrapped.oracle_plan()
        return None if plan is None else len(plan)

    def random_response(self, rng: np.random.Generator | random.Random) -> str:
        """A well-formed reply of 1..limit actions drawn uniformly from the legal ones."""
        legal = self._legal_actions()
        count = 1 + _randint(rng, self._actions_this_turn())
        return self._reply([legal[_randint(rng, len(legal))] for _ in range(count)], RANDOM_THINK)

    def answer_grammar(self) -> AnswerGrammar:
        """This turn's well-formed replies with only valid actions, for constrained decoding:
        the game's ``valid_actions()`` now, at most the actions this turn may run, in the
        preset's answer format (:mod:`agentrl.agents.grammar`). Every action of a reply comes
        from the set valid at the turn's start: in games whose legal moves change as actions
        run (BlocksWorld, TextWorld), a second action may have become invalid by its turn."""
        config = self.config
        plain = config.answer_format == "plain"
        return AnswerGrammar(actions=tuple(self._legal_actions()),
                             separator=f" {config.action_separator} ",
                             max_actions=self._actions_this_turn(),
                             opening="" if plain else "<answer>",
                             closing="" if plain else "</answer>",
                             think=config.enable_think and not plain)

    def _actions_this_turn(self) -> int:
        return max(1, min(self.config.max_actions_per_turn, self.actions_left))

    def _legal_actions(self) -> list[str]:
        return list(self.env.unwrapped.valid_actions()) or list(self.spec.example_actions)

    def _reply(self, actions: list[str], think: str) -> str:
        config = self.config
        return format_response(actions, separator=config.action_separator,
                               think=think if config.enable_think else None,
                               answer_format=config.answer_format)

    def close(self) -> None:
        self.env.close()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _randint(rng: Any, high: int) -> int:
    """Uniform in [0, high) from a numpy Generator or a random.Random."""
    if hasattr(rng, "integers"):
        return int(rng.integers(high))
    return rng.randrange(high)


def _echo(action: str) -> str:
    return action if len(action) <= MAX_ECHO_CHARS else action[: MAX_ECHO_CHARS - 3] + "..."


class AgentWrapper:
    """An :class:`Agent` that ``run_episode`` plays through a wrapper (shown turn by turn, cut by
    a token budget): what an episode reads of the agent, forwarded; ``reset`` and ``step`` are
    the wrapper's to change."""

    def __init__(self, agent: Agent):
        self.agent = agent

    @property
    def config(self) -> AgentConfig:
        return self.agent.config

    @property
    def spec(self) -> GameSpec:
        return self.agent.spec

    @property
    def success(self) -> bool:
        return self.agent.success

    @property
    def observation(self) -> str:
        return self.agent.observation

    def answer_grammar(self) -> AnswerGrammar:
        return self.agent.answer_grammar()

    def goal_distance(self) -> int | None:
        return self.agent.goal_distance()

    def reset(self, seed: int | None = None) -> list[dict]:
        return self.agent.reset(seed=seed)

    def step(self, response_text: Any) -> TurnResult:
        return self.agent.step(response_text)
