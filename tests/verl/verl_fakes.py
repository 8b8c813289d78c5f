"""Test helpers for the verl adapter: scripted games, a fake server manager, a fake TransferQueue,
verl's config and batches built the way its trainers build them."""

from __future__ import annotations

import dataclasses
import json
import sys
import types
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.agents import Agent, AgentConfig
from agentrl.models import end_of_turn_ids
from agentrl.rollout import ChatSuffix, first_prompt_ids

ORACLE = object()
"""A script entry: the reply that follows the game's known solution."""


@dataclasses.dataclass
class ScriptedGame:
    """One game played by a script, outside verl: what the loop must reproduce."""

    preset: str
    config: AgentConfig
    seed: int
    prompt_ids: list[int]
    replies: list[str]
    rewards: list[float]
    observations: list[list[int]]
    """The chat-template suffix ids after each reply but the last."""
    success: bool = False


def play_script(tokenizer, preset: str, config: AgentConfig, seed: int,
                script: list) -> ScriptedGame:
    """Play ``script`` (texts, or ORACLE) with a plain Agent until the episode ends."""
    suffix = ChatSuffix(tokenizer)
    agent = Agent(config)
    opening = agent.reset(seed=seed)
    replies, rewards, observations = [], [], []
    result = None
    for entry in script:
        text = agent.oracle_response() if entry is ORACLE else entry
        result = agent.step(text)
        replies.append(text)
        rewards.append(result.reward)
        if result.done:
            break
        observations.append(suffix.first_prompt(result.messages) if result.fresh
                            else suffix(result.messages))
    else:
        raise AssertionError(f"the script of {preset} seed {seed} ends before the episode")
    agent.close()
    return ScriptedGame(preset, config, seed, first_prompt_ids(tokenizer, opening), replies,
                        rewards, observations, success=result.success)


@dataclasses.dataclass
class Call:
    request_id: str
    prompt_ids: list[int]
    sampling_params: dict
    token_ids: list[int]
    log_probs: list[float]


class FakeServerManager:
    """Stands in for verl's ``LLMServerClient``: answers like vLLM (new token ids only, ending
    with the end-of-turn id unless ``max_tokens`` cut the reply, one log-prob per token) with
    the next reply of the script whose opening prompt the episode's first request sent.
    Log-probs are unique per token (a running count), so a test can tell whose they are.
    ``load`` starts over with new scripts (one fake serves many rollouts)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.eos = end_of_turn_ids(tokenizer)[0]
        self.load([])

    def load(self, games: list[ScriptedGame]) -> FakeServerManager:
        self.scripts = {tuple(game.prompt_ids): game.replies for game in games}
        self.calls: list[Call] = []
        self._episodes: dict[str, list[str]] = {}
        self._tokens = 0
        return self

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        if request_id not in self._episodes:
            self._episodes[request_id] = list(self.scripts[tuple(prompt_ids)])
        text = self._episodes[request_id].pop(0)
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.eos]
        ids = ids[: sampling_params["max_tokens"]]
        log_probs = [-(self._tokens + i + 1) / 1000 for i in range(len(ids))]
        self._tokens += len(ids)
        self.calls.append(Call(request_id, list(prompt_ids), dict(sampling_params), ids, log_probs))
        return TokenOutput(token_ids=ids, log_probs=log_probs, stop_reason="completed",
                           num_preempted=0, extra_fields={"global_steps": 1, "min_global_steps": 1,
                                                          "max_global_steps": 1})

    def episodes(self) -> dict[str, list[Call]]:
        """The calls of each request id, in order."""
        out: dict[str, list[Call]] = {}
        for call in self.calls:
            out.setdefault(call.request_id, []).append(call)
        return out


# -- task rows, config, batches --------------------------------------------------------------------
def task_row(game: ScriptedGame, index: int, *, max_context_tokens: int,
             reward_placement: str = "turn") -> dict:
    """A parquet row of the task schema (agentrl.verl.data writes the same)."""
    with Agent(game.config) as agent:
        opening = agent.reset(seed=game.seed)
    return {
        "data_source": game.preset,
        "agent_name": "agentrl_game",
        "prompt": opening,
        "reward_model": {"style": "rule", "ground_truth": ""},
        "extra_info": {
            "index": index, "preset": game.preset, "seed": game.seed, "split": "train",
            "agent_config": json.dumps(dataclasses.asdict(game.config)),
            "max_context_tokens": max_context_tokens, "reward_placement": reward_placement,
        },
    }


def verl_config(model_dir: Path, *, use_v1: bool, prompt_length: int, response_length: int,
                n: int, temperature: float = 0.7, extra: list[str] | tuple = ()):
    """verl's ppo_trainer config with the adapter's overrides (then ``extra``)."""
    import verl
    from hydra import compose, initialize_config_dir

    from agentrl.verl.agent_loop import verl_overrides

    overrides = verl_overrides(use_v1) + [
        f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.rollout.name=vllm",
        f"data.max_prompt_length={prompt_length}", f"data.max_response_length={response_length}",
        f"actor_rollout_ref.rollout.n={n}", f"actor_rollout_ref.rollout.temperature={temperature}",
        *extra,
    ]
    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose("ppo_trainer", overrides=overrides)


def dataset_batch(rows: list[dict], tmp_path: Path, tokenizer, config) -> dict:
    """The rows through a parquet file, verl's RLHFDataset and collate_fn (as its trainers load
    them)."""
    import pandas as pd
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    path = tmp_path / f"tasks-{uuid.uuid4().hex}.parquet"
    pd.DataFrame(rows).to_parquet(path)
    dataset = RLHFDataset(data_files=[str(path)], tokenizer=tokenizer, config=config.data)
    batch = collate_fn([dataset[i] for i in range(len(dataset))])
    batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(rows))], dtype=object)
    return batch


async def legacy_batch(worker, batch_dict: dict, n: int):
    """What RayPPOTrainer hands its AgentLoopManager (rows repeated n times, interleaved), with
    the manager's numbering of the episodes (``priority``), and the padded batch the worker
    returns."""
    from verl import DataProto

    batch = DataProto.from_single_dict(batch_dict)
    batch.meta_info["global_steps"] = 1
    batch = batch.repeat(repeat_times=n, interleave=True)
    batch.non_tensor_batch["priority"] = np.arange(len(batch), dtype=np.int64)
    return await worker.generate_sequences(batch)


class FakeTransferQueue(types.ModuleType):
    """The ``transfer_queue`` calls AgentLoopWorkerTQ makes, kept in memory."""

    def __init__(self):
        super().__init__("transfer_queue")
        self.KVBatchMeta = type("KVBatchMeta", (), {})
        self.clear()

    def clear(self) -> None:
        self.fields: dict[str, Any] = {}
        self.tags: dict[str, dict] = {}

    def init(self, *args, **kwargs):
        pass

    async def async_kv_put(self, key, partition_id, tag=None, **kwargs):
        self.tags[key] = dict(tag or {})

    async def async_kv_batch_put(self, keys, fields, tags, partition_id, **kwargs):
        for i, key in enumerate(keys):
            self.fields[key] = fields[i]
            self.tags[key] = dict(tags[i])


@contextmanager
def fake_transfer_queue():
    """Import verl's V1 modules against a FakeTransferQueue; undo both afterwards (the real
    package is not installed on CPU machines, and other tests must not see the fake)."""
    saved = {name: module for name, module in sys.modules.items() if _on_transfer_queue(name)}
    for name in saved:
        del sys.modules[name]
    queue = FakeTransferQueue()
    sys.modules["transfer_queue"] = queue
    try:
        yield queue
    finally:
        for name in [name for name in sys.modules if _on_transfer_queue(name)]:
            del sys.modules[name]
        sys.modules.update(saved)


def _on_transfer_queue(module: str) -> bool:
    """TransferQueue itself, and the modules that import it (verl's V1 trainer, ours)."""
    return module in ("transfer_queue", "agentrl.verl.agent_loop_v1") or module.startswith(
        "verl.trainer.ppo.v1")


async def v1_batch(queue: FakeTransferQueue, worker, batch_dict: dict):
    """What PPOTrainer V1 does: hand the prompts to AgentLoopWorkerTQ, wait for its sessions,
    then read the stored samples back as one nested batch and pad it (``to_padded_tensor``),
    as its advantage step does. Returns (keys, padded TensorDict)."""
    import asyncio

    from verl.utils import tensordict_utils as tu
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    queue.clear()
    batch = tu.get_tensordict(dict(batch_dict))
    tu.assign_non_tensor_data(batch, "global_steps", 1)
    await worker.generate_sequences(batch)
    await asyncio.gather(*list(worker.background_tasks))
    failed = {key: tag for key, tag in queue.tags.items() if tag.get("status") == "failure"}
    assert not failed, f"sessions failed: {failed}"
    keys = sorted(queue.fields)
    fields = ("prompts", "responses", "response_mask", "rollout_log_probs", "rm_scores")
    rows = [{name: queue.fields[key][name] for name in fields} for key in keys]
    return keys, list_of_dict_to_tensordict(rows).to_padded_tensor()
