"""agentrl sft: oracle demonstrations in the RL layout, exact accumulation, and a tiny model that
learns to replay the oracle.

The replay test fails when the loss mask is off by one token: run it with
``AGENTRL_SFT_MASK_SHIFT=1`` (the mask then covers each reply token's successor instead, as an
off-by-one between logits and labels would) and the greedy replies no longer match.
"""

from __future__ import annotations

import json

import asyncio
import os

import pytest
import torch

from agentrl.agents import Agent
from agentrl.config import build_config, compose_config
from agentrl.engines import BatchingLLM, SamplingParams
from agentrl.envs.splits import split_seeds
from agentrl.rollout import run_episode, to_batch
from agentrl.rollout.episode import first_prompt_ids
from agentrl.rollout.demonstrations import demonstration_messages, play_demonstrations
from agentrl.trainers import imitation, sft

EPISODES = 4
TURNS = 2
REPLAY_PRESET = {  # one move a turn, plain answers: short replies a tiny model can memorize
    "game": "Sokoban", "env_kwargs": {"preset": "6x6"}, "answer_format": "plain",
    "enable_think": False, "max_turns": TURNS, "max_actions_per_turn": 1,
    "max_actions_all_turns": TURNS, "max_response_tokens": 4,
}


def sft_config(tmp_path, **sft_keys):
    base = compose_config(["model=tiny"]).to_dict()
    base["agents"] = {"replay": REPLAY_PRESET}
    base.update(run_dir=str(tmp_path / "run"), seed=0, threads=1)
    base["train"].update(presets=["replay"])
    base["val"].update(presets=["replay"], group_num=2)
    base["rollout"].update(max_new_tokens=4, max_context_tokens=1024, prefix_cache_tokens=0)
    base["sft"].update({"episodes": EPISODES, "epochs": 80, "lr": 3e-3,
                        "mini_batch_size": EPISODES, "micro_batch_size": EPISODES,
                        "evaluate": False, **sft_keys})
    return build_config(base)


def replay(model, tokenizer, config, seeds):
    """Greedy replies of ``model`` on the demonstration seeds, as text per episode."""
    presets = config.playing_presets(["replay"], config.rollout.max_new_tokens)

    async def play():
        llm = BatchingLLM(model, tokenizer, max_batch=8, max_wait_ms=1)
        try:
            return await asyncio.gather(*(
                run_episode(Agent(presets[0][1]), seed, llm, tokenizer,
                            SamplingParams(greedy=True, max_new_tokens=4),
                            max_context_tokens=1024) for seed in seeds))
        finally:
            await llm.aclose()

    return [[turn.text for turn in t.turns] for t in asyncio.run(play())]


def shifted_by_one(batch):
    """The response mask moved one token later (what an off-by-one label shift trains on)."""
    mask = batch["response_mask"]
    return torch.nn.functional.pad(mask, (1, 0))[:, :-1]


@pytest.mark.slow
def test_sft_replays_the_oracle_on_its_seeds(tmp_path, monkeypatch, one_torch_thread):
    if os.environ.get("AGENTRL_SFT_MASK_SHIFT") == "1":
        monkeypatch.setattr(imitation, "loss_mask", shifted_by_one)
    config = sft_config(tmp_path)
    trainer = sft.SFTTrainer(config)
    try:
        demos = trainer.demonstrations()
        oracle = [[turn.text for turn in t.turns] for t in demos]
        assert len({turns[0] for turns in oracle}) >= 3, f"seeds too alike to test: {oracle}"
        untrained = replay(trainer.model, trainer.tokenizer, config, [t.seed for t in demos])
        assert untrained != oracle
        losses = trainer.train(demos)
        replayed = replay(trainer.model, trainer.tokenizer, config, [t.seed for t in demos])
    finally:
        trainer.close()
    print("oracle", oracle, "replayed", replayed, "loss", losses[0], "->", losses[-1])
    assert replayed == oracle
    assert losses[-1] < 0.05 * losses[0]


def test_demonstrations_are_rl_episodes_of_the_oracle(tiny):
    """Same first prompt and layout as a model's episode; replies are the oracle's, masked 1."""
    _, tokenizer = tiny
    config = build_config({"agents": {"replay": REPLAY_PRESET}, "train": {"presets": ["replay"]},
                           "val": {"presets": ["replay"]}})
    presets = config.playing_presets(["replay"], 4)
    seeds = split_seeds("train", 3, sft.DEMO_SEED_OFFSET)
    demos = asyncio.run(play_demonstrations(presets, tokenizer, seeds, max_context_tokens=1024,
                                            max_new_tokens=4))
    assert [t.seed for t in demos] == seeds  # pure oracle episodes are all kept
    for demo in demos:
        messages, used_random = demonstration_messages(presets[0][1], demo.seed)
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        assert not used_random and [t.text for t in demo.turns] == replies
        ends = demo.turn_end_positions
        for turn, end in zip(demo.turns, ends):  # reply + end-of-turn token, learned
            start = end - len(turn.response_ids) + 1
            assert demo.response_mask[start:end + 1] == [1] * len(turn.response_ids)
            assert tokenizer.decode(demo.response_ids[start:end + 1],
                                    skip_special_tokens=True) == turn.text
        assert sum(demo.response_mask) == sum(len(t.response_ids) for t in demo.turns)
    with Agent(presets[0][1]) as agent:  # the opening a model's episode gets
        assert demos[0].prompt_ids == first_prompt_ids(tokenizer, agent.reset(seed=seeds[0]))


def test_random_turns_are_played_but_not_learned(tiny):
    _, tokenizer = tiny
    preset = {**REPLAY_PRESET, "max_turns": 8, "max_actions_all_turns": 8}
    config = build_config({"agents": {"replay": preset}, "train": {"presets": ["replay"]},
                           "val": {"presets": ["replay"]}})
    presets = config.playing_presets(["replay"], 4)
    seeds = split_seeds("train", 12, sft.DEMO_SEED_OFFSET)
    demos = asyncio.run(play_demonstrations(presets, tokenizer, seeds, max_context_tokens=2048,
                                            max_new_tokens=4, random_action_share=0.3, seed=3))
    with_random = [t for t in demos
                   if any(t.response_mask[end] == 0 for end in t.turn_end_positions)]
    assert with_random, "a share of 0.3 leaves a random turn in some kept episode"
    for t in with_random:
        assert t.success  # unsolved episodes with a random turn are dropped
        learned = [end for end in t.turn_end_positions if t.response_mask[end] == 1]
        assert learned  # the oracle's turns (the recovery) are learned
        turns = {end: turn for end, turn in zip(t.turn_end_positions, t.turns)}
        assert sum(t.response_mask) == sum(len(turns[end].response_ids) for end in learned)


def replay_demonstrations(tokenizer, count: int = 6):
    config = build_config({"agents": {"replay": REPLAY_PRESET}, "train": {"presets": ["replay"]},
                           "val": {"presets": ["replay"]}})
    presets = config.playing_presets(["replay"], 4)
    return asyncio.run(play_demonstrations(presets, tokenizer, split_seeds("train", count),
                                           max_context_tokens=1024, max_new_tokens=4))


def loss_and_gradients(model, batch, rows, micro, shared_prefix_tokens=0):
    model.zero_grad(set_to_none=True)
    loss = imitation.accumulate_gradients(model, batch, rows, micro, shared_prefix_tokens)
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return loss, grads


def test_accumulation_is_exact(tiny):
    """The gradient of a mini-batch does not depend on how it is cut into micro-batches."""
    model, tokenizer = tiny
    demos = replay_demonstrations(tokenizer)
    lengths = {sum(t.response_mask) for t in demos}
    assert len(lengths) > 1, "episodes of equal token counts would hide a per-micro mean"
    batch = to_batch(demos, tokenizer.pad_token_id)
    rows = torch.arange(len(demos))
    loss_1, g_1 = loss_and_gradients(model, batch, rows, 1)
    loss_all, g_all = loss_and_gradients(model, batch, rows, len(demos))
    assert loss_1 == pytest.approx(loss_all, rel=1e-5)
    for a, b in zip(g_1, g_all):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


def test_a_shared_system_prompt_runs_once_with_the_same_loss_and_gradients(tiny):
    """Demonstrations of different games share the system prompt and the rules: SFT reads them
    once per micro-batch (agentrl.trainers.shared_prefix) and learns exactly the same."""
    from agentrl.trainers.shared_prefix import shared_prefix_length

    model, tokenizer = tiny
    batch = to_batch(replay_demonstrations(tokenizer), tokenizer.pad_token_id)
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
    assert shared_prefix_length(inputs, batch["responses"].shape[1]) >= 32
    rows = torch.arange(batch["responses"].shape[0])
    read = []
    embed = model.get_input_embeddings().register_forward_hook(
        lambda _m, args, _out: read.append(args[0].numel()))
    try:
        plain_loss, plain = loss_and_gradients(model, batch, rows, len(rows))
        plain_read = sum(read)
        read.clear()
        shared_loss, shared = loss_and_gradients(model, batch, rows, len(rows), 32)
    finally:
        embed.remove()
    assert sum(read) < 0.6 * plain_read  # the prefix ran once, not once per row
    assert shared_loss == pytest.approx(plain_loss, rel=1e-5)
    for a, b in zip(plain, shared):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_checkpoint_is_a_plain_model_that_train_and_eval_start_from(tmp_path):
    """LoRA SFT saves the merged weights in the checkpoint format; ``model=<checkpoint>`` loads
    them (the train config accepts it and load_model reads its actor/ folder)."""
    from agentrl.cli.eval import model_path
    from agentrl.models import load_model

    config = sft_config(tmp_path, epochs=2, lr=1e-2, episodes=2, mini_batch_size=2,
                        micro_batch_size=1, evaluate=True)
    config = build_config({**config.to_dict(), "lora": {"rank": 4, "alpha": 8}})
    trainer = sft.SFTTrainer(config)
    try:
        result = trainer.fit()
        batch = to_batch(trainer.demonstrations(), trainer.tokenizer.pad_token_id)
        trained = trainer.model  # merged by save: a plain model now
        with torch.no_grad():
            expected = imitation.masked_logprobs(trained, batch, batch["response_mask"])
    finally:
        trainer.close()
    assert result.updates == 2 and result.checkpoint.parent.name == "checkpoints"
    assert result.before.presets == result.after.presets == ["replay"]
    summary = json.loads((result.checkpoint.parent.parent / sft.SUMMARY_FILE).read_text())
    assert len(summary["losses"]) == result.updates  # the report draws one point an update
    assert summary["losses"][-1] == summary["last_loss"]
    train_config = compose_config(["model=tiny", f"model.name={result.checkpoint}"])
    loaded, _ = load_model(train_config.model.name)
    assert not any("lora" in name for name, _ in loaded.named_parameters())
    with torch.no_grad():
        torch.testing.assert_close(imitation.masked_logprobs(loaded, batch, batch["response_mask"]),
                                   expected)
        base, _ = load_model("tiny")
        assert not torch.allclose(imitation.masked_logprobs(base, batch, batch["response_mask"]),
                                  expected, atol=1e-3)  # the adapters did change the model
    assert model_path(str(result.checkpoint.parent.parent)).endswith("actor")  # agentrl eval


def test_cli_prints_the_config_and_names_bad_keys(capsys):
    from agentrl import cli

    assert cli.main(["sft", "--print-config", "sft.episodes=5"]) == 0
    assert "episodes: 5" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["sft", "sft.epochs=0"])
    assert "sft.epochs=0 is not allowed" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_runs_sft_and_prints_the_next_command(tmp_path, capsys, one_torch_thread):
    from agentrl import cli

    assert cli.main(["sft", "model=tiny", f"run_dir={tmp_path}", "sft.presets=[banditAgent]",
                     "val.presets=[banditAgent]", "val.group_num=2", "sft.episodes=2",
                     "sft.epochs=1", "sft.mini_batch_size=2", "threads=1",
                     "rollout.max_new_tokens=8"]) == 0
    out = capsys.readouterr().out
    assert "SFT: 2 demonstrations" in out and "held-out greedy success after: banditAgent" in out
    assert f"agentrl train model={tmp_path / 'sft' / 'checkpoints' / 'step_000001'}" in out
