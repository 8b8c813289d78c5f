"""The AgentLoop ``agentrl_game`` driven by verl's own workers (legacy ``AgentLoopWorker`` and V1
``AgentLoopWorkerTQ``) with a fake server manager: the padded batch verl builds holds our tokens,
masks, log-probs and per-turn rewards, and verl's GAE over it gives the returns worked out by hand.
With context windows (V1) the loop returns one row per window: each row's prompt is the context
its replies were sampled from, every model token is in exactly one row, and verl's per-row GAE
at γ = λ = 1 gives the whole episode's returns.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from verl_fakes import (
    ORACLE,
    FakeServerManager,
    dataset_batch,
    fake_transfer_queue,
    legacy_batch,
    play_script,
    task_row,
    v1_batch,
    verl_config,
)

from agentrl.agents import Agent, load_agent_presets
from agentrl.models import end_of_turn_ids
from agentrl.verl import agent_loop
from agentrl.verl.agent_loop import AGENT_NAME, EpisodeTask, GameAgentLoopWorker
from agentrl.verl.windows import windowed_context_tokens

MODES = ("legacy", "v1")
TEMPERATURE = 0.7
PROMPT_LENGTH = 1024
RESPONSE_LENGTH = 768


@dataclasses.dataclass
class Sample:
    """One row of verl's padded batch, cut back to its real tokens."""

    prompt: list[int]
    response: list[int]
    mask: list[int]
    logprobs: list[float]
    rm_scores: list[float]


@dataclasses.dataclass
class Rollout:
    samples: list[Sample]
    padded: dict[str, torch.Tensor]
    """``responses``, ``response_mask``, ``rm_scores`` (and the rest) as verl pads them."""
    non_tensor: dict | None
    """The legacy batch's non-tensor columns (None for V1)."""
    config: Any
    """verl's composed config."""


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)  # what verl's workers load


@pytest.fixture(scope="module")
def presets():
    return load_agent_presets()


def one_action_per_turn(presets, name: str, **changes):
    """A preset playing one action a turn, so the oracle needs several turns."""
    return dataclasses.replace(presets[name], max_actions_per_turn=1, max_response_tokens=64,
                               **changes)


@pytest.fixture(scope="module")
def fake(tokenizer):
    """The server manager every worker of this module talks to (reloaded per rollout)."""
    return FakeServerManager(tokenizer)


@pytest.fixture(scope="module")
def workers(model_dir, fake):
    """verl's worker for (mode, n, prompt_length, response_length), made once: legacy
    ``GameAgentLoopWorker`` (what ``GameAgentLoopManager`` runs), V1 ``AgentLoopWorkerTQ``
    on a fake TransferQueue. Returns ``get(...) -> (worker, config, queue)``."""
    made = {}
    with fake_transfer_queue() as queue:
        def get(mode: str, n: int, prompt_length: int, response_length: int,
                estimator: str = "gae", lam: float = 1.0, extra: tuple[str, ...] = ()):
            key = (mode, n, prompt_length, response_length, estimator, lam, extra)
            if key not in made:
                config = verl_config(model_dir, use_v1=mode == "v1", prompt_length=prompt_length,
                                     response_length=response_length, n=n,
                                     temperature=TEMPERATURE,
                                     extra=[f"algorithm.adv_estimator={estimator}",
                                            f"algorithm.lam={lam}", *extra])
                if mode == "legacy":
                    worker = GameAgentLoopWorker(config, fake, None, None)
                else:
                    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

                    worker = AgentLoopWorkerTQ.__ray_actor_class__(config, fake, None, None)
                made[key] = worker, config
            return (*made[key], queue)

        yield get


def rollout(workers, fake, mode: str, tmp_path, games, *, n: int = 2,
            response_length: int = RESPONSE_LENGTH, prompt_length: int = PROMPT_LENGTH,
            reward_placement: str = "turn", max_context_tokens: int = 4096,
            estimator: str = "gae", split: str = "train", extra: tuple[str, ...] = ()
            ) -> Rollout:
    """One task row per game, n samples each, through verl's worker of ``mode`` (``extra``:
    more overrides of verl's config)."""
    worker, config, queue = workers(mode, n, prompt_length, response_length, estimator,
                                    extra=extra)
    fake.load(games)
    rows = [task_row(game, index, max_context_tokens=max_context_tokens,
                     reward_placement=reward_placement) for index, game in enumerate(games)]
    for row in rows:
        row["extra_info"]["split"] = split
    batch = dataset_batch(rows, tmp_path, worker.tokenizer, config)
    if mode == "legacy":
        output = asyncio.run(legacy_batch(worker, batch, n))
        return Rollout(legacy_samples(output.batch), dict(output.batch.items()),
                       output.non_tensor_batch, config)
    keys, padded = asyncio.run(v1_batch(queue, worker, batch))
    lengths = [(queue.tags[key]["prompt_len"], queue.tags[key]["response_len"]) for key in keys]
    return Rollout(v1_samples(padded, lengths), dict(padded.items()), None, config)


def legacy_samples(batch) -> list[Sample]:
    """Legacy rows: prompts left-padded to prompt_length, responses right-padded."""
    prompt_width = batch["prompts"].shape[1]
    samples = []
    for row in range(batch["prompts"].shape[0]):
        attention = batch["attention_mask"][row]
        prompt_real = attention[:prompt_width].bool()
        length = int(attention[prompt_width:].sum())
        assert attention[prompt_width:prompt_width + length].all(), "response padding inside"
        samples.append(Sample(
            batch["prompts"][row][prompt_real].tolist(), batch["responses"][row][:length].tolist(),
            batch["response_mask"][row][:length].tolist(),
            batch["rollout_log_probs"][row][:length].tolist(),
            batch["rm_scores"][row][:length].tolist()))
        for key in ("response_mask", "rm_scores", "rollout_log_probs"):
            assert not batch[key][row][length:].any(), f"{key} is not 0 on padding"
    return samples


def v1_samples(padded, lengths) -> list[Sample]:
    """V1 rows: nested per sample, padded on the right by ``to_padded_tensor``."""
    samples = []
    for row, (prompt_len, length) in enumerate(lengths):
        samples.append(Sample(
            padded["prompts"][row][:prompt_len].tolist(),
            padded["responses"][row][:length].tolist(),
            padded["response_mask"][row][:length].tolist(),
            padded["rollout_log_probs"][row][:length].tolist(),
            padded["rm_scores"][row][:length].tolist()))
        for key in ("response_mask", "rm_scores"):
            assert not padded[key][row][length:].any(), f"{key} is not 0 on padding"
    return samples


def episode_of(sample: Sample, fake: FakeServerManager) -> list:
    """The server calls that made ``sample``: its model log-probs are theirs (they are unique)."""
    model_logprobs = [lp for lp, m in zip(sample.logprobs, sample.mask) if m]
    matches = [calls for calls in fake.episodes().values()
               if model_logprobs == pytest.approx([lp for call in calls for lp in call.log_probs],
                                                  abs=1e-6)]  # float32 in verl's batch
    assert len(matches) == 1, "no single request made this sample"
    return matches[0]


def check_sample(sample: Sample, games, fake, tokenizer) -> None:
    """Tokens, mask, log-probs and rewards of ``sample`` against its scripted game and the
    server calls of its request."""
    game = next(g for g in games if g.prompt_ids == sample.prompt)
    calls = episode_of(sample, fake)
    assert len(calls) == len(game.replies) == len(game.rewards)
    eos = end_of_turn_ids(tokenizer)[0]
    expected, mask, logprobs, rewards = [], [], [], []
    for turn, call in enumerate(calls):
        # the same request id carries the episode: each turn's prompt is the last one + reply + obs
        assert call.prompt_ids == game.prompt_ids + expected
        assert call.token_ids[-1] == eos and call.sampling_params["temperature"] == TEMPERATURE
        assert call.sampling_params["logprobs"] and eos in call.sampling_params["stop_token_ids"]
        assert call.sampling_params["max_tokens"] <= game.config.max_response_tokens
        expected += call.token_ids
        mask += [1] * len(call.token_ids)
        logprobs += call.log_probs
        rewards += [0.0] * (len(call.token_ids) - 1) + [game.rewards[turn]]
        if turn < len(calls) - 1:
            observation = game.observations[turn]
            expected += observation
            mask += [0] * len(observation)
            logprobs += [0.0] * len(observation)
            rewards += [0.0] * len(observation)
    assert sample.response == expected  # ends with the last reply: no trailing observation
    assert sample.mask == mask
    assert sample.logprobs == pytest.approx(logprobs)
    assert sample.rm_scores == pytest.approx(rewards)


# -- the batch -------------------------------------------------------------------------------------
GAMES = {
    "sokoban": ("simpleSokobanAgent", (1, 3)),  # 3 turns: bad format, then 2 oracle moves
    "textworld": ("textworldEasyAgent", (1,)),  # 3 turns: bad format, 2 walkthrough commands
}


@pytest.mark.parametrize("game_name",
                         ["sokoban", pytest.param("textworld", marks=pytest.mark.slow)])
@pytest.mark.parametrize("mode", MODES)
def test_batch_holds_our_tokens_masks_logprobs_and_turn_rewards(mode, game_name, workers, fake,
                                                                tmp_path, tokenizer, presets):
    preset, seeds = GAMES[game_name]
    config = one_action_per_turn(presets, preset)
    games = [play_script(tokenizer, preset, config, seed, ["no format", ORACLE, ORACLE, ORACLE])
             for seed in seeds]
    assert all(len(game.rewards) >= 2 for game in games)
    result = rollout(workers, fake, mode, tmp_path, games, n=2)
    assert len(result.samples) == 2 * len(games)
    assert len(fake.episodes()) == len(result.samples)  # one request id per episode
    for sample in result.samples:
        check_sample(sample, games, fake, tokenizer)
    for game in games:  # the n samples of a row play its game
        assert sum(sample.prompt == game.prompt_ids for sample in result.samples) == 2
    assert result.padded["responses"].shape[0] == len(result.samples)
    if mode == "legacy":
        assert result.padded["responses"].shape[1] == RESPONSE_LENGTH


@pytest.mark.parametrize("mode", MODES)
def test_last_placement_puts_the_return_on_the_last_model_token(mode, workers, fake, tmp_path,
                                                                tokenizer, presets):
    config = one_action_per_turn(presets, "simpleSokobanAgent")
    game = play_script(tokenizer, "simpleSokobanAgent", config, 3, ["no format", ORACLE, ORACLE])
    result = rollout(workers, fake, mode, tmp_path, [game], n=1, reward_placement="last")
    (sample,) = result.samples
    last_model_token = max(i for i, m in enumerate(sample.mask) if m)
    assert last_model_token == len(sample.response) - 1
    expected = [0.0] * len(sample.response)
    expected[last_model_token] = sum(game.rewards)
    assert sample.rm_scores == pytest.approx(expected)


@pytest.mark.parametrize("mode", MODES)
def test_full_determinism_gives_each_episode_its_own_request_id_the_same_in_every_run(
        mode, workers, fake, tmp_path, tokenizer, presets):
    """Under ``rollout.full_determinism`` verl hands the request id to vLLM unchanged and its
    router routes by it. V1 passes no ``priority``, so ``det-<priority>`` gave every episode
    ``det-0``: one replica, duplicate ids in flight. Each episode (2 rows x 2 sessions) gets
    its own id, and a second run the same ones."""
    config = one_action_per_turn(presets, "simpleSokobanAgent")
    games = [play_script(tokenizer, "simpleSokobanAgent", config, seed, [ORACLE] * 4)
             for seed in (3, 4)]
    runs = []
    for _ in range(2):
        result = rollout(workers, fake, mode, tmp_path, games, n=2,
                         extra=("actor_rollout_ref.rollout.full_determinism=true",))
        assert len(result.samples) == 4
        runs.append(sorted(fake.episodes()))
    assert len(runs[0]) == 4 and all(rid.startswith("det-") for rid in runs[0])
    assert runs[0] == runs[1]
    for sample in result.samples:
        check_sample(sample, games, fake, tokenizer)


# -- the response budget and cut replies -----------------------------------------------------------
def test_budget_ends_the_episode_before_an_observation_overflows(workers, fake, tmp_path,
                                                                  tokenizer, presets):
    config = one_action_per_turn(presets, "simpleSokobanAgent")
    game = play_script(tokenizer, "simpleSokobanAgent", config, 0, ["no format"] + [ORACLE] * 4)
    assert len(game.rewards) == 5
    replies = [len(tokenizer.encode(text, add_special_tokens=False)) + 1 for text in game.replies]
    # room for two turns and their observations, then 5 tokens of the third reply
    budget = replies[0] + len(game.observations[0]) + replies[1] + len(game.observations[1]) + 5
    result = rollout(workers, fake, "legacy", tmp_path, [game], n=1, response_length=budget)
    (sample,) = result.samples
    calls = fake.calls
    assert len(calls) == 3
    for call in calls:  # every request leaves room in the budget for what it may return
        assert len(call.prompt_ids) - len(game.prompt_ids) + call.sampling_params["max_tokens"] \
            <= budget
    assert calls[2].sampling_params["max_tokens"] == 5 and len(calls[2].token_ids) == 5
    assert len(sample.response) == budget and sample.mask[-1] == 1  # no closing token, no obs
    turn_ends = [replies[0] - 1, replies[0] + len(game.observations[0]) + replies[1] - 1,
                 budget - 1]
    expected = [0.0] * budget
    expected[turn_ends[0]], expected[turn_ends[1]] = game.rewards[0], game.rewards[1]
    expected[turn_ends[2]] = Agent(config).format_penalty  # the cut reply has no </answer>
    assert sample.rm_scores == pytest.approx(expected)
    (info,) = result.non_tensor["agentrl_episode"]
    assert info["metrics"]["context_exhausted"] == 1.0 and info["num_turns"] == 3
    assert list(result.non_tensor["agentrl_truncated"]) == [True]  # GAE ends it there
    # verl's own per-preset extras (val-aux/<preset>/...)
    assert (result.non_tensor["success"][0], result.non_tensor["turns"][0]) == (0.0, 3.0)
    assert result.non_tensor["episode_return"][0] == pytest.approx(info["episode_return"])


def test_a_cut_reply_is_closed_by_a_mask_0_token(workers, fake, tmp_path, tokenizer, presets):
    config = dataclasses.replace(presets["simpleSokobanAgent"], max_turns=2, max_response_tokens=8)
    long_reply = "I think about this room for a long while before I answer. " * 3
    cut_text = tokenizer.decode(tokenizer.encode(long_reply, add_special_tokens=False)[:8],
                                skip_special_tokens=True)
    game = play_script(tokenizer, "simpleSokobanAgent", config, 0, [cut_text, "no format"])
    sent = dataclasses.replace(game, replies=[long_reply, "no format"])  # what the server says
    result = rollout(workers, fake, "legacy", tmp_path, [sent], n=1)
    (sample,) = result.samples
    eos = end_of_turn_ids(tokenizer)[0]
    first = fake.calls[0].token_ids
    assert len(first) == 8 and eos not in first
    assert sample.response[:9] == first + [eos] and sample.mask[:9] == [1] * 8 + [0]
    assert sample.logprobs[8] == 0.0
    assert sample.response[9:9 + len(game.observations[0])] == game.observations[0]
    assert sample.rm_scores[7] == pytest.approx(Agent(config).format_penalty)  # last sampled
    assert sample.rm_scores[8] == 0.0


# -- GAE over verl's batch -------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_gae_over_the_batch_gives_the_returns_worked_out_by_hand(mode, workers, fake, tmp_path,
                                                                 tokenizer, presets):
    from verl import DataProto
    from verl.trainer.ppo.core_algos import AdvantageEstimator
    from verl.trainer.ppo.ray_trainer import compute_advantage

    config = one_action_per_turn(presets, "simpleSokobanAgent")
    game = play_script(tokenizer, "simpleSokobanAgent", config, 1, [ORACLE, ORACLE])
    assert len(game.rewards) == 2
    r1, r2 = game.rewards
    result = rollout(workers, fake, mode, tmp_path, [game], n=1)
    mask = result.padded["response_mask"]
    value, lam = 0.25, 0.9
    values = torch.where(mask.bool(), torch.tensor(value), torch.tensor(9.0))  # 9: must be ignored
    data = DataProto.from_dict(tensors={
        "response_mask": mask, "values": values, "token_level_rewards": result.padded["rm_scores"]})
    returns = compute_advantage(data, adv_estimator=AdvantageEstimator.GAE, gamma=1.0, lam=lam,
                                config=result.config.algorithm).batch["returns"][0]
    # Model tokens t = 1..N (turn 1: 1..n1); gamma = 1, V = v on every model token. GAE skips
    # the observation, so delta = r1 at t = n1, r2 - v at t = N, 0 elsewhere, and
    # return_t = v + lam^(n1-t) r1 [t <= n1] + lam^(N-t) (r2 - v). (lam = 1: r1 + r2, then r2.)
    n1, n2 = (len(call.token_ids) for call in fake.calls)
    n = n1 + n2
    by_hand = [value + (lam ** (n1 - t) * r1 if t <= n1 else 0.0) + lam ** (n - t) * (r2 - value)
               for t in range(1, n + 1)]
    assert returns[mask[0].bool()].tolist() == pytest.approx(by_hand, abs=1e-5)


# -- off the event loop, the task row, the launch overrides ----------------------------------------
def test_agent_is_built_and_reset_off_the_event_loop(workers, fake, tmp_path, tokenizer,
                                                     presets, monkeypatch):
    threads = []

    class RecordingAgent(Agent):
        def __init__(self, config):
            threads.append(threading.get_ident())
            super().__init__(config)

        def reset(self, seed=None):
            threads.append(threading.get_ident())
            return super().reset(seed=seed)

    monkeypatch.setattr(agent_loop, "Agent", RecordingAgent)
    config = one_action_per_turn(presets, "simpleSokobanAgent")
    game = play_script(tokenizer, "simpleSokobanAgent", config, 3, ["no format", ORACLE, ORACLE])
    rollout(workers, fake, "legacy", tmp_path, [game], n=2)
    assert len(threads) == 4 and threading.get_ident() not in threads


def test_a_first_prompt_longer_than_prompt_length_fails_clearly(workers, fake, tmp_path,
                                                                tokenizer, presets):
    config = one_action_per_turn(presets, "simpleSokobanAgent")
    game = play_script(tokenizer, "simpleSokobanAgent", config, 3, ["no format", ORACLE, ORACLE])
    with pytest.raises(ValueError, match="rollout.prompt_length=64"):
        rollout(workers, fake, "legacy", tmp_path, [game], n=1, prompt_length=64)


def test_task_fields_are_checked_by_name(tokenizer, presets):
    config = one_action_per_turn(presets, "simpleSokobanAgent")
    game = play_script(tokenizer, "simpleSokobanAgent", config, 3, ["no format", ORACLE, ORACLE])
    good = task_row(game, 0, max_context_tokens=4096)["extra_info"]
    task = EpisodeTask.from_extra_info(good)
    assert (task.preset, task.seed, task.agent_config) == ("simpleSokobanAgent", 3, config)
    for change, message in [
        ({"seed": None}, r"lacks \['seed'\]"),
        ({"seed": "2"}, "extra_info.seed='2'"),
        ({"reward_placement": "first"}, "reward_placement='first'.*allowed: \\['turn', 'last'\\]"),
        ({"agent_config": "{not json"}, "agent_config of preset 'simpleSokobanAgent'"),
        ({"agent_config": '{"game": "Sokoban", "max_turnz": 3}'}, "unknown key.*max_turnz"),
        ({"max_context_tokens": 1}, "max_context_tokens=1"),
    ]:
        with pytest.raises(ValueError, match=message):
            EpisodeTask.from_extra_info({**good, **change})
    with pytest.raises(ValueError, match="extra_info must be a mapping"):
        EpisodeTask.from_extra_info(None)


@pytest.mark.parametrize("mode", MODES)
def test_overrides_select_our_loop_and_legacy_manager(mode, model_dir):
    import hydra
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.utils.import_utils import load_class_from_fqn

    config = verl_config(model_dir, use_v1=mode == "v1", prompt_length=PROMPT_LENGTH,
                         response_length=RESPONSE_LENGTH, n=1)
    assert config.trainer.use_v1 is (mode == "v1")
    assert config.actor_rollout_ref.model.external_lib == agent_loop.__name__
    assert hydra.utils.get_class(_agent_loop_registry[AGENT_NAME]["_target_"]) \
        is agent_loop.GameAgentLoop
    manager = config.actor_rollout_ref.rollout.agent.get("agent_loop_manager_class")
    if mode == "v1":  # an AgentLoopManagerTQ (importing it needs TransferQueue: a fake here)
        with fake_transfer_queue():
            from verl.trainer.ppo.v1 import AgentLoopManagerTQ

            manager_class = load_class_from_fqn(manager, "AgentLoopManager")
            assert issubclass(manager_class, AgentLoopManagerTQ)
            assert manager_class.__name__ == "GameAgentLoopManagerTQ"
    else:
        manager_class = load_class_from_fqn(manager, "AgentLoopManager")
        assert manager_class is agent_loop.GameAgentLoopManager
        workers = manager_class(config, None).agent_loop_workers_class
        assert workers.__ray_actor_class__ is GameAgentLoopWorker


# -- our metrics, from verl's batches --------------------------------------------------------------
class InProcessWorker:
    """A worker handle whose ``generate_sequences.remote`` runs the worker in this process."""

    def __init__(self, worker):
        self.generate_sequences = SimpleNamespace(remote=worker.generate_sequences)


def manager_rollouts(workers, fake, tmp_path, tokenizer, presets, **trainer):
    """``GameAgentLoopManager`` over verl's legacy worker, a won and a lost game, run dir
    ``tmp_path/run``: a training batch (n = 2) and a padded validation batch at step 1.
    Returns (preset, won, lost, outputs)."""
    from omegaconf import open_dict
    from verl import DataProto
    from verl.protocol import pad_dataproto_to_divisor

    preset = "simpleSokobanAgent"
    config = one_action_per_turn(presets, preset)
    won = play_script(tokenizer, preset, config, 1, ["no format", ORACLE, ORACLE, ORACLE])
    lost = play_script(tokenizer, preset, config, 2, ["no format"] * 50)
    assert won.success and not lost.success
    worker, verl_cfg, _ = workers("legacy", 2, PROMPT_LENGTH, RESPONSE_LENGTH)
    verl_cfg = verl_cfg.copy()
    with open_dict(verl_cfg):
        verl_cfg.trainer.default_local_dir = str(tmp_path / "run" / "checkpoints")
        verl_cfg.trainer.logger = ["console"]
        verl_cfg.trainer.update(trainer)
    manager = agent_loop.GameAgentLoopManager(verl_cfg, None)
    manager.agent_loop_workers = [InProcessWorker(worker)]
    rows = [task_row(game, index, max_context_tokens=4096)
            for index, game in enumerate([won, lost])]

    def generate(meta_info: dict, n: int, divisor: int = 1):
        fake.load([won, lost])
        batch = DataProto.from_single_dict(dataset_batch(rows, tmp_path, tokenizer, verl_cfg))
        batch = batch.repeat(repeat_times=n, interleave=True)
        batch, _ = pad_dataproto_to_divisor(batch, divisor)
        batch.meta_info.update(meta_info)
        return manager.generate_sequences(batch)

    outputs = [generate({"global_steps": 1}, n=2),  # rollout.n = 2
               generate({"global_steps": 1, "validate": True}, n=1, divisor=3)]  # [won, lost, won copy]
    assert len(fake.calls) == sum(len(g.replies) for g in (won, lost, won))  # the copy played
    return preset, won, lost, outputs


def test_manager_logs_our_metric_names_for_training_and_padded_validation(
        workers, fake, tmp_path, tokenizer, presets):
    from agentrl.rollout import EpisodeOutcome, rollout_metrics
    from agentrl.trainers.tracking import read_metrics

    preset, won, lost, _ = manager_rollouts(workers, fake, tmp_path, tokenizer, presets)
    train, val = read_metrics(tmp_path / "run" / "metrics.jsonl")
    p = f"train/{preset}"
    replies = [len(won.replies), len(lost.replies)]
    format_errors = [g.replies.count("no format") for g in (won, lost)]
    assert train["step"] == 1 and train[f"{p}/success"] == 0.5
    assert train[f"{p}/turns"] == pytest.approx(sum(replies) / 2)
    assert train[f"{p}/return"] == pytest.approx((sum(won.rewards) + sum(lost.rewards)) / 2)
    assert train[f"{p}/format_error"] == pytest.approx(sum(format_errors) / sum(replies))
    assert val["step"] == 1 and val[f"val/{preset}/success"] == 0.5  # the copy is not counted
    assert val[f"val/{preset}/turns"] == pytest.approx(sum(replies) / 2)
    local = rollout_metrics([EpisodeOutcome(preset, 0, True, 0.0, 1)], split="train")
    # the local engine's names, all of them, and the constrained sampler's count (verl only)
    local = {*local, f"{p}/constraint_violations"}
    assert train[f"{p}/constraint_violations"] == 0.0
    uniform = {"train/uniform_groups", "train/uniform_groups_won"}  # the local trainer's too
    assert set(train) - {"step", "time"} == local | uniform
    assert set(val) - {"step", "time"} == {k.replace("train/", "val/", 1) for k in local
                                           if k.startswith("train/")}


def test_a_vllm_reply_ending_on_another_eos_id_is_not_cut(tokenizer, presets, tmp_path):
    """vLLM stops on every eos id of generation_config.json: such a reply is finished."""
    from transformers import GenerationConfig

    from agentrl.engines import SamplingParams
    from agentrl.rollout import run_episode
    from agentrl.verl.agent_loop import ResponseBudget, ServerLLM, generation_config

    other = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    GenerationConfig(eos_token_id=[end_of_turn_ids(tokenizer)[0], other]).save_pretrained(tmp_path)
    assert generation_config(str(tmp_path)).eos_token_id[1] == other
    config = dataclasses.replace(presets["simpleSokobanAgent"], max_turns=2)
    game = play_script(tokenizer, "simpleSokobanAgent", config, 0, ["no format", "no format"])
    server = FakeServerManager(tokenizer).load([game])
    server.eos = other  # the server ends its replies with the second eos id
    budget = ResponseBudget(4096)
    llm = ServerLLM(server, {"temperature": 1.0}, budget,
                    end_of_turn_ids(tokenizer, generation_config(str(tmp_path))), request_id="r")
    trajectory = asyncio.run(run_episode(Agent(config), 0, llm, tokenizer,
                                         SamplingParams(max_new_tokens=64),
                                         max_context_tokens=8192))
    first = server.calls[0].token_ids
    assert first[-1] == other and trajectory.metrics["truncated_turns"] == 0
    assert trajectory.response_ids[:len(first)] == first
    observation = trajectory.response_ids[len(first):trajectory.turn_end_positions[1]]
    assert end_of_turn_ids(tokenizer)[0] not in observation[:1]  # no closing token added
    # the budget (replies only here: no BudgetedAgent) counted no closing token
    assert budget.used == sum(len(call.token_ids) for call in server.calls)


def test_manager_writes_the_local_engines_episode_records(workers, fake, tmp_path, tokenizer,
                                                          presets, capsys):
    from agentrl.trainers.episode_log import read_episodes

    preset, won, lost, outputs = manager_rollouts(workers, fake, tmp_path, tokenizer, presets,
                                                  agentrl_log_episodes=3)
    for output in outputs:  # the text goes no further than the manager
        assert agent_loop.EPISODE_RECORD not in output.non_tensor_batch
    records = read_episodes(tmp_path / "run")[1]
    train = [r for r in records if r["split"] == "train"]
    val = [r for r in records if r["split"] == "val"]
    assert len(train) == 3  # of 4 episodes: trainer.log_episodes, never the whole batch
    assert [r["seed"] for r in train[:2]] == [won.seed, lost.seed]  # a new game before a repeat
    assert sorted(r["seed"] for r in val) == [won.seed, lost.seed]  # the padding copy is left out
    by_seed = {r["seed"]: r for r in val}
    for game in (won, lost):
        record = by_seed[game.seed]
        assert record["step"] == 1 and record["preset"] == preset
        assert [t["reply"] for t in record["turns"]] == [
            fake.tokenizer.decode(call.token_ids, skip_special_tokens=True)
            for call in episode_calls(fake, game)]
        assert [t["reward"] for t in record["turns"]] == pytest.approx(game.rewards)
        assert record["turns"][0]["format_error"] and "#" in record["turns"][0]["observation"]
        assert record["success"] == game.success
    moves = by_seed[won.seed]["turns"][1]["actions"]
    assert len(moves) == 1 and moves[0]["valid"]
    assert f"agentrl val sample {preset} seed {won.seed}" in capsys.readouterr().out

    from agentrl.report.data import run_data  # a verl run folder makes the local run's report

    data = run_data(tmp_path / "run", play_references=False)
    assert data["episodes"]["1"] == records and data["presets"] == [preset]
    assert [step for step, _ in data["series"][f"val/{preset}/success"]] == [1]


def episode_calls(fake, game) -> list:
    """The server calls of one episode of ``game`` (its first request's prompt is the game's)."""
    return next(calls for calls in fake.episodes().values()
                if calls[0].prompt_ids == game.prompt_ids)


class AbortingServer:
    """Answers ``aborted`` (with a partial reply, as vLLM does when verl aborts requests around
    a weight update) ``aborts`` times, then completes."""

    def __init__(self, aborts: int):
        self.aborts, self.calls = aborts, 0

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        self.calls += 1
        if self.calls <= self.aborts:
            return TokenOutput(token_ids=[7], log_probs=[-9.0], stop_reason="aborted")
        return TokenOutput(token_ids=[5, 6, 2], log_probs=[-1.0, -1.0, -1.0],
                           stop_reason="completed")


def test_an_aborted_reply_is_asked_again_not_trained_on():
    from agentrl.engines.local import SamplingParams

    server = AbortingServer(aborts=2)
    llm = agent_loop.ServerLLM(server, {"temperature": 1.0}, agent_loop.ResponseBudget(100),
                               end_of_turn=[2], request_id="r")
    ids, logprobs = asyncio.run(llm.generate([1, 2, 3], SamplingParams(max_new_tokens=8)))
    assert (ids, logprobs, server.calls) == ([5, 6, 2], [-1.0, -1.0, -1.0], 3)
    assert llm.budget.used == 3

    always = agent_loop.ServerLLM(AbortingServer(aborts=99), {}, agent_loop.ResponseBudget(100),
                                  end_of_turn=[2], request_id="r")
    with pytest.raises(RuntimeError, match="aborted"):
        asyncio.run(always.generate([1], SamplingParams(max_new_tokens=8)))


# -- context windows: one row per window (V1) ---------------------------------------------------
WINDOWED_PRESET = "simpleSokobanAgent"
WINDOWED_SCRIPT = ["no format", "still no format", ORACLE, ORACLE, ORACLE]


def windowed_game(tokenizer, presets, history_window: int = 1):
    config = one_action_per_turn(presets, WINDOWED_PRESET, history_window=history_window)
    game = play_script(tokenizer, WINDOWED_PRESET, config, 1, WINDOWED_SCRIPT)
    assert len(game.rewards) >= 4
    return game


def test_v1_rows_are_the_windows_with_the_whole_episodes_returns(workers, fake, tmp_path,
                                                                 tokenizer, presets):
    from verl import DataProto
    from verl.trainer.ppo.core_algos import AdvantageEstimator
    from verl.trainer.ppo.ray_trainer import compute_advantage

    game = windowed_game(tokenizer, presets)
    result = rollout(workers, fake, "v1", tmp_path, [game], n=1)
    calls = fake.calls
    assert len(calls) == len(game.replies)
    # history_window 1: the first row holds turns 1-2, then one turn a row (2 blocks would be kept)
    assert len(result.samples) == len(calls) - 1
    firsts = [0, *range(2, len(calls))]  # the call of each row's first reply
    model_tokens, returns = [], []
    for sample, first in zip(result.samples, firsts):
        assert sample.prompt == calls[first].prompt_ids  # the context it was sampled from
        model_tokens += [t for t, m in zip(sample.response, sample.mask) if m]
    assert model_tokens == [t for call in calls for t in call.token_ids]  # each exactly once
    earlier = calls[-2].prompt_ids + calls[-2].token_ids
    assert calls[-1].prompt_ids[:len(earlier)] != earlier  # an older turn left the context

    mask = result.padded["response_mask"]
    values = torch.where(mask.bool(), torch.tensor(0.5), torch.tensor(9.0))  # 9: never read
    data = DataProto.from_dict(tensors={
        "response_mask": mask, "values": values, "token_level_rewards": result.padded["rm_scores"]})
    gae = compute_advantage(data, adv_estimator=AdvantageEstimator.GAE, gamma=1.0, lam=1.0,
                            config=result.config.algorithm).batch["returns"]
    for row in range(len(result.samples)):
        returns += gae[row][mask[row].bool()].tolist()
    by_hand = [sum(game.rewards[turn:]) for turn, call in enumerate(calls)
               for _ in call.token_ids]  # each reply's tokens: the return from its turn on
    assert returns == pytest.approx(by_hand, abs=1e-5)
    assert sum(result.samples[-1].rm_scores) == pytest.approx(game.rewards[-1])


@pytest.mark.parametrize("estimator, split", [("grpo", "train"), ("gae", "val")])
def test_the_last_window_carries_the_whole_episode_where_verl_reads_only_it(
        estimator, split, workers, fake, tmp_path, tokenizer, presets):
    """verl's V1 GRPO reads an episode's last row alone and gives every row its advantage, and
    its validation reports the last row's rewards."""
    game = windowed_game(tokenizer, presets)
    result = rollout(workers, fake, "v1", tmp_path, [game], n=1, estimator=estimator,
                     split=split)
    assert len(result.samples) == len(game.replies) - 1
    *earlier, last = result.samples
    assert all(not any(sample.rm_scores) for sample in earlier)
    assert sum(last.rm_scores) == pytest.approx(sum(game.rewards))
    model = [i for i, kept in enumerate(last.mask) if kept]
    assert last.rm_scores[model[-1]] == pytest.approx(sum(game.rewards))


def test_every_windowed_row_fits_verls_tensors(workers, fake, tmp_path, tokenizer,
                                               presets):
    """A response width that holds the newest turn block and a reply, not two blocks: the
    context cap, not the history window (3), drops the older turns, and no row overflows."""
    game = windowed_game(tokenizer, presets, history_window=3)
    reply = game.config.max_response_tokens  # a reply's most tokens
    block = max(len(tokenizer.encode(text, add_special_tokens=False)) + 1 + len(observation)
                for text, observation in zip(game.replies, game.observations))
    prompt_length, response_length = len(game.prompt_ids) + 2 * block, block + reply
    result = rollout(workers, fake, "v1", tmp_path, [game], n=1, prompt_length=prompt_length,
                     response_length=response_length)
    assert len(fake.calls) == len(game.replies)  # the whole game was played
    assert len(result.samples) == len(game.replies) - 1  # a window from the third turn on
    for sample in result.samples:
        assert len(sample.prompt) <= prompt_length
        assert len(sample.response) <= response_length
    cap = windowed_context_tokens(len(game.prompt_ids), 4096, prompt_length, response_length,
                                  reply)
    assert cap == len(game.prompt_ids) + response_length
    assert all(len(call.prompt_ids) + reply <= cap for call in fake.calls)


def test_every_window_ends_on_a_model_token_also_after_a_cut_reply(workers, fake, tmp_path,
                                                                   tokenizer, presets):
    """A reply cut at its token cap gets a mask-0 closing token, which opens the next window's
    prompt, not the end of this window's row: a row ending on it would pass the context cap by
    one token."""
    config = one_action_per_turn(presets, WINDOWED_PRESET, history_window=1)
    long_reply = " ".join(["left"] * 100)  # the first window's last reply (turns 1-2)
    game = play_script(tokenizer, WINDOWED_PRESET, config, 1,
                       [WINDOWED_SCRIPT[0], long_reply, *WINDOWED_SCRIPT[1:]])
    result = rollout(workers, fake, "v1", tmp_path, [game], n=1)
    assert len(fake.calls[1].token_ids) == config.max_response_tokens  # cut, no end of turn
    assert len(result.samples) == len(game.replies) - 1
    for sample in result.samples:
        assert sample.mask[-1] == 1
    eos = end_of_turn_ids(tokenizer)[0]
    assert result.samples[1].prompt[len(game.prompt_ids) + config.max_response_tokens] == eos


def test_a_windowed_episode_refuses_a_verl_config_that_breaks_its_returns(
        workers, fake, tmp_path, tokenizer, presets, caplog):
    """``verl.overrides`` reach verl unchecked: the loop itself refuses lam < 1 with windows."""
    game = windowed_game(tokenizer, presets)
    worker, config, queue = workers("v1", 1, PROMPT_LENGTH, RESPONSE_LENGTH, "gae", 0.9)
    fake.load([game])
    batch = dataset_batch([task_row(game, 0, max_context_tokens=4096)], tmp_path,
                          worker.tokenizer, config)
    with pytest.raises(AssertionError, match="sessions failed"):
        asyncio.run(v1_batch(queue, worker, batch))
    assert not fake.calls  # refused before the first reply
    assert "algorithm.lam=0.9 would not give the whole episode's returns" in caplog.text


def test_a_windowed_task_needs_the_v1_trainer(tokenizer, presets):
    game = windowed_game(tokenizer, presets)
    extra_info = task_row(game, 0, max_context_tokens=4096)["extra_info"]
    with pytest.raises(ValueError, match=r"history_window=1, context='history'; not allowed "
                                         r"on verl's legacy trainer.*allowed: history_window 0 "
                                         r"with context 'history', or trainer.use_v1=true"):
        EpisodeTask.from_extra_info(extra_info)
    task = EpisodeTask.from_extra_info(extra_info, windows=True)
    assert task.agent_config == dataclasses.replace(game.config, held_out_of=None)


# -- context: state: each turn its own chat, one row a turn (V1) ----------------------------------
STATE_PRESET = "tightBlocksworldTurnsAgent"  # the default preset: context: state


class ReplyTexts:
    """An ``llm`` for the local rollout answering ``texts`` in order, token for token as the
    fake server does (the text's ids and the end-of-turn id); records every prompt."""

    def __init__(self, tokenizer, texts):
        self.tokenizer, self.texts, self.calls = tokenizer, list(texts), []
        self.eos = end_of_turn_ids(tokenizer)[0]

    async def generate(self, prompt_ids, sampling):
        self.calls.append(list(prompt_ids))
        ids = self.tokenizer.encode(self.texts[len(self.calls) - 1], add_special_tokens=False)
        ids = [*ids, self.eos]
        return ids, [0.0] * len(ids)


def test_a_state_context_gives_the_same_rows_on_verl_and_the_local_rollout(
        workers, fake, tmp_path, tokenizer, presets):
    """verl's loop plays the episode through the same Agent and run_episode as the local
    engine: every turn is sampled from its own chat (the Agent's, through the chat template),
    and each is one row with that chat as its prompt, on both."""
    from agentrl.engines import SamplingParams
    from agentrl.rollout import run_episode
    from agentrl.rollout.batch import context_samples
    from agentrl.rollout.episode import first_prompt_ids

    config = presets[STATE_PRESET]
    assert config.context == "state"
    game = play_script(tokenizer, STATE_PRESET, config, 3, [ORACLE] * config.max_turns)
    assert game.success and len(game.replies) >= 2
    chats = []
    with Agent(config) as agent:
        chat = agent.reset(seed=3)
        for reply in game.replies:
            chats.append(chat)
            chat = Agent.next_chat(chat, reply, agent.step(reply))
    expected = [first_prompt_ids(tokenizer, chat) for chat in chats]

    result = rollout(workers, fake, "v1", tmp_path, [game], n=1)
    assert [call.prompt_ids for call in fake.calls] == expected
    assert [sample.prompt for sample in result.samples] == expected  # a row a turn
    for sample, call in zip(result.samples, fake.calls):
        assert [t for t, m in zip(sample.response, sample.mask) if m] == call.token_ids
    assert sum(sum(sample.rm_scores) for sample in result.samples[-1:]) == pytest.approx(
        game.rewards[-1])

    llm = ReplyTexts(tokenizer, game.replies)
    with Agent(config) as agent:
        local = asyncio.run(run_episode(agent, 3, llm, tokenizer,
                                        SamplingParams(max_new_tokens=64),
                                        max_context_tokens=4096, preset=STATE_PRESET))
    assert llm.calls == expected
    assert [row.prompt_ids for row in context_samples(local)] == expected

    extra_info = task_row(game, 0, max_context_tokens=4096)["extra_info"]
    with pytest.raises(ValueError, match=r"context='state'; not allowed on verl's legacy"):
        EpisodeTask.from_extra_info(extra_info)
