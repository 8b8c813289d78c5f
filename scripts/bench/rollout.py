"""Rollout scheduling: episodes/s of ``run_groups`` vs. a per-turn barrier, on a simulated LLM.

    python scripts/bench/rollout.py                        # ~30 s on 2 CPU cores
    python scripts/bench/rollout.py --ms-per-token 20 --base-ms 30 --think-dist uniform
    python scripts/bench/rollout.py --presets simpleSokobanAgent textworldEasyAgent
    python scripts/bench/rollout.py --embedded             # + the real model, batch 1 vs 16 (slow)
    python scripts/bench/rollout.py --jump-forward         # real episodes, step by step vs jump

What runs: ``--groups x --group-size`` episodes (128 by default) over a mix of presets with
unequal episode lengths (Sokoban ends after 6 turns or 10 actions, Tetris and BlocksWorld after
11 turns or 20-40 actions, or when the game ends), played twice in one process, one mode after
the other:

- **ours**: ``agentrl.rollout.run_groups``: every episode is its own task; the model serves each
  request on its own, as a continuous-batching server (vLLM) does, and an episode that finishes
  early frees its slot at once.
- **barrier**: the per-turn lockstep loop of frameworks that batch by turn: every live
  episode's prompt goes to the model as one batch, the batch returns when its longest reply is
  done, then every environment steps. It uses the same ``Agent``, ``ChatSuffix`` and tokenizer,
  and the same token-in/token-out context.

**The simulated model** (:class:`SimulatedLLM`) sleeps ``--base-ms + --ms-per-token x reply
tokens`` with ``asyncio.sleep`` and returns real token ids of a well-formed reply: a think block
of random single-token words (length drawn from ``--think-dist`` with mean
``--mean-think-tokens``: replies in RL rollouts are long-tailed, ``exponential`` models that,
``uniform`` on [0, 2 x mean] is the gentler case), then 1-5 random actions from the game's
vocabulary, then the end-of-turn id. The ids are concatenated pre-tokenized pieces, so the model
costs next to no CPU. A reply depends only on the prompt ids and on how many earlier requests
had the same prompt (the k-th gets variant k), so both modes play the same episodes whatever
order requests arrive in: each group's system prompt carries its group number, which makes a
prompt name its episode's state (Tetris boards repeat across seeds, and the seed decides the
next pieces); members of a group that reach the same prompt are in the same state, so which of
them gets which variant does not change the set of episodes. The run checks that both modes
played the same (group, turns, reply tokens) episodes.

**Measured**: (a) episodes/s of each mode and their ratio (target >= 1.5); the *ideal* ratio is
that of the simulated model time alone. (b) Framework overhead of ours: wall time minus the
critical path of simulated model time (the longest per-episode sum of latencies; for the
barrier, the sum of the per-turn batch latencies) minus the simulated model's own CPU time, as
a share of wall time (target <= 5%); and the process's CPU time over wall time. That overhead is
CPU work that does not grow with the model's time: the start (envs made, games reset and first
prompts rendered one after another before the last episode sends its first request: ``start s``)
and about a millisecond a turn (env step, decode, chat-template suffix), so its share shrinks as
``--ms-per-token`` grows towards a real server's per-sequence time at batch 128 (the 2 ms
default keeps the run short). Games are generated once before timing (a warm reset per group),
so neither mode pays one-off generation. (c) ``--embedded``: tokens/s of the
embedded model on CPU at batch 1 vs 16, with ``scripts/bench/generate.py``'s prompts and timing.

**Jump-forward** (``--jump-forward``, instead of the above): real episodes of ``--jf-preset``
(the default preset, ``tightBlocksworldTurnsAgent``) through ``run_groups`` with ``--jf-model``
(the embedded model) under constrained decoding, at ``--temperature`` (1.0, as training
samples), decoded twice with the same seeds and engine settings as a training step (batch 16,
the prefix cache): step by step (``jump_forward=False``) and with jump-forward (the tokens the
grammar forces appended without a decode step of their own), and a third time with the masked
head too (a constrained row's logits only for its allowed ids). An untimed group warms up first,
and each mode starts with empty mask caches. Reported per mode: decode steps (batched
forward passes after the prefills) and rollout seconds, per episode, and the reductions
(targets: >= 40% fewer decode steps, >= 30% less rollout time).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import platform
import random
import statistics
import time
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any

import agentrl  # noqa: F401  (first: OpenMP's passive waiting is set before torch loads it)
import torch

from agentrl.agents import Agent, AgentConfig, load_agent_presets
from agentrl.cli.bench import script_module, write_result
from agentrl.engines import BatchingLLM, SamplingParams
from agentrl.engines.constrained import TokenTexts
from agentrl.envs.sokoban import MOVES
from agentrl.envs.tetris import ACTIONS as TETRIS_ACTIONS
from agentrl.models import end_of_turn_ids, load_model, load_tokenizer
from agentrl.rollout import ChatSuffix, Trajectory, first_prompt_ids, run_groups

DEFAULT_PRESETS = ("simpleSokobanAgent", "tetrisType1Agent", "blocksworldTextAgent")
GAME_ACTIONS: dict[str, tuple[str, ...]] = {
    "Sokoban": tuple(MOVES),
    "Tetris": TETRIS_ACTIONS,
    "BlocksWorld": tuple(f"move {x} to {y}" for x in range(1, 5) for y in range(5) if x != y),
    "TextWorld": ("look", "inventory", "go north", "go south", "go east", "go west", "open box",
                  "take key from box"),
}
"""Actions a reply picks from; legal-looking, not always legal (the game counts invalid ones)."""
THINK_WORDS = ("the", "box", "is", "left", "of", "target", "so", "I", "push", "it", "up", "then",
               "right", "down", "wall", "block", "row", "piece", "goal", "next", "check", "state",
               "move", "plan", "clear", "stack", "table", "first", "last", "keep")
"""Think-block filler; only the words that are one token (with a leading space) are used."""
GAME_SCAN_TOKENS = 512
"""The game is found by its rules header (``Sokoban:``...) in this many leading prompt tokens."""
GAME_KEY_TOKENS = 128
"""Prompts that share this many leading tokens (system prompt with the group number, start of
the instructions) are taken to be of the same game: the header is searched once per group."""
MAX_ACTIONS_PER_REPLY = 5
LOGPROB = -0.5
THINK_DISTS = ("exponential", "uniform")
TARGET_SPEEDUP = 1.5
TARGET_OVERHEAD = 0.05
JUMP_PRESET = "tightBlocksworldTurnsAgent"
TARGET_FEWER_STEPS = 0.40
TARGET_LESS_TIME = 0.30
ENGINE_SETTINGS = {"max_batch": 16, "prefix_cache_tokens": 65536}
OUTPUT = script_module(Path(__file__).parent / "output" / "rollout.py")
"""The tables (scripts/bench/output/rollout.py)."""
"""The training rollout's engine settings (configs/base.yaml ``rollout``)."""
JUMP_MODES = {"step_by_step": {"jump_forward": False, "masked_head": False},
              "jump_forward": {"jump_forward": True, "masked_head": False},
              "jump_forward_masked_head": {"jump_forward": True, "masked_head": True}}
"""``--jump-forward``'s engines: as before, jump-forward alone, and with the masked head."""
Pairs = Sequence[tuple[str, AgentConfig]]
"""One (preset name, config) per group, as ``run_groups`` takes them."""


@dataclasses.dataclass(frozen=True)
class Latency:
    """Simulated generation time of one reply: ``base_ms + ms_per_token x tokens``."""

    base_ms: float
    ms_per_token: float

    def seconds(self, tokens: int) -> float:
        return (self.base_ms + self.ms_per_token * tokens) / 1000


class SimulatedLLM:
    """A model server that answers with real reply token ids after a token-proportional delay.

    ``generate`` serves one request (concurrent requests do not slow each other, as with
    continuous batching); ``generate_batch`` serves a batch that returns when its longest reply
    is done. ``slept_s`` sums the delays slept; ``compute_s`` is the CPU time spent building
    replies (the simulated model's own cost, not the framework's); ``request_times`` holds the
    ``perf_counter`` of each request (each batch).
    """

    def __init__(self, tokenizer: Any, latency: Latency, mean_think_tokens: float,
                 think_dist: str = "exponential", seed: int = 0):
        if think_dist not in THINK_DISTS:
            raise ValueError(f"unknown think_dist {think_dist!r}; allowed: {THINK_DISTS}")
        self.latency, self.mean_think, self.think_dist, self.seed = (
            latency, mean_think_tokens, think_dist, seed)
        self.tokenizer = tokenizer
        self.end_of_turn_id = end_of_turn_ids(tokenizer)[0]

        def encode(text: str) -> list[int]:
            return list(tokenizer.encode(text, add_special_tokens=False))

        self._think_words = [ids[0] for ids in map(encode, (" " + w for w in THINK_WORDS))
                             if len(ids) == 1]
        if not self._think_words:
            raise ValueError("no think word is a single token for this tokenizer")
        self._open = encode("<think>")
        self._middle = encode("</think><answer>")
        self._close = encode("</answer>")
        self._separator = encode(" || ")
        self._actions = {game: [encode(action) for action in actions]
                         for game, actions in GAME_ACTIONS.items()}
        self._games: dict[int, str] = {}
        self._seen: dict[int, int] = {}
        self.slept_s = 0.0
        self.compute_s = 0.0
        self.request_times: list[float] = []

    def reply(self, prompt_ids: Sequence[int], sampling: Any) -> list[int]:
        """The reply ids for this prompt (the k-th request with this prompt gets variant k)."""
        start = time.perf_counter()
        key = hash(tuple(prompt_ids))
        variant = self._seen.get(key, 0)
        self._seen[key] = variant + 1
        rng = random.Random(hash((self.seed, key, variant)))
        actions = self._actions[self._game(prompt_ids)]
        count = 1 + rng.randrange(MAX_ACTIONS_PER_REPLY)
        body: list[int] = []
        for i in range(count):
            body += (self._separator if i else []) + actions[rng.randrange(len(actions))]
        think = [rng.choice(self._think_words) for _ in range(self._think_length(rng))]
        ids = [*self._open, *think, *self._middle, *body, *self._close, self.end_of_turn_id]
        if len(ids) > sampling.max_new_tokens:
            ids = ids[: sampling.max_new_tokens]  # cut by the length limit: no end-of-turn id
        self.compute_s += time.perf_counter() - start
        return ids

    def _think_length(self, rng: random.Random) -> int:
        if self.mean_think <= 0:
            return 0
        if self.think_dist == "uniform":
            return rng.randint(0, round(2 * self.mean_think))
        return int(rng.expovariate(1 / self.mean_think))

    def _game(self, prompt_ids: Sequence[int]) -> str:
        key = hash(tuple(prompt_ids[:GAME_KEY_TOKENS]))
        if key not in self._games:
            text = self.tokenizer.decode(prompt_ids[:GAME_SCAN_TOKENS])
            found = {text.find(f"{game}:"): game for game in GAME_ACTIONS if f"{game}:" in text}
            if not found:
                raise ValueError(f"no rules header ({', '.join(g + ':' for g in GAME_ACTIONS)}) "
                                 f"in the first {GAME_SCAN_TOKENS} prompt tokens")
            self._games[key] = found[min(found)]
        return self._games[key]

    async def generate(self, prompt_ids: Sequence[int],
                       sampling: Any) -> tuple[list[int], list[float]]:
        self.request_times.append(time.perf_counter())
        ids = self.reply(prompt_ids, sampling)
        delay = self.latency.seconds(len(ids))
        self.slept_s += delay
        await asyncio.sleep(delay)
        return ids, [LOGPROB] * len(ids)

    async def generate_batch(self, requests: Sequence[tuple[Sequence[int], Any]]
                             ) -> list[tuple[list[int], list[float]]]:
        self.request_times.append(time.perf_counter())
        replies = [self.reply(prompt, sampling) for prompt, sampling in requests]
        delay = max(self.latency.seconds(len(ids)) for ids in replies)
        self.slept_s += delay
        await asyncio.sleep(delay)
        return [(ids, [LOGPROB] * len(ids)) for ids in replies]


# -- the two schedulers ----------------------------------------------------------------------------


@dataclasses.dataclass
class LockstepEpisode:
    """One episode of the barrier baseline: its agent and its growing token context."""

    agent: Agent
    group_index: int
    sampling: Any
    context: list[int]
    turns: int = 0
    reply_tokens: int = 0
    done: bool = False


async def run_lockstep(pairs: Pairs, seeds: Sequence[int],
                       group_size: int, llm: SimulatedLLM, tokenizer: Any, sampling: Any,
                       max_context_tokens: int) -> list[LockstepEpisode]:
    """The per-turn barrier: all live episodes generate as one batch, then all envs step."""
    suffix = ChatSuffix(tokenizer)
    stop_ids = tuple(end_of_turn_ids(tokenizer))
    episodes = []
    for g, seed in enumerate(seeds):
        config = pairs[g % len(pairs)][1]
        turn_sampling = dataclasses.replace(
            sampling, max_new_tokens=min(sampling.max_new_tokens, config.max_response_tokens),
            stop_token_ids=stop_ids)
        for _ in range(group_size):
            agent = Agent(config)
            prompt = first_prompt_ids(tokenizer, agent.reset(seed=seed))
            episodes.append(LockstepEpisode(agent, g, turn_sampling, prompt))
    try:
        live = episodes
        while live:
            replies = await llm.generate_batch([(e.context, e.sampling) for e in live])
            for episode, (ids, _) in zip(live, replies):
                _advance(episode, ids, tokenizer, suffix, max_context_tokens)
            live = [e for e in live if not e.done]
    finally:
        for episode in episodes:
            episode.agent.close()
    return episodes


def _advance(episode: LockstepEpisode, ids: list[int], tokenizer: Any, suffix: ChatSuffix,
             max_context_tokens: int) -> None:
    """Append one reply, step the game, append the next observation (as ``run_episode`` does)."""
    episode.turns += 1
    episode.reply_tokens += len(ids)
    cut = ids[-1] not in episode.sampling.stop_token_ids
    episode.context += [*ids, suffix.end_of_turn_id] if cut else ids
    result = episode.agent.step(tokenizer.decode(ids, skip_special_tokens=True))
    if result.done:
        episode.done = True
        return
    if result.fresh:  # context: state: the next turn is its own chat
        episode.context = suffix.first_prompt(result.messages)
    else:
        episode.context += suffix(result.messages)
    if len(episode.context) + episode.sampling.max_new_tokens > max_context_tokens:
        raise ValueError(f"an episode outgrew --max-context-tokens={max_context_tokens}; the "
                         "barrier baseline does not truncate, raise it")


# -- one timed run per mode ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModeResult:
    """One mode's run: what it played and where the time went."""

    episodes: list[tuple[int, int, int]]
    """(group index, turns, reply tokens) per episode, sorted: compared across modes."""
    wall_s: float
    cpu_s: float
    startup_s: float
    """Until every episode had sent its first request (agents made, games reset, first prompts
    tokenized): a fixed cost before the model has any work."""
    model_s: float
    """Simulated model time on the critical path (a lower bound on wall time)."""
    model_compute_s: float

    def summary(self) -> dict:
        overhead = self.wall_s - self.model_s - self.model_compute_s
        return {
            "episodes": len(self.episodes),
            "turns": sum(turns for _, turns, _ in self.episodes),
            "reply_tokens": sum(tokens for _, _, tokens in self.episodes),
            "wall_s": round(self.wall_s, 3),
            "episodes_per_s": round(len(self.episodes) / self.wall_s, 2),
            "model_critical_path_s": round(self.model_s, 3),
            "model_compute_s": round(self.model_compute_s, 4),
            "overhead_s": round(overhead, 3),
            "overhead_share": round(overhead / self.wall_s, 4),
            "startup_s": round(self.startup_s, 3),
            "cpu_s": round(self.cpu_s, 3),
            "cpu_over_wall": round(self.cpu_s / self.wall_s, 3),
        }


async def _timed(job: Awaitable[Any]) -> tuple[Any, float, float, float]:
    """The job's result, its start (``perf_counter``), wall seconds and process CPU seconds."""
    start, cpu = time.perf_counter(), time.process_time()
    result = await job
    return result, start, time.perf_counter() - start, time.process_time() - cpu


def run_ours(pairs: Pairs, seeds: list[int], args: argparse.Namespace, tokenizer: Any,
             sampling: SamplingParams) -> tuple[ModeResult, list[Trajectory]]:
    llm = make_llm(tokenizer, args)
    job = run_groups(pairs, llm, tokenizer, sampling, group_num=len(seeds),
                     group_size=args.group_size, seeds=seeds,
                     max_context_tokens=args.max_context_tokens)
    trajectories, start, wall, cpu = asyncio.run(_timed(job))
    replies = [[len(turn.response_ids) for turn in t.turns] for t in trajectories]
    critical = max(sum(map(llm.latency.seconds, lengths)) for lengths in replies)
    episodes = sorted((t.group_index, t.num_turns, sum(r)) for t, r in zip(trajectories, replies))
    # Resets run before an episode's first await, so the first len(episodes) requests are the
    # episodes' first ones.
    startup = llm.request_times[len(episodes) - 1] - start
    return ModeResult(episodes, wall, cpu, startup, critical, llm.compute_s), trajectories


def run_barrier(pairs: Pairs, seeds: list[int], args: argparse.Namespace, tokenizer: Any,
                sampling: SamplingParams) -> ModeResult:
    llm = make_llm(tokenizer, args)
    job = run_lockstep(pairs, seeds, args.group_size, llm, tokenizer, sampling,
                       args.max_context_tokens)
    played, start, wall, cpu = asyncio.run(_timed(job))
    episodes = sorted((e.group_index, e.turns, e.reply_tokens) for e in played)
    return ModeResult(episodes, wall, cpu, llm.request_times[0] - start, llm.slept_s,
                      llm.compute_s)


def make_llm(tokenizer: Any, args: argparse.Namespace) -> SimulatedLLM:
    return SimulatedLLM(tokenizer, Latency(args.base_ms, args.ms_per_token),
                        args.mean_think_tokens, args.think_dist, seed=args.seed)


def group_presets(names: Sequence[str], presets: dict[str, AgentConfig],
                  group_num: int) -> list[tuple[str, AgentConfig]]:
    """One (preset name, config) per group, cycling ``names``; the system prompt names the group
    so that equal game states of different groups never share a prompt (see the docstring)."""
    pairs = []
    for g in range(group_num):
        name = names[g % len(names)]
        config = presets[name]
        pairs.append((name, dataclasses.replace(
            config, system_prompt=f"{config.system_prompt} Group {g}.".strip())))
    return pairs


def prepare_games(pairs: Pairs, seeds: list[int], tokenizer: Any) -> None:
    """Reset each group's game once, untimed: one-off generation (Sokoban rooms, TextWorld
    games) is cached by seed, and the tokenizer and chat template are warm."""
    for (_, config), seed in zip(pairs, seeds):
        with Agent(config) as agent:
            first_prompt_ids(tokenizer, agent.reset(seed=seed))


# -- reporting ------------------------------------------------------------------------------------


def spread(values: Sequence[float]) -> dict:
    ordered = sorted(values)
    return {"min": ordered[0], "mean": round(statistics.fmean(ordered), 1),
            "p50": ordered[len(ordered) // 2], "p90": ordered[int(0.9 * (len(ordered) - 1))],
            "max": ordered[-1]}


def embedded_rows(args: argparse.Namespace) -> list[dict]:
    """tokens/s of the embedded model per batch size, measured by ``generate.py``'s ``bench``."""
    if args.threads:
        torch.set_num_threads(args.threads)
    generate = script_module(Path(__file__).with_name("generate.py"))
    model, tokenizer = load_model("embedded")
    llm = BatchingLLM(model, tokenizer, seed=0, eos_token_ids=())
    prompts = generate.make_prompts(tokenizer, args.embedded_prompts)
    sampling = SamplingParams(greedy=True, max_new_tokens=args.embedded_new_tokens)
    try:
        return [generate.bench(llm, prompts, size, sampling) for size in args.embedded_batch_sizes]
    finally:
        llm.close()


# -- jump-forward: the real model, step by step vs jump -------------------------------------------


def jump_forward_result(args: argparse.Namespace) -> dict:
    """The ``--jf-preset`` episodes decoded step by step and with jump-forward (the docstring)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.jf_model)
    pairs = [(args.jf_preset, load_agent_presets()[args.jf_preset])] * args.groups
    seeds = list(range(args.groups))
    sampling = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                              constrained_actions=True)
    prepare_games(pairs, seeds, tokenizer)
    load = [round(os.getloadavg()[0], 2)]
    play_episodes(model, tokenizer, pairs[:1], seeds[:1], args, sampling,
                  JUMP_MODES["step_by_step"])  # warm-up
    modes = {}
    for name, options in JUMP_MODES.items():
        TokenTexts.of(tokenizer).clear()  # each mode builds its own masks
        modes[name] = play_episodes(model, tokenizer, pairs, seeds, args, sampling, options)
        load.append(round(os.getloadavg()[0], 2))
    before, after = modes["step_by_step"], modes["jump_forward"]
    return {
        **modes,
        "fewer_decode_steps": round(1 - after["decode_steps_per_episode"]
                                    / before["decode_steps_per_episode"], 4),
        "less_rollout_time": round(1 - after["rollout_s_per_episode"]
                                   / before["rollout_s_per_episode"], 4),
        "less_rollout_time_masked_head": round(
            1 - modes["jump_forward_masked_head"]["rollout_s_per_episode"]
            / before["rollout_s_per_episode"], 4),
        "targets": {"fewer_decode_steps": TARGET_FEWER_STEPS,
                    "less_rollout_time": TARGET_LESS_TIME},
        "engine": ENGINE_SETTINGS,
        "args": vars(args),
        "python": platform.python_version(),
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_1m": load,  # before the timed runs and after each
    }


def play_episodes(model: Any, tokenizer: Any, pairs: Pairs, seeds: list[int],
                  args: argparse.Namespace, sampling: SamplingParams, options: dict) -> dict:
    """One timed ``run_groups`` on a fresh engine with ``options``; its decode counts and
    seconds."""
    llm = BatchingLLM(model, tokenizer, seed=args.seed, **options, **ENGINE_SETTINGS)
    job = run_groups(pairs, llm, tokenizer, sampling, group_num=len(seeds),
                     group_size=args.group_size, seeds=seeds,
                     max_context_tokens=args.max_context_tokens)
    try:
        trajectories, _, wall, _ = asyncio.run(_timed(job))
    finally:
        llm.close()
    stats, episodes = llm.stats, len(trajectories)
    return {
        "episodes": episodes,
        "turns": sum(t.num_turns for t in trajectories),
        "success": round(sum(t.success for t in trajectories) / episodes, 4),
        "generated_tokens": stats.generated_tokens,
        "decode_steps": stats.decode_steps,
        "jumped_tokens": stats.jumped_tokens,
        "rollout_s": round(wall, 3),
        "generation_s": round(stats.generation_seconds, 3),
        "prefill_s": round(stats.prefill_seconds, 3),
        "decode_steps_per_episode": round(stats.decode_steps / episodes, 2),
        "rollout_s_per_episode": round(wall / episodes, 4),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=list(DEFAULT_PRESETS),
                        help="agent presets, cycled over the groups (TextWorld ones generate "
                             "games on first use)")
    parser.add_argument("--groups", type=int, default=32, help="groups (one seed each)")
    parser.add_argument("--group-size", type=int, default=4, help="episodes per group")
    parser.add_argument("--ms-per-token", type=float, default=2.0,
                        help="simulated generation time per reply token")
    parser.add_argument("--base-ms", type=float, default=0.0,
                        help="simulated fixed time per request (or per batch)")
    parser.add_argument("--mean-think-tokens", type=float, default=64.0,
                        help="mean length of a reply's think block")
    parser.add_argument("--think-dist", default="exponential", choices=THINK_DISTS)
    parser.add_argument("--max-new-tokens", type=int, default=400, help="reply length limit")
    parser.add_argument("--max-context-tokens", type=int, default=16384)
    parser.add_argument("--seed", type=int, default=0, help="seeds the simulated replies")
    parser.add_argument("--embedded", action="store_true",
                        help="also time the embedded model on CPU (minutes)")
    parser.add_argument("--embedded-batch-sizes", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--embedded-prompts", type=int, default=16)
    parser.add_argument("--embedded-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads for --embedded (default: torch's)")
    parser.add_argument("--jump-forward", action="store_true",
                        help="instead: real episodes of --jf-preset decoded step by step and "
                             "with jump-forward, side by side (minutes)")
    parser.add_argument("--jf-preset", default=JUMP_PRESET, help="--jump-forward's preset")
    parser.add_argument("--jf-model", default="embedded", help="--jump-forward's model")
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="--jump-forward's sampling temperature (0 = greedy)")
    parser.add_argument("--out", default=None,
                        help="JSON result (default bench_results/rollout.json, or "
                             "bench_results/jump_forward.json with --jump-forward)")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = f"bench_results/{'jump_forward' if args.jump_forward else 'rollout'}.json"
    known = load_agent_presets()
    if args.jf_preset not in known:
        parser.error(f"--jf-preset: unknown preset {args.jf_preset!r}; allowed: {sorted(known)}")
    if args.temperature < 0:
        parser.error(f"--temperature must be >= 0, got {args.temperature}")
    for name in args.presets:
        if name not in known:
            parser.error(f"--presets: unknown preset {name!r}; allowed: {sorted(known)}")
    for flag in ("groups", "group_size", "max_new_tokens", "embedded_prompts",
                 "embedded_new_tokens"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    for flag in ("ms_per_token", "base_ms", "mean_think_tokens"):
        if getattr(args, flag) < 0:
            parser.error(f"--{flag.replace('_', '-')} must be >= 0, got {getattr(args, flag)}")
    if args.embedded and not 1 <= min(args.embedded_batch_sizes) <= max(
            args.embedded_batch_sizes) <= args.embedded_prompts:
        parser.error(f"--embedded-batch-sizes must be in [1, --embedded-prompts="
                     f"{args.embedded_prompts}], got {args.embedded_batch_sizes}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.jump_forward:
        result = jump_forward_result(args)
        OUTPUT.print_jump_forward(result, JUMP_MODES)
        write_result(args.out, result)
        return result
    tokenizer = load_tokenizer("tiny")
    presets = load_agent_presets()
    pairs = group_presets(args.presets, presets, args.groups)
    seeds = list(range(args.groups))
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens)
    prepare_games(pairs, seeds, tokenizer)

    ours, trajectories = run_ours(pairs, seeds, args, tokenizer, sampling)
    barrier = run_barrier(pairs, seeds, args, tokenizer, sampling)
    result = {
        "ours": ours.summary(),
        "barrier": barrier.summary(),
        "speedup": round(barrier.wall_s / ours.wall_s, 3),
        "ideal_speedup": round(barrier.model_s / ours.model_s, 3) if ours.model_s else None,
        "same_episodes": ours.episodes == barrier.episodes,
        "targets": {"speedup": TARGET_SPEEDUP, "overhead_share": TARGET_OVERHEAD},
        "reply_tokens": spread([len(turn.response_ids) for t in trajectories for turn in t.turns]),
        "episode_turns": spread([t.num_turns for t in trajectories]),
        "embedded": embedded_rows(args) if args.embedded else None,
        "args": vars(args),
        "python": platform.python_version(),
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),  # other work on the machine skews wall
    }
    OUTPUT.print_table(result)
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
