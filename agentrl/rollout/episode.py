"""One episode, token-in/token-out: ``async run_episode(agent, seed, llm, tokenizer, sampling)``.

    from agentrl.rollout import run_episode
    trajectory = await run_episode(Agent(config), seed, llm, tokenizer, SamplingParams(),
                                   max_context_tokens=4096)

``llm`` is anything with ``async generate(prompt_ids, sampling) -> (response_ids, logprobs)``
(:class:`agentrl.engines.BatchingLLM`, or an adapter over verl's server manager).

**Token-in/token-out.** The episode is one growing list of token ids, and every ``generate`` call
gets exactly that list:

1. The first prompt is ``tokenizer.apply_chat_template(messages, add_generation_prompt=True)``.
2. The model's ids are appended as returned (mask 1, their log-probs).
3. The next observation is appended as the *chat-template suffix* of the new user message
   (mask 0, log-prob 0.0): :class:`ChatSuffix` renders a fixed synthetic conversation that ends
   with an assistant reply, renders it again with the new messages and the generation prompt,
   and tokenizes only the text after the reply's end-of-turn token. That suffix holds whatever
   the template writes between turns (ChatML's ``\\n`` after ``<|im_end|>``, Llama 3's trimmed
   headers) and the next ``<|im_start|>assistant\\n``. Earlier turns are never re-rendered or
   re-tokenized, so token boundaries and log-probs stay exactly as sampled. This is the scheme of
   verl 0.9.1's continuous-token builder (``utils/tokenizer/continuous_token.py``); we implement
   the suffix diff here in a small class because verl's builder is chosen by
   ``hf_config.model_type`` and wired into its AgentLoop, while ours must work on any HF
   tokenizer without a model config.

**Rules.**

- *End of a reply*: a reply that ends on any end-of-sequence id (``end_of_turn_ids(tokenizer)``
  and the ``llm``'s own ``eos_token_ids`` when it has them: the model's generation config,
  e.g. Qwen2.5's ``<|im_end|>`` and ``<|endoftext|>``) is finished; all of them are stop ids.
- *Reply cut by the length limit* (no end-of-sequence id at its end): the rollout appends the
  template's end-of-turn token (``end_of_turn_ids(tokenizer)[0]``) with mask 0 and log-prob 0.0,
  so the next observation never glues onto an unfinished reply; counted in
  ``Turn.truncated_by_length`` and ``metrics["truncated_turns"]``. The model is not trained to
  emit that token (it did not), and the reply text still goes to ``agent.step`` (usually a
  format error, since ``</answer>`` is missing).
- *Context over budget* (drop the oldest turns, keep the instructions): a turn is generated
  from ``prompt_ids + response_ids[window_start:]``. The response is a chain of *turn blocks*,
  each a reply (with its closing token) followed by the observation suffix after it, so the
  chat stays well formed whichever blocks are left out. Before each generation, while
  ``len(context) + max_new_tokens > max_context_tokens`` and more than one block is in the
  context, the oldest block leaves it (``window_start`` moves to the next block). The first
  prompt (system prompt, instructions, rules, initial state) is always kept, and so is the
  newest block (the last reply and the current state). Blocks are dropped as token spans:
  nothing is re-rendered or re-tokenized. The trajectory still stores the whole episode (every
  token, with its mask), and each reply's ``Turn.context_start`` says which window it was
  sampled from: the batch (:func:`agentrl.rollout.batch.context_samples`) makes one training
  row per window, so every reply is trained on the context it was sampled from. Counted per episode in ``metrics["dropped_turns"]`` (blocks left
  out of the context at the end) and ``metrics["context_truncated"]`` (1 when any was). When
  even the first prompt + the newest block + ``max_new_tokens`` do not fit, the episode ends
  there (``metrics["context_exhausted"] = 1``) and the observation that did not fit is not kept. ``AgentConfig.history_window = K`` uses the
  same mechanism: at most the last K blocks are in the context.
- *Fresh chat each turn* (``AgentConfig.context: state``): after turn 1, the observation
  appended after a reply is the next turn's whole opening chat (``Agent.step``'s fresh
  ``TurnResult.messages`` through the chat template, with the generation prompt: the same ids
  :meth:`ChatSuffix.first_prompt` gives turn 1), and that turn is generated from it alone:
  ``response_ids[context_start:]``, without the first prompt (``Turn.fresh_context``). The
  trajectory still holds every token in order; each reply is one row, whose prompt is its
  own turn's chat (:func:`agentrl.rollout.batch.context_samples`). A turn whose chat and
  ``max_new_tokens`` do not fit ``max_context_tokens`` ends the episode as above.
- ``max_new_tokens`` per reply is ``min(sampling.max_new_tokens, config.max_response_tokens)``;
  the end-of-sequence ids are added to ``stop_token_ids``.
- *Constrained actions* (``sampling.constrained_actions``): each turn's request carries
  ``answer_grammar=agent.answer_grammar()`` (this turn's valid actions in the preset's answer
  format); the engine masks its logits to it and returns each token's mask
  (``Generation.token_masks``), stored in ``Turn.token_masks`` and
  ``Trajectory.response_token_masks`` for the trainer's recompute. An ``llm`` that returns
  no masks leaves them None.
- *Features* (``sampling.return_features``): the engine's last hidden state before each
  generated token (``Generation.features``) goes to ``Trajectory.response_features`` (None on
  inserted tokens), so a critic on the actor's backbone reads the rollout's own pass.
- Environment steps of a game whose ``GameSpec.slow_steps`` is set (TextWorld's interpreter) run
  in a worker thread (``asyncio.to_thread``), so they never hold up other episodes' generation
  requests; the other games step in microseconds, less than the thread hop costs. Resets run
  on the event loop before the first ``await``: in a group they then run one after another in
  gather order, so the first member generates the game and the others reuse it.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import time
from typing import Any, Protocol, Sequence

from agentrl.agents import Agent
from agentrl.models.templates import end_of_turn_ids
from agentrl.rollout.records import Trajectory, Turn, turn_counts

__all__ = ["LLM", "ChatSuffix", "run_episode"]

_SYNTHETIC_PREFIX = [
    {"role": "system", "content": "agentrl synthetic system"},
    {"role": "user", "content": "agentrl synthetic user"},
]
_SENTINEL = "agentrl-synthetic-assistant-reply"
MAX_REMEMBERED_OPENINGS = 4096


class LLM(Protocol):
    async def generate(self, prompt_ids: Sequence[int], sampling: Any) -> tuple[list[int], list[float]]:
        ...


class ChatSuffix:
    """Token ids a chat template appends after a finished assistant turn.

    ``ChatSuffix(tokenizer)(messages)`` = the ids of the text the template writes after the
    assistant reply's end-of-turn token when ``messages`` follow it, up to and including the next
    generation prompt. The reply itself is a synthetic one, so the suffix does not depend on (and
    never re-tokenizes) the real history.
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.end_of_turn_id = end_of_turn_ids(tokenizer)[0]
        prefix = _SYNTHETIC_PREFIX + [{"role": "assistant", "content": _SENTINEL}]
        self._prefix = prefix
        text = self._render(prefix, generation_prompt=False)
        eot_text = tokenizer.decode([self.end_of_turn_id])
        after = text.split(_SENTINEL, 1)[1] if _SENTINEL in text else ""
        if not after.startswith(eot_text):
            raise ValueError(
                f"the chat template does not close an assistant turn with {eot_text!r} right "
                f"after its content (got {after[:40]!r}); token-in/token-out needs that")
        self._prefix_text = text[: text.index(_SENTINEL) + len(_SENTINEL) + len(eot_text)]
        self._openings: dict[tuple, list[int]] = {}

    def _render(self, messages: list[dict], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=False)

    def first_prompt(self, messages: list[dict]) -> list[int]:
        """:func:`first_prompt_ids`, remembered: the members of a group open with the same
        messages, so the template is rendered once per group."""
        key = tuple((m.get("role"), m.get("content")) for m in messages)
        ids = self._openings.get(key)
        if ids is None:
            if len(self._openings) >= MAX_REMEMBERED_OPENINGS:
                self._openings.clear()
            ids = self._openings[key] = first_prompt_ids(self.tokenizer, messages)
        return list(ids)

    def __call__(self, messages: list[dict]) -> list[int]:
        text = self._render(self._prefix + list(messages), generation_prompt=True)
        if not text.startswith(self._prefix_text):
            raise ValueError("the chat template re-renders earlier turns when messages are "
                             "appended; token-in/token-out cannot diff it")
        suffix = text[len(self._prefix_text):]
        return list(self.tokenizer.encode(suffix, add_special_tokens=False))


def _window_start(block_starts: list[int], current: int, history_window: int,
                  spare: int) -> int:
    """Start of the context window in the response. The oldest turn blocks are dropped until
    the window fits (a window starting at ``start`` fits when ``start >= -spare``), at most
    ``history_window`` blocks stay (0 = no limit), and the newest block always stays."""
    kept = [b for b in block_starts if b >= current]
    while len(kept) > 1 and (kept[0] < -spare or 0 < history_window < len(kept)):
        kept.pop(0)
    return kept[0] if kept else current


def _user_text(messages: list[dict]) -> str:
    """The newest user message's text (what a turn's record shows as its observation)."""
    users = [m.get("content") for m in messages if m.get("role") == "user"]
    return str(users[-1]) if users else ""


def first_prompt_ids(tokenizer: Any, messages: list[dict]) -> list[int]:
    """The opening chat with the generation prompt, as ids."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    return [int(t) for t in ids]


async def run_episode(
    agent: Agent,
    seed: int,
    llm: LLM,
    tokenizer: Any,
    sampling: Any,
    *,
    max_context_tokens: int,
    group_index: int = 0,
    preset: str | None = None,
    suffix: ChatSuffix | None = None,
    goal_distances: bool = False,
    branches: int = 0,
) -> Trajectory:
    """Play one episode of ``agent`` on game ``seed``; see the module docstring for the rules.

    ``sampling`` is a :class:`agentrl.engines.SamplingParams` (any frozen dataclass with
    ``max_new_tokens`` and ``stop_token_ids`` works). ``suffix`` may be shared between episodes
    of one tokenizer (it is stateless after construction). ``goal_distances``: record the
    oracle's remaining actions before the first turn and after each (``agent.goal_distance()``,
    a search per turn) in ``Trajectory.goal_distances``, for distance shaping. ``branches``
    (K): sample K more replies at every turn's context, each played one action on a copy of
    the game (its reward, and its distances with ``goal_distances``), in
    ``Trajectory.turn_branches``; the episode goes on with the first reply.
    """
    if branches < 0:
        raise ValueError(f"branches must be >= 0, got {branches}")
    config = agent.config
    name = preset or getattr(config, "name", None) or config.game
    identity = (name, seed, group_index)  # the episode's, on its turns' one-turn samples too
    suffix = suffix or ChatSuffix(tokenizer)
    # every end-of-sequence id of the template, the tokenizer and the engine ends a reply
    stop_ids = list(dict.fromkeys([*end_of_turn_ids(tokenizer),
                                   *(int(t) for t in getattr(llm, "eos_token_ids", ()))]))
    max_new = min(sampling.max_new_tokens, config.max_response_tokens)
    sampling = dataclasses.replace(
        sampling, max_new_tokens=max_new,
        stop_token_ids=tuple(dict.fromkeys([*sampling.stop_token_ids, *stop_ids])))
    timings = {"generate_s": 0.0, "env_s": 0.0, "tokenize_s": 0.0}

    start = time.perf_counter()
    messages = agent.reset(seed=seed)
    distances = [agent.goal_distance()] if goal_distances else None
    timings["env_s"] += time.perf_counter() - start
    start = time.perf_counter()
    prompt_ids = suffix.first_prompt(messages)
    timings["tokenize_s"] += time.perf_counter() - start
    if len(prompt_ids) + max_new > max_context_tokens:
        raise ValueError(f"the first prompt ({len(prompt_ids)} tokens) + max_new_tokens "
                         f"({max_new}) exceeds max_context_tokens={max_context_tokens}")

    response_ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    token_masks: list[Any] = []  # the engine's per-token constraint (None where free)
    features: list[Any] = []  # the engine's last hidden state before each token (or None)
    constrained = bool(getattr(sampling, "constrained_actions", False))
    turns: list[Turn] = []
    branch_samples: list[list[Trajectory]] = []  # per turn, with branches > 0
    turn_ends: list[int] = []
    block_starts: list[int] = []  # where each turn block (reply + next observation) begins
    window_start = 0  # context = prompt_ids + response_ids[window_start:]
    next_prompt = list(prompt_ids)
    observation = _user_text(messages)
    context_exhausted = False
    reply_end = 0
    fresh = False  # this turn's context is its own chat, without the first prompt
    while True:
        if fresh:
            window_start = reply_end  # where this turn's chat begins
        else:
            needed = len(prompt_ids) + len(response_ids) + max_new  # with the whole response
            window_start = _window_start(block_starts, window_start, config.history_window,
                                         spare=max_context_tokens - needed)
        opening = [] if fresh else prompt_ids
        if len(opening) + len(response_ids) - window_start + max_new > max_context_tokens:
            context_exhausted = True  # the observation that does not fit is not kept
            del response_ids[reply_end:], mask[reply_end:], logprobs[reply_end:]
            del token_masks[reply_end:], features[reply_end:]
            break
        state = agent.observation  # the board this reply acts on
        start = time.perf_counter()
        request = (dataclasses.replace(sampling, answer_grammar=agent.answer_grammar())
                   if constrained else sampling)
        context = opening + response_ids[window_start:]
        generations = await asyncio.gather(*(llm.generate(context, request)
                                             for _ in range(1 + branches)))
        timings["generate_s"] += time.perf_counter() - start
        reply = _Reply.read(generations[0], stop_ids)
        ids, lps, turn_masks, cut = reply.ids, reply.logprobs, reply.token_masks, reply.cut
        block_starts.append(len(response_ids))
        response_ids += ids
        mask += [1] * len(ids)
        logprobs += lps
        token_masks += turn_masks
        features += reply.features if reply.features is not None else [None] * len(ids)
        turn_ends.append(len(response_ids) - 1)
        if cut:  # closed by the rollout, not by the model: mask 0
            response_ids.append(suffix.end_of_turn_id)
            mask.append(0)
            logprobs.append(0.0)
            token_masks.append(None)
            features.append(None)

        start = time.perf_counter()
        others = [(_Reply.read(g, stop_ids), _copy_agent(agent)) for g in generations[1:]]
        text = tokenizer.decode(ids, skip_special_tokens=True)
        result = await _step(agent, text)
        if distances is not None:
            distances.append(agent.goal_distance())
        turn = _turn(reply, result, text, prompt_ids=next_prompt, context_start=window_start,
                     fresh_context=fresh, observation=observation, state=state)
        turns.append(turn)
        if branches:
            here = distances[-2:] if distances is not None else None
            samples = [_one_turn(identity, reply, dataclasses.replace(
                turn, prompt_ids=tuple(context), context_start=0, fresh_context=False),
                context, here,
                agent.success, suffix.end_of_turn_id)]
            for other, twin in others:
                samples.append(await _branch(identity, other, twin, tokenizer, context,
                                             observation, state, here, suffix.end_of_turn_id))
            branch_samples.append(samples)
        timings["env_s"] += time.perf_counter() - start
        if result.done:
            break
        start = time.perf_counter()
        fresh = bool(getattr(result, "fresh", False))
        next_prompt = (suffix.first_prompt(result.messages) if fresh
                       else suffix(result.messages))
        observation = _user_text(result.messages)
        timings["tokenize_s"] += time.perf_counter() - start
        reply_end = len(response_ids)
        response_ids += next_prompt
        mask += [0] * len(next_prompt)
        logprobs += [0.0] * len(next_prompt)
        token_masks += [None] * len(next_prompt)
        features += [None] * len(next_prompt)

    # A length-cut final reply keeps its closing token: it is part of the sequence verl pads.
    rewards = [t.reward for t in turns]
    metrics = {
        **turn_counts(turns),
        "dropped_turns": float(sum(1 for b in block_starts if b < window_start)),
        "context_truncated": float(window_start > 0 or context_exhausted),
        "context_exhausted": float(context_exhausted),
        "response_length": float(sum(mask)),
    }
    return Trajectory(
        preset=name, seed=seed,
        group_index=group_index, prompt_ids=prompt_ids, response_ids=response_ids,
        response_mask=mask, response_logprobs=logprobs, turn_end_positions=turn_ends,
        turn_rewards=rewards, success=bool(agent.success), episode_return=float(sum(rewards)),
        num_turns=len(turns), turns=turns, metrics=metrics, timings=timings,
        response_token_masks=(token_masks if any(m is not None for m in token_masks)
                              else None),
        response_features=features if any(f is not None for f in features) else None,
        goal_distances=distances, turn_branches=branch_samples if branches else None)


@dataclasses.dataclass(frozen=True)
class _Reply:
    """One generation, checked: its ids, log-probs, per-token constraints (None where free),
    features (None when the engine returns none), and whether the length limit cut it."""
    ids: list[int]
    logprobs: list[float]
    token_masks: tuple
    features: list[Any] | None
    cut: bool

    @classmethod
    def read(cls, generated: Any, stop_ids: Sequence[int]) -> _Reply:
        ids, lps = generated
        ids, lps = [int(t) for t in ids], [float(x) for x in lps]
        if len(ids) != len(lps) or not ids:
            raise ValueError(f"llm.generate returned {len(ids)} ids and {len(lps)} logprobs")
        masks = getattr(generated, "token_masks", None)
        features = getattr(generated, "features", None)
        if features is not None and len(features) != len(ids):
            raise ValueError(f"llm.generate returned {len(features)} features for "
                             f"{len(ids)} ids")
        return cls(ids, lps, tuple(masks) if masks is not None else (None,) * len(ids),
                   list(features) if features is not None else None, ids[-1] not in stop_ids)


async def _step(agent: Agent, text: str) -> Any:
    """``agent.step(text)``, in a worker thread for a game whose steps are slow."""
    if agent.spec.slow_steps:
        return await asyncio.to_thread(agent.step, text)
    return agent.step(text)


def _copy_agent(agent: Agent) -> Agent:
    """The agent and its game as they stand, to play one reply on without touching them."""
    try:
        return copy.deepcopy(agent)
    except Exception as error:  # an interpreter process or a handle that does not copy
        raise ValueError(f"branches > 0 needs a game whose state copies; {agent.config.game} "
                         f"does not ({type(error).__name__}: {error})") from error


def _turn(reply: _Reply, result: Any, text: str, *, prompt_ids: Sequence[int],
          context_start: int, observation: str, state: str, fresh_context: bool = False) -> Turn:
    masks = reply.token_masks
    return Turn(
        prompt_ids=tuple(prompt_ids), response_ids=tuple(reply.ids),
        logprobs=tuple(reply.logprobs), reward=float(result.reward), format_ok=result.format_ok,
        num_actions=result.num_actions, num_valid=result.num_valid_actions,
        num_effective=result.num_effective_actions, truncated_by_length=reply.cut, text=text,
        context_start=context_start, fresh_context=fresh_context, observation=observation,
        state=state,
        actions=tuple(result.info.get("actions", ())),
        action_valid=tuple(result.info.get("action_valid", ())),
        format_progress=float(result.info.get("format_progress", float(result.format_ok))),
        token_masks=masks if any(m is not None for m in masks) else None)


async def _branch(identity: tuple[str, int, int], reply: _Reply, twin: Agent, tokenizer: Any,
                  context: list[int], observation: str, state: str, distances: list | None,
                  end_of_turn_id: int) -> Trajectory:
    """A reply the episode did not take, played one action on ``twin`` (a copy of the game)."""
    try:
        text = tokenizer.decode(reply.ids, skip_special_tokens=True)
        result = await _step(twin, text)
        after = [distances[0], twin.goal_distance()] if distances is not None else None
        turn = _turn(reply, result, text, prompt_ids=context, context_start=0,
                     observation=observation, state=state)
        return _one_turn(identity, reply, turn, context, after, twin.success, end_of_turn_id)
    finally:
        twin.close()


def _one_turn(identity: tuple[str, int, int], reply: _Reply, turn: Turn, context: list[int],
              distances: list | None, success: bool, end_of_turn_id: int) -> Trajectory:
    """A reply and its context as a one-turn trajectory (the trainer's row for it), with the
    episode's ``(preset, seed, group_index)``."""
    preset, seed, group_index = identity
    closing = [end_of_turn_id] if reply.cut else []
    features = (reply.features + [None] * len(closing)) if reply.features is not None else None
    masks = list(reply.token_masks) + [None] * len(closing)
    return Trajectory(
        preset=preset, seed=seed, group_index=group_index, prompt_ids=list(context),
        response_ids=reply.ids + closing, response_mask=[1] * len(reply.ids) + [0] * len(closing),
        response_logprobs=reply.logprobs + [0.0] * len(closing),
        turn_end_positions=[len(reply.ids) - 1], turn_rewards=[turn.reward], success=success,
        episode_return=turn.reward, num_turns=1, turns=[turn], metrics=turn_counts([turn]),
        response_token_masks=masks if any(m is not None for m in masks) else None,
        response_features=features, goal_distances=list(distances) if distances else None)
