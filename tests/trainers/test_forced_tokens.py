"""A token the constrained-decoding mask forces (one allowed id) carries no choice: it stays in
the context but not in the actor's token means. A reply whose forced tokens are model tokens
trains exactly like the same reply with those tokens counted out (policy loss, entropy, KL)."""

from __future__ import annotations

import pytest
import torch

from agentrl.trainers.policy import choice_mask, response_logprobs
from test_accumulation import configure
from update_fixtures import GradientRecorder, relative_difference, tiny_trainer, two_turn_batch


@pytest.fixture(scope="module")
def trainer(tmp_path_factory, one_torch_thread):
    return tiny_trainer(tmp_path_factory.mktemp("forced"), "actor.entropy_coeff=0.01",
                        "actor.use_kl_loss=true")


def constrained_batch() -> dict[str, torch.Tensor]:
    """Two-turn episodes whose model tokens are constrained: every other one forced (its own id
    the only one allowed), the others a choice among three ids."""
    batch = two_turn_batch(4)
    model = batch["response_mask"].bool()
    forced = model & (torch.arange(model.shape[1]) % 2 == 0)
    responses = batch["responses"]
    choices = torch.stack([responses, responses + 1, responses + 2], -1)
    ids = torch.where(forced[..., None], torch.stack([responses, -torch.ones_like(responses),
                                                     -torch.ones_like(responses)], -1), choices)
    return {**batch, "constraint_kind": torch.where(model, 1, -1),
            "constraint_ids": torch.where(model[..., None], ids, -1)}


def with_inputs(trainer, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    mask = batch["response_mask"].float()
    noise = lambda: torch.randn(mask.shape, generator=generator) * mask  # noqa: E731
    with torch.no_grad():
        logprobs = response_logprobs(trainer.actor, batch)[0]
    return {**batch, "old_logprobs": logprobs + 0.1 * noise(),
            "ref_logprobs": logprobs + 0.2 * noise(), "advantages": noise()}


def actor_epoch(trainer, batch):
    params = [p for p in trainer.actor.parameters() if p.requires_grad]
    recorder = GradientRecorder(trainer.actor_optim)
    saved = [p.detach().clone() for p in params]
    metrics, skipped = trainer.updater._epochs(batch, trainer.updater._actor_micro, trainer.actor_optim, params,
                                       grad_clip=1e9, epochs=1, role="actor")
    with torch.no_grad():
        for p, s in zip(params, saved):
            p.copy_(s)
    assert skipped == 0
    return recorder.steps[0], metrics


def test_the_choice_mask_drops_only_tokens_with_one_allowed_id():
    batch = constrained_batch()
    mask = choice_mask(batch)
    model = batch["response_mask"].bool()
    forced = model & (torch.arange(model.shape[1]) % 2 == 0)
    assert mask.bool().tolist() == (model & ~forced).tolist()
    free = {k: v for k, v in batch.items() if not k.startswith("constraint_")}
    assert choice_mask(free).tolist() == batch["response_mask"].float().tolist()


def test_forced_log_probs_are_zero_under_the_mask(trainer):
    batch = constrained_batch()
    with torch.no_grad():
        logprobs, entropy, _ = response_logprobs(trainer.actor, batch, with_entropy=True)
    forced = batch["response_mask"].bool() & ~choice_mask(batch).bool()
    assert forced.any()
    assert logprobs[forced].abs().max() == 0 and entropy[forced].abs().max() == 0


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_forced_tokens_leave_the_actor_loss_and_its_means_unchanged(trainer, mode):
    configure(trainer, mode, 2)
    batch = with_inputs(trainer, constrained_batch())
    counted_out = {**batch, "response_mask": choice_mask(batch).long()}
    grads, metrics = actor_epoch(trainer, batch)
    expected_grads, expected = actor_epoch(trainer, counted_out)
    assert relative_difference(grads, expected_grads) < 1e-5
    for key in ("actor/pg_loss", "actor/entropy", "actor/kl_loss"):
        assert metrics[key] == pytest.approx(expected[key], rel=1e-5), key
