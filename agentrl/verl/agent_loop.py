r"""verl AgentLoop ``agentrl_game``: :func:`agentrl.rollout.run_episode` inside verl 0.9.1's rollout.

Plug it into verl's ``main_ppo`` with these overrides (:func:`verl_overrides` returns them)::

    trainer.use_v1=true                  # or false (legacy RayPPOTrainer): always set explicitly
    actor_rollout_ref.model.external_lib=agentrl.verl.agent_loop
    actor_rollout_ref.rollout.agent.default_agent_loop=agentrl_game
    ++actor_rollout_ref.rollout.agent.agent_loop_manager_class=\
        agentrl.verl.agent_loop.GameAgentLoopManager     # V1: agent_loop_v1.GameAgentLoopManagerTQ
    trainer.v1.sampler.custom_sampler.name=GameReplayBuffer  # V1 only: logs the rows (+ path,
                                                             # sampler_kwargs: SAMPLER_KWARGS)

``external_lib`` makes every AgentLoopWorker import this module, whose ``@register`` puts the
loop in verl's registry (rows pick it by ``agent_name``; the default covers rows without one);
the manager class is how the legacy trainer gets per-token rewards (see *Rewards*). Importing
this module imports verl and ray (~15 s on a cold start).

Each task row (:mod:`agentrl.verl.data`) names the loop in ``agent_name`` and carries the game in
``extra_info`` (``preset``, ``seed``, ``agent_config``, ``max_context_tokens``,
``reward_placement``); verl hands every column to :meth:`GameAgentLoop.run`. The loop plays one
episode with verl's server manager as the ``llm`` and returns verl's ``AgentLoopOutput``:

- **Tokens.** ``prompt_ids`` = the episode's first prompt, ``response_ids`` = everything after
  it, exactly as ``run_episode`` stored it (token-in/token-out, never re-tokenized);
  ``response_mask`` 1 only on sampled tokens; ``response_logprobs`` the server's log-probs on
  them and 0.0 elsewhere (``None`` when verl asks for no log-probs). The response ends at the
  last model token: never with an observation.
- **Sampling.** One request id for all turns of an episode (verl's sticky session: the episode
  stays on one server and hits its prefix cache); under ``rollout.full_determinism`` a distinct
  one that every run repeats (:func:`episode_request_id`). Temperature, top-p, top-k and
  ``logprobs`` are verl's (``rollout.*``, or ``rollout.val_kwargs.*`` when validating) and
  never changed per turn, because the actor recomputes log-probs at ``rollout.temperature``; per turn the loop
  sets only ``max_tokens`` and the end-of-turn ``stop_token_ids`` (and, with constrained
  actions, the turn's constraint in ``extra_args``: :mod:`agentrl.verl.constrained`). A reply ending on any
  end-of-sequence id (the template's, the tokenizer's, and every ``eos_token_id`` of the
  model's ``generation_config.json``, on which vLLM also stops: Qwen2.5's ``<|endoftext|>``) is
  finished, not cut.
- **Response budget.** verl's tensors are ``rollout.response_length`` wide and count every
  response token, observations included. The budget is ``min(response_length,
  max_context_tokens - first prompt)``: each reply may use what is left of it, and the episode
  ends (like a turn limit) when the next observation plus one reply token would not fit, as
  verl's ``ToolAgentLoop`` does. So the response always fits and the context never overflows
  (``run_episode``'s drop-oldest-turns rule never fires).
- **Context windows** (a preset with ``history_window > 0`` or ``context: state``, each
  turn a fresh chat: ``AgentConfig.windowed``; V1 trainer only, the legacy one
  refuses the task): older turns leave the context as on the local engine, and the loop
  returns one row per context window (:func:`agentrl.verl.rows.window_outputs`,
  :mod:`agentrl.verl.windows`): each row's prompt is the context its replies were sampled
  from, and its last model token also carries the later rows' rewards, so verl's per-row GAE
  at γ = λ = 1 gives the whole episode's returns. The context is capped so every row fits
  ``prompt_length`` and ``response_length``
  (:func:`~agentrl.verl.windows.windowed_context_tokens`); the cap, not the response budget,
  ends a windowed episode whose newest turn no longer fits.
- **Cut replies.** A reply cut by ``max_tokens`` is closed by ``run_episode`` with a mask-0
  end-of-turn token.
- **Rewards.** verl trains on the whole ``rm_scores`` tensor (V1: ``token_level_scores =
  rm_scores``; legacy: ``extract_reward``), so the loop writes it per token: ``"turn"``
  placement puts each turn's reward on that turn's last model token, ``"last"`` the episode
  return on the last model token. verl itself only places one scalar on the last token, so:
  V1 reads them through :meth:`GameAgentLoopOutput.as_dict`; the legacy trainer through
  :class:`GameAgentLoopWorker` (made by :class:`GameAgentLoopManager`). ``reward_score`` is
  the sum, so verl's reward loop is skipped and validation scores are episode returns.
- **Metrics.** ``extra_fields["reward_extra_info"]`` carries the episode's success, return and
  turns: verl's own validation reports them per preset (``val-aux/<preset>/success/mean@1``)
  beside ``val-core/<preset>/reward`` (the sum of the rewards: the return, validation rows being
  undiscounted). ``extra_fields["agentrl_episode"]`` carries the episode's ``EpisodeOutcome``;
  :class:`GameAgentLoopManager` (V1: :class:`~agentrl.verl.agent_loop_v1.GameReplayBuffer`) logs
  every batch's ``train/<preset>/...`` or ``val/<preset>/...`` metrics under the local engine's
  names, with verl's own (:mod:`agentrl.verl.metrics`). An episode the
  response budget ended counts as ``context_exhausted``, and is flagged
  ``extra_fields["agentrl_truncated"]``; GAE ends it where it was cut, as the local engine and
  V1 do (why: :mod:`agentrl.verl.returns`).
- **Episode records.** ``extra_fields["agentrl_episode_record"]`` carries the episode's record
  (per turn the observation, reply, actions and flags; bounded, about as many characters as the
  episode has tokens); the manager takes that column out of the batch and writes a sample
  (:mod:`agentrl.verl.episodes`), as the local engine does (V1: the replay buffer, from
  TransferQueue).
- **Off the event loop.** Building the agent, its first reset (TextWorld may generate the game:
  ~1-2 s) and the first prompt's tokenization run in a worker thread; members of a group
  wait for one another there, so a game is made once per process. ``run_episode`` runs slow env
  steps in threads itself.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import uuid
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import ray
import torch
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopManager,
    AgentLoopWorker,
    register,
)
from verl.protocol import DataProto
from verl.utils.ray_utils import auto_await

from agentrl.agents import Agent
from agentrl.engines import SamplingParams
from agentrl.engines.constrained import TokenTexts
from agentrl.models.templates import end_of_turn_ids
from agentrl.rollout import ChatSuffix, run_episode
from agentrl.trainers import losses  # noqa: F401  (actor workers: agentrl's policy losses)
from agentrl.verl import AGENT_NAME
from agentrl.verl.constrained import processor_configured
from agentrl.verl.episode_task import (
    BudgetedAgent,
    EpisodeTask,
    ResponseBudget,
    row_index,
)
from agentrl.verl.episodes import LOG_EPISODES_KEY, VerlEpisodeLog
from agentrl.verl.metrics import EpisodeMetricsLog, finish_tracking_after
from agentrl.verl.returns import patch_compute_advantage
from agentrl.verl.rows import (
    EPISODE_INFO,
    EPISODE_RECORD,
    REWARD_EXTRA_KEYS,
    TOKEN_REWARDS,
    GameAgentLoopOutput,
    episode_output,
    window_outputs,
)
from agentrl.verl.server_llm import ServerLLM
from agentrl.verl.windows import windowed_context_tokens

__all__ = [
    "AGENT_NAME", "BudgetedAgent", "EpisodeTask", "GameAgentLoop", "GameAgentLoopManager",
    "GameAgentLoopOutput", "GameAgentLoopWorker", "ResponseBudget", "ServerLLM",
    "episode_output", "episode_request_id", "generation_config", "open_episode",
    "verl_overrides", "window_outputs",
]

V1_MODULE = "agentrl.verl.agent_loop_v1"
"""The V1 trainer's manager and replay buffer (importing it needs TransferQueue)."""
SAMPLER_KWARGS = {"default_local_dir": "trainer.default_local_dir", "logger": "trainer.logger",
                  LOG_EPISODES_KEY: f"trainer.{LOG_EPISODES_KEY}",
                  "n": "actor_rollout_ref.rollout.n",
                  "val_n": "actor_rollout_ref.rollout.val_kwargs.n"}
"""V1's ``trainer.v1.sampler.sampler_kwargs``: what our replay buffer reads, as interpolations
of the verl keys holding it (the replay buffer is not given verl's config)."""


def verl_overrides(use_v1: bool) -> list[str]:
    """The hydra overrides of verl's ``ppo_trainer`` config that run this loop."""
    overrides = [
        f"trainer.use_v1={str(bool(use_v1)).lower()}",
        f"actor_rollout_ref.model.external_lib={__name__}",
        f"actor_rollout_ref.rollout.agent.default_agent_loop={AGENT_NAME}",
    ]
    manager = (f"{__name__}.{GameAgentLoopManager.__qualname__}" if not use_v1
               else f"{V1_MODULE}.GameAgentLoopManagerTQ")  # needs TransferQueue
    overrides.append(f"++actor_rollout_ref.rollout.agent.agent_loop_manager_class={manager}")
    if use_v1:  # V1's rows pass its replay buffer, not the manager: ours logs them
        sampler = "trainer.v1.sampler"
        overrides += [f"{sampler}.custom_sampler.path=pkg://{V1_MODULE}",
                      f"{sampler}.custom_sampler.name=GameReplayBuffer",
                      *(f"++{sampler}.sampler_kwargs.{key}=${{{source}}}"
                        for key, source in SAMPLER_KWARGS.items())]
    return overrides


# -- opening an episode off the event loop ---------------------------------------------------------
_OPENING_LOCKS: dict[tuple, threading.Lock] = {}
_OPENING_LOCKS_GUARD = threading.Lock()
MAX_OPENING_LOCKS = 4096


def _opening_lock(task: EpisodeTask) -> threading.Lock:
    """One lock per game: the members of a group open the same game one after another, so
    the first makes it (TextWorld: generates and compiles it) and the others reuse it."""
    config = task.agent_config
    key = (config.game, json.dumps(config.env_kwargs, sort_keys=True, default=str), task.seed)
    with _OPENING_LOCKS_GUARD:
        if len(_OPENING_LOCKS) >= MAX_OPENING_LOCKS:
            _OPENING_LOCKS.clear()  # only loses the sharing of games being opened right now
        return _OPENING_LOCKS.setdefault(key, threading.Lock())


def open_episode(task: EpisodeTask, suffix: ChatSuffix) -> tuple[Agent, list[dict], list[int]]:
    """Build the agent and reset it on the task's seed (blocking: run it in a thread).
    Returns the agent, the opening messages and the first prompt's ids."""
    agent = Agent(task.agent_config)
    try:
        with _opening_lock(task):
            messages = agent.reset(seed=task.seed)
        return agent, messages, suffix.first_prompt(messages)
    except BaseException:
        agent.close()
        raise


# -- the loop --------------------------------------------------------------------------------------
@lru_cache(maxsize=8)
def generation_config(model_path: str) -> Any:
    """The model folder's ``generation_config.json`` (vLLM stops on every ``eos_token_id`` it
    lists, so a reply ending on one is finished), or None when it has none."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(str(model_path))
    except (OSError, ValueError):
        return None


@lru_cache(maxsize=8)
def logits_width(model_path: str) -> int:
    """The model's logits per token (its text config's ``vocab_size``): vLLM's and the
    trainer's logits rows, which a constrained reply's masks cover."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(model_path))
    return int(config.get_text_config().vocab_size)


def episode_request_id(deterministic: bool, priority: int, row: Mapping[str, Any]) -> str:
    """The request id of every turn of an episode (``row``: the columns verl passes to
    :meth:`GameAgentLoop.run`): random, or under ``rollout.full_determinism``, where verl hands
    it to vLLM unchanged and routes by it, one of its own that every run repeats. The legacy
    trainer's manager numbers a step's episodes in ``priority`` (``det-<priority>``, as verl's
    own loops); V1 passes no priority (0 for every episode: one replica, duplicate ids in
    flight) but the row's ``session_id``, so there the id is the task row's split and index
    (``extra_info``) with the session."""
    if not deterministic:
        return uuid.uuid4().hex
    if "session_id" not in row:
        return f"det-{priority}"
    extra_info = row.get("extra_info")
    index = row_index(extra_info)
    split = extra_info.get("split") if isinstance(extra_info, Mapping) else None
    task = f"{split}-{index}" if index is not None else str(row.get("uid"))
    return f"det-{task}-{row['session_id']}"


@register(AGENT_NAME)
class GameAgentLoop(AgentLoopBase):
    """Plays one game episode per trajectory (verl makes a new instance for each)."""

    async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs
                  ) -> GameAgentLoopOutput | list[GameAgentLoopOutput]:
        windows_allowed = bool(getattr(self.config.trainer, "use_v1", False))
        task = EpisodeTask.from_extra_info(kwargs.get("extra_info"), windows=windows_allowed)
        windowed = task.agent_config.windowed
        rollout = self.rollout_config
        suffix = ChatSuffix(self.tokenizer)
        agent, opening, prompt_ids = await asyncio.to_thread(open_episode, task, suffix)
        try:
            max_new = task.agent_config.max_response_tokens
            budget = ResponseBudget(self._response_budget(task, len(prompt_ids)))
            # room for the whole budget: the budget, not a dropped turn, ends the episode;
            # windowed, the context cap ends it, and every window's row fits verl's tensors
            max_context = len(prompt_ids) + budget.total + max_new
            if windowed:
                budget = ResponseBudget(sys.maxsize)
                max_context = self._windowed_context(task, len(prompt_ids), max_new)
            deterministic = bool(getattr(rollout, "full_determinism", False))
            model_path = self.config.actor_rollout_ref.model.path
            constrained = processor_configured(rollout)
            llm = ServerLLM(self.server_manager, sampling_params, budget,
                            end_of_turn_ids(self.tokenizer, generation_config(model_path)),
                            request_id=episode_request_id(deterministic, priority, kwargs),
                            priority=int(priority),
                            texts=(await asyncio.to_thread(TokenTexts.of, self.tokenizer)
                                   if constrained else None),
                            width=logits_width(model_path) if constrained else 0)
            trajectory = await run_episode(
                BudgetedAgent(agent, task.seed, opening, budget, suffix), task.seed, llm,
                self.tokenizer, SamplingParams(max_new_tokens=max_new,
                                               constrained_actions=constrained),
                max_context_tokens=max_context, preset=task.preset, suffix=suffix)
        finally:
            agent.close()
        if not windowed and len(trajectory.response_ids) != budget.used:
            raise RuntimeError(f"{AGENT_NAME}: the episode's response has "
                               f"{len(trajectory.response_ids)} tokens but its budget counted "
                               f"{budget.used}; run_episode's token rules changed")
        shared = {"reward_placement": task.reward_placement, "turn_gamma": task.turn_gamma,
                  "with_logprobs": bool(sampling_params.get("logprobs")),
                  "server_fields": llm.server_fields, "num_preempted": llm.num_preempted,
                  "index": row_index(kwargs.get("extra_info")),
                  "constraint_violations": llm.constraint_violations}
        if windowed:  # GRPO scores the last row; verl's validation reports the last row's
            extra_info = kwargs.get("extra_info")
            validating = isinstance(extra_info, Mapping) and extra_info.get("split") == "val"
            outcome = validating or self.config.algorithm.adv_estimator == "grpo"
            return window_outputs(trajectory, outcome=outcome, **shared)
        return episode_output(trajectory, response_length=rollout.response_length,
                              budget_exhausted=budget.exhausted, **shared)

    def _windowed_context(self, task: EpisodeTask, prompt_tokens: int, max_new: int) -> int:
        """The context cap of a windowed episode (:func:`windowed_context_tokens`); the first
        prompt and a whole reply must fit it, and verl's advantages must be ones whose per-row
        returns are the episode's (the config rules check this too, but ``verl.overrides``
        are passed on unchecked)."""
        rollout, algorithm = self.rollout_config, self.config.algorithm
        exact = {"algorithm.adv_estimator": (algorithm.adv_estimator, ("gae", "grpo")),
                 "algorithm.lam": (float(algorithm.lam), (1.0,)),
                 "algorithm.gamma": (float(algorithm.gamma), (1.0,)),
                 "algorithm.use_kl_in_reward": (bool(algorithm.use_kl_in_reward), (False,))}
        for key, (value, allowed) in exact.items():  # verl.overrides may bypass the rules
            if value not in allowed:
                raise ValueError(f"{AGENT_NAME}: preset {task.preset!r} has context windows, "
                                 f"and {key}={value!r} would not give the whole episode's "
                                 f"returns over its rows; allowed: {list(allowed)}")
        cap = windowed_context_tokens(prompt_tokens, task.max_context_tokens,
                                      rollout.prompt_length, rollout.response_length, max_new)
        if prompt_tokens + max_new > cap:
            raise ValueError(
                f"{AGENT_NAME}: preset {task.preset!r} seed {task.seed}: the first prompt "
                f"({prompt_tokens} tokens) and a reply of max_response_tokens={max_new} do not "
                f"fit a window's row: rollout.response_length={rollout.response_length} "
                f"(data.max_response_length) must be >= {max_new} and "
                f"extra_info.max_context_tokens={task.max_context_tokens} >= "
                f"{prompt_tokens + max_new}; raise them")
        return cap

    def _response_budget(self, task: EpisodeTask, prompt_tokens: int) -> int:
        """min(response_length, max_context_tokens - first prompt); the first prompt must fit
        ``rollout.prompt_length`` (verl pads to it and never cuts an episode's prompt)."""
        rollout = self.rollout_config
        where = f"{AGENT_NAME}: preset {task.preset!r} seed {task.seed}"
        if prompt_tokens > rollout.prompt_length:
            raise ValueError(f"{where}: the first prompt has {prompt_tokens} tokens > "
                             f"rollout.prompt_length={rollout.prompt_length} "
                             "(data.max_prompt_length); raise it")
        budget = min(rollout.response_length, task.max_context_tokens - prompt_tokens)
        if budget < 1:
            raise ValueError(f"{where}: the first prompt has {prompt_tokens} tokens, which "
                             f"leaves no room in extra_info.max_context_tokens="
                             f"{task.max_context_tokens}")
        return budget


# -- the legacy trainer's rm_scores ----------------------------------------------------------------
class GameAgentLoopWorker(AgentLoopWorker):
    """verl's ``AgentLoopWorker`` for the legacy trainer, with the per-token rewards of our
    trajectories as their ``rm_scores`` rows (verl's own puts ``reward_score`` on the last
    token). Rows of other loops keep verl's."""

    def _postprocess(self, inputs, input_non_tensor_batch=None, validate=False):
        output = super()._postprocess(inputs, input_non_tensor_batch=input_non_tensor_batch,
                                      validate=validate)
        rows = output.non_tensor_batch.get(TOKEN_REWARDS)
        if rows is None or all(row is None for row in rows):
            return output
        mask = output.batch["response_mask"]
        has_scores = "rm_scores" in output.batch.keys()  # noqa: SIM118 - a TensorDict
        scores = (output.batch["rm_scores"] if has_scores
                  else torch.zeros_like(mask, dtype=torch.float32))
        for index, rewards in enumerate(rows):
            if rewards is not None:
                scores[index] = 0.0
                scores[index, :len(rewards)] = torch.tensor(rewards, dtype=torch.float32)
        output.batch["rm_scores"] = scores
        output.meta_info.setdefault("reward_extra_keys", list(REWARD_EXTRA_KEYS))
        return output


class GameAgentLoopManager(AgentLoopManager):
    """verl's ``AgentLoopManager`` running :class:`GameAgentLoopWorker` (legacy trainer; set by
    ``++actor_rollout_ref.rollout.agent.agent_loop_manager_class``). Every batch it returns,
    training or validation, also goes to our metrics log (:mod:`agentrl.verl.metrics`:
    ``train/<preset>/...`` and ``val/<preset>/...``, as on the local engine)."""

    def __init__(self, *args, **kwargs):
        patch_compute_advantage()  # this process (the TaskRunner) runs the trainer's GAE
        self.agent_loop_workers_class = ray.remote(GameAgentLoopWorker)
        super().__init__(*args, **kwargs)
        if processor_configured(self.rollout_config):  # the actor must train on the masks
            from agentrl.verl.masked_engine import check_masked_engine

            check_masked_engine(self.config.actor_rollout_ref.actor.strategy)
        self.episode_metrics = EpisodeMetricsLog.for_verl(self.config)
        self.episode_log = VerlEpisodeLog.for_verl(self.config)
        finish_tracking_after(self.config.trainer.total_training_steps)  # ends without a traceback

    @auto_await
    async def generate_sequences(self, prompts: DataProto) -> DataProto:
        output = await super().generate_sequences(prompts)
        validate = bool(prompts.meta_info.get("validate", False))
        rollout = self.rollout_config
        per_row = int(rollout.val_kwargs.n if validate else rollout.n)
        infos = output.non_tensor_batch.get(EPISODE_INFO)
        self.episode_metrics.log_batch(infos, prompts.meta_info, per_row=per_row)
        self.episode_log.log_batch(output.non_tensor_batch.pop(EPISODE_RECORD, None), infos,
                                   prompts.meta_info, per_row=per_row)
        return output
