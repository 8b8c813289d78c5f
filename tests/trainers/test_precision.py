"""bfloat16 on the local trainer: float32 master weights under autocast, in the update and in
the sampler. Ten small-lr steps move the weights as float32 steps do (casting the weights to
bf16 made AdamW's updates round away: ~1.5% of weights moved at lr 1e-6)."""

from __future__ import annotations

import pytest
import torch

from agentrl.trainers.timing import StageTimer
from agentrl.trainers.policy import response_logprobs
from update_fixtures import tiny_trainer, two_turn_batch

STEPS = 10


def ten_steps(trainer) -> tuple[float, float]:
    """(fraction of actor weights changed, norm of the change) over ten updates on one batch."""
    params = [p for p in trainer.actor.parameters() if p.requires_grad]
    before = [p.detach().float().clone() for p in params]
    batch = two_turn_batch(4)
    for step in range(1, STEPS + 1):
        trainer.step = step
        metrics = trainer.updater.update(batch, StageTimer())
        assert metrics["guard/skipped_updates"] == 0
    changed = sum(int((p.detach().float() != b).sum()) for p, b in zip(params, before))
    total = sum(b.numel() for b in before)
    norm = torch.cat([(p.detach().float() - b).flatten() for p, b in zip(params, before)]).norm()
    return changed / total, float(norm)


@pytest.mark.slow
def test_bf16_steps_move_the_weights_like_fp32(tmp_path, one_torch_thread):
    settings = ("actor.lr=1e-6", "algorithm.adv_estimator=grpo", "actor.micro_batch_size=2")
    fp32 = ten_steps(tiny_trainer(tmp_path / "fp32", *settings))
    bf16_trainer = tiny_trainer(tmp_path / "bf16", *settings, "model.dtype=bfloat16")
    assert all(p.dtype == torch.float32 for p in bf16_trainer.actor.parameters())
    bf16 = ten_steps(bf16_trainer)
    print("changed fraction, update norm: fp32", fp32, "bf16", bf16)
    assert fp32[0] > 0.05  # the batch's tokens' embeddings and every dense weight move
    assert bf16[0] == pytest.approx(fp32[0], rel=0.1)
    assert bf16[1] == pytest.approx(fp32[1], rel=0.2)


def test_sampler_and_trainer_compute_in_the_same_precision(tmp_path, one_torch_thread):
    """The sampler's log-probs match the trainer's recompute (both under bf16 autocast) far
    closer than a float32 recompute of the same replies does."""
    trainer = tiny_trainer(tmp_path, "model.dtype=bfloat16")
    assert trainer.llm.compute_dtype == "bfloat16"
    with torch.no_grad():  # peaked logits, as a trained model's: rounding shows in log-probs
        trainer.actor.lm_head.weight.mul_(30)
    batch = two_turn_batch(1)
    prompt = batch["input_ids"][0][batch["attention_mask"][0] == 1].tolist()
    from agentrl.engines import SamplingParams

    gaps = []  # four sampled replies: one draw's gap ratio varies with the tokens it draws
    for ids, sampled in trainer.llm.generate_batch([prompt] * 4,
                                                   SamplingParams(max_new_tokens=48)):
        sequence = {"input_ids": torch.tensor([prompt + ids]),
                    "attention_mask": torch.ones(1, len(prompt) + len(ids), dtype=torch.long),
                    "position_ids": torch.arange(len(prompt) + len(ids))[None],
                    "responses": torch.tensor([ids])}
        with torch.no_grad():
            with trainer.updater._precision():
                same = response_logprobs(trainer.actor, sequence)[0][0]
            full = response_logprobs(trainer.actor, sequence)[0][0]
        sampled = torch.tensor(sampled)
        gaps.append(((sampled - same).abs(), (sampled - full).abs()))
    gap_same = torch.cat([same for same, _ in gaps]).mean()
    gap_full = torch.cat([full for _, full in gaps]).mean()
    print("mean gap: same precision", float(gap_same), "fp32 recompute", float(gap_full))
    assert gap_same < 0.5 * gap_full


def test_value_head_stays_float32_under_autocast(tiny):
    """Values of +-10 need more than bf16's three digits: the head is not autocast."""
    from agentrl.models.precision import compute_precision
    from agentrl.trainers.policy import ValueModel

    model, _ = tiny
    critic = ValueModel.from_actor(model, share_backbone=True)
    torch.nn.init.normal_(critic.head.weight, std=3.0)
    features = torch.randn(2, 5, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with compute_precision("cpu", "bfloat16"):
        autocast = critic.values_from(features)
    assert torch.equal(autocast, critic.values_from(features))


def test_float16_is_rejected_on_the_local_trainer_naming_the_key():
    from agentrl.config import compose_config

    with pytest.raises(ValueError, match=r"model.dtype='float16' is not allowed.*'bfloat16'"):
        compose_config(["model=tiny", "model.dtype=float16"])
