"""Task files for verl: one parquet row per game to play (preset, seed, split).

    from agentrl.config import compose_config
    from agentrl.verl.data import write_tasks
    train_path, val_path = write_tasks(compose_config(["hardware=a100", "model=qwen_3b"]), "data/")

    agentrl make-data hardware=a100 'train.presets=[simpleSokobanAgent]'   # the same, from a shell

verl's ``RLHFDataset`` reads these files and hands every column of a row to the AgentLoop
(:mod:`agentrl.verl.agent_loop`), which plays the game the row names. How our groups map onto
verl's batches:

- **Training** (``train.parquet``): ``data.train_batch_size = train.group_num`` rows per step and
  ``rollout.n = train.group_size`` episodes per row, all on the row's seed: a row is a group.
  The file holds ``train.total_steps * train.group_num`` rows in step order (the launcher turns
  verl's shuffling off), the same games the local trainer plays: step ``s`` plays the seeds of
  ``agentrl.envs.splits.train_seeds(s, group_num, seed)``, group ``g`` on preset
  ``train.presets[g % len(presets)]``. All seeds come from the training split.
- **Validation** (``val.parquet``): every ``val.presets`` preset on the same ``val.group_num``
  held-out seeds (``split_seeds("val", ...)``, as ``agentrl eval``), ``val.group_size``
  greedy episodes each (``rollout.val_kwargs.n``).

A row (the contract with the AgentLoop)::

    {"data_source": preset, "agent_name": "agentrl_game",
     "prompt": [{"role": ..., "content": ...}, ...],     # the real opening chat: agent.reset(seed)
     "reward_model": {"style": "rule", "ground_truth": ""},
     "extra_info": {"index": i, "preset": preset, "seed": seed, "split": "train" | "val",
                    "agent_config": json of dataclasses.asdict(AgentConfig),
                    "max_context_tokens": rollout.max_context_tokens,
                    "reward_placement": rollout.reward_placement,
                    "turn_gamma": algorithm.gamma with gamma_unit: turn, else 1.0;
                                  1.0 on validation rows (returns, not shaped rewards)}}

- ``prompt`` is what the episode really opens with, so verl's prompt-length checks and metrics
  see real lengths. Making it resets each game once: TextWorld games are generated here (in
  parallel, into the on-disk pool the episodes then load them from).
- **Every first prompt is measured** (:func:`write_tasks`, with the model's tokenizer and chat
  template) against what the AgentLoop needs of it: at most ``verl.max_prompt_length`` tokens
  and room left in ``rollout.max_context_tokens``; with context windows also a whole reply
  beside it in a window's row. A row that fails is refused here, naming the key, instead of
  raising inside the AgentLoop when verl reaches it mid-training.
- ``agent_config`` makes a row self-contained: a Ray worker on any node rebuilds the preset
  from it, without our config files. Its ``max_response_tokens`` already includes the run's
  reply limit (``rollout.max_new_tokens``, or ``val.max_new_tokens`` on validation rows), and
  its ``held_out_of`` is null (the twin it names is not in the row).
- ``data_source`` is the preset: verl reports validation metrics per data source.

Files are written to a temporary name and renamed into place, so a reader never sees half a
file; the content is a function of the config, so writing again (a resumed run) changes nothing.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.agents import Agent, AgentConfig
from agentrl.config import TrainConfig
from agentrl.envs.splits import split_seeds
from agentrl.verl import AGENT_NAME

__all__ = ["AGENT_NAME", "TRAIN_FILE", "VAL_FILE", "PromptLimits", "prompt_tokenizer",
           "task_rows", "train_tasks", "val_tasks", "write_rows", "write_tasks"]

TRAIN_FILE, VAL_FILE = "train.parquet", "val.parquet"
Presets = Mapping[str, AgentConfig] | Sequence[tuple[str, AgentConfig]]
"""Presets by name; a sequence of pairs may repeat a preset (to weight it)."""


def task_rows(presets: Presets, seeds: Iterable[int], split: str, *, max_context_tokens: int,
              reward_placement: str, turn_gamma: float = 1.0, first_index: int = 0
              ) -> list[dict[str, Any]]:
    """One row per seed: row ``i`` plays preset ``i % len(presets)`` (as group ``i`` of a step).

    ``first_index`` numbers the rows (``extra_info.index``) after rows written before them.
    """
    return _rows(_cycle(presets, seeds), split, max_context_tokens=max_context_tokens,
                 reward_placement=reward_placement, turn_gamma=turn_gamma,
                 first_index=first_index)


@dataclasses.dataclass(frozen=True)
class PromptLimits:
    """What an episode's first prompt must fit inside verl, measured with ``tokenizer`` (the
    AgentLoop's own checks, :class:`~agentrl.verl.agent_loop.GameAgentLoop`, made when the task
    files are written). ``reply_key`` names the run's reply limit (``rollout.max_new_tokens``,
    or ``val.max_new_tokens`` on validation rows)."""

    tokenizer: Any
    prompt_length: int
    response_length: int
    reply_key: str = "rollout.max_new_tokens"

    @classmethod
    def of(cls, config: TrainConfig, tokenizer: Any, reply_key: str = "rollout.max_new_tokens"
           ) -> PromptLimits:
        return cls(tokenizer, config.verl.max_prompt_length, config.verl.max_response_length,
                   reply_key)

    def check(self, name: str, preset: AgentConfig, seed: int, prompt: list[dict],
              max_context_tokens: int) -> None:
        """ValueError naming the key when the opening chat ``prompt`` of preset ``name`` on
        ``seed`` cannot be played inside verl's tensors."""
        from agentrl.rollout.episode import first_prompt_ids

        tokens = len(first_prompt_ids(self.tokenizer, prompt))
        where = f"the first prompt of preset {name!r} (seed {seed}) has {tokens} tokens"
        if tokens > self.prompt_length:
            raise ValueError(f"{where}, more than verl.max_prompt_length={self.prompt_length} "
                             "(verl pads to it and never cuts an episode's prompt; the episode "
                             "would stop the run when verl reaches it); allowed: "
                             f"verl.max_prompt_length >= {tokens}, or a preset whose prompt is "
                             "shorter")
        reply = preset.max_response_tokens
        if preset.windowed and reply > self.response_length:
            raise ValueError(f"agents.{name}.max_response_tokens={reply} (with {self.reply_key})"
                             f" is not allowed with context windows and verl.max_response_length"
                             f"={self.response_length}: a window's row must hold a whole reply; "
                             f"allowed: at most {self.response_length}, or a longer "
                             "verl.max_response_length")
        if preset.windowed:  # a window's row: the first prompt and a whole reply
            room = tokens + reply
            what = (f"with a whole reply of agents.{name}.max_response_tokens={reply} (with "
                    f"{self.reply_key}) needs {room} tokens of")
        else:
            room, what = tokens + 1, "leaves no room for a reply in"
        if room > max_context_tokens:
            raise ValueError(f"{where}, which {what} rollout.max_context_tokens="
                             f"{max_context_tokens}; allowed: rollout.max_context_tokens >= "
                             f"{room}")


def prompt_tokenizer(config: TrainConfig) -> Any:
    """The tokenizer, chat template included, that verl's workers render first prompts with."""
    from agentrl.models.loading import load_tokenizer

    return load_tokenizer(config.model.name, chat_template=config.model.chat_template)


def train_tasks(config: TrainConfig, tokenizer: Any = None) -> list[dict[str, Any]]:
    """``train.total_steps * train.group_num`` rows, step by step (see the module docstring);
    with ``tokenizer``, every first prompt measured (:class:`PromptLimits`)."""
    from agentrl.envs.splits import train_seeds

    train = config.train
    presets = _capped(config, train.presets, config.rollout.max_new_tokens)
    games = [game for step in range(1, train.total_steps + 1)
             for game in _cycle(presets, train_seeds(step, train.group_num, config.seed,
                                                     train.pool))]
    limits = PromptLimits.of(config, tokenizer) if tokenizer is not None else None
    return _rows(games, "train", **_episode_settings(config), limits=limits)


def val_tasks(config: TrainConfig, tokenizer: Any = None) -> list[dict[str, Any]]:
    """``val.group_num`` rows per validation preset, on the same held-out seeds; with
    ``tokenizer``, every first prompt measured (:class:`PromptLimits`)."""
    val = config.val
    seeds = split_seeds("val", val.group_num)
    limit = val.max_new_tokens or config.rollout.max_new_tokens
    presets = _capped(config, dict.fromkeys(val.presets), limit)
    games = [(name, preset, seed) for name, preset in presets for seed in seeds]
    reply_key = "val.max_new_tokens" if val.max_new_tokens else "rollout.max_new_tokens"
    limits = (PromptLimits.of(config, tokenizer, reply_key) if tokenizer is not None else None)
    # undiscounted: verl's val-core reward (the rewards' sum) is then the episode's return, as
    # the local engine reports it; the turn discount only shapes training
    return _rows(games, "val", **{**_episode_settings(config), "turn_gamma": 1.0},
                 limits=limits)


def write_tasks(config: TrainConfig, out_dir: str | Path, tokenizer: Any = None
                ) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``val.parquet`` into ``out_dir``; returns their paths. Every
    first prompt is measured with ``tokenizer`` (default: the model's,
    :func:`prompt_tokenizer`) before anything is written; ValueError naming the key where one
    does not fit (:class:`PromptLimits`)."""
    tokenizer = prompt_tokenizer(config) if tokenizer is None else tokenizer
    folder = Path(out_dir)
    train_path, val_path = folder / TRAIN_FILE, folder / VAL_FILE
    train, val = train_tasks(config, tokenizer), val_tasks(config, tokenizer)
    write_rows(train, train_path)
    write_rows(val, val_path)
    return train_path, val_path


def write_rows(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """``rows`` as a parquet file at ``path``, written atomically (temporary name, rename)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        pq.write_table(pa.Table.from_pylist(rows), staging)
        os.replace(staging, path)
    finally:
        staging.unlink(missing_ok=True)
    return path


# -- helpers ---------------------------------------------------------------------------------------
Game = tuple[str, AgentConfig, int]
"""(preset name, its config, seed): one row to write."""


def _cycle(presets: Presets, seeds: Iterable[int]) -> list[Game]:
    pairs = list(presets.items()) if isinstance(presets, Mapping) else list(presets)
    if not pairs:
        raise ValueError("task rows need at least one agent preset")
    return [(*pairs[i % len(pairs)], seed) for i, seed in enumerate(seeds)]


def _rows(games: list[Game], split: str, *, max_context_tokens: int, reward_placement: str,
          turn_gamma: float = 1.0, first_index: int = 0, limits: PromptLimits | None = None
          ) -> list[dict[str, Any]]:
    """The rows of ``games``; each game is reset once for its opening chat, which ``limits``
    (when given) measures."""
    configs = {name: config for name, config, _ in games}
    agents = {name: Agent(config) for name, config in configs.items()}
    rows = []
    try:
        _pregenerate(agents, games)
        for i, (name, config, seed) in enumerate(games):
            prompt = agents[name].reset(seed=seed)
            if limits is not None:
                limits.check(name, config, seed, prompt, max_context_tokens)
            rows.append(_row(first_index + i, name, config, prompt, seed, split,
                             max_context_tokens, reward_placement, turn_gamma))
        return rows
    finally:
        for agent in agents.values():
            agent.close()


def _row(index: int, preset: str, config: AgentConfig, prompt: list[dict], seed: int,
         split: str, max_context_tokens: int, reward_placement: str, turn_gamma: float = 1.0
         ) -> dict[str, Any]:
    return {
        "data_source": preset,
        "agent_name": AGENT_NAME,
        "prompt": [{"role": m["role"], "content": m["content"]} for m in prompt],
        "reward_model": {"style": "rule", "ground_truth": ""},
        "extra_info": {
            "index": index, "preset": preset, "seed": int(seed), "split": split,
            "agent_config": json.dumps(dataclasses.asdict(config), sort_keys=True),
            "max_context_tokens": max_context_tokens, "reward_placement": reward_placement,
            "turn_gamma": float(turn_gamma),
        },
    }


def _capped(config: TrainConfig, names: Iterable[str], max_new_tokens: int
            ) -> list[tuple[str, AgentConfig]]:
    """The presets as rows carry them: as they play (:meth:`TrainConfig.playing_presets`), and
    no ``held_out_of`` (it names a preset the row does not carry, and does not change how an
    episode is played)."""
    return [(name, dataclasses.replace(preset, held_out_of=None))
            for name, preset in config.playing_presets(names, max_new_tokens)]


def _episode_settings(config: TrainConfig) -> dict[str, Any]:
    algorithm = config.algorithm
    return {"max_context_tokens": config.rollout.max_context_tokens,
            "reward_placement": config.rollout.reward_placement,
            "turn_gamma": algorithm.gamma if algorithm.gamma_unit == "turn" else 1.0}


def _pregenerate(agents: Mapping[str, Agent], games: list[Game]) -> None:
    """Make expensive games (TextWorld's) in parallel before the resets need them one by one."""
    for name, agent in agents.items():
        pregenerate = getattr(agent.env.unwrapped, "pregenerate", None)
        seeds = sorted({seed for preset, _, seed in games if preset == name})
        if pregenerate is not None and seeds:
            pregenerate(seeds, progress=len(seeds) > 8)
