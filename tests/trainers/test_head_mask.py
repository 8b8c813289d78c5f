"""``response_logprobs(head_mask=...)``: the LM head runs only at the model's tokens, and the
log-probs, entropy and gradients there are those of the full-width head (observation tokens,
most of a multi-turn response, get 0 and no vocabulary-wide logits)."""

from __future__ import annotations

import pytest
import torch
from update_fixtures import relative_difference, two_turn_batch

from agentrl.trainers.policy import response_logprobs

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def with_constraints(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every model token constrained to itself and two other ids (as a grammar would)."""
    mask = batch["response_mask"].bool()
    kind = torch.where(mask, 1, -1)
    ids = torch.stack([batch["responses"], batch["responses"] + 1, batch["responses"] + 2], -1)
    return {**batch, "constraint_kind": kind, "constraint_ids": torch.where(mask[..., None], ids, -1)}


def with_common_start(batch: dict[str, torch.Tensor], tokens: int = 2) -> dict[str, torch.Tensor]:
    """Every prompt starting with the same ``tokens`` ids (a group's shared first prompt)."""
    prompts, ids = batch["prompts"].clone(), batch["input_ids"].clone()
    width = prompts.shape[1]
    for row in range(len(prompts)):
        start = width - int(batch["attention_mask"][row, :width].sum())
        prompts[row, start:start + tokens] = ids[row, start:start + tokens] = torch.arange(
            11, 11 + tokens)
    return {**batch, "prompts": prompts, "input_ids": ids}


def head_rows(model) -> list[int]:
    """Rows the output embedding reads, per call."""
    seen: list[int] = []
    model.get_output_embeddings().register_forward_hook(
        lambda module, args, out: seen.append(args[0].reshape(-1, args[0].shape[-1]).shape[0]))
    return seen


@pytest.mark.parametrize("constrained", [False, True], ids=["free", "constrained"])
@pytest.mark.parametrize("share", [0, 2], ids=["unshared", "shared-prefix"])
def test_the_head_at_model_tokens_gives_the_same_logprobs_entropy_and_gradients(
        tiny, constrained, share):
    model = tiny[0]
    batch = with_common_start(two_turn_batch(4))
    batch = with_constraints(batch) if constrained else batch
    mask = batch["response_mask"].bool()
    assert (~mask & batch["attention_mask"][:, -mask.shape[1]:].bool()).any()  # observations
    rows = head_rows(model)
    prefix_runs: list[int] = []
    model.get_input_embeddings().register_forward_hook(
        lambda module, args, out: prefix_runs.append(args[0].shape[0]))
    results = {}
    for name, head_mask in (("full", None), ("masked", batch["response_mask"])):
        model.zero_grad(set_to_none=True)
        logprobs, entropy, features = response_logprobs(
            model, batch, temperature=0.7, with_entropy=True, entropy_grad=True,
            with_features=True, shared_prefix_tokens=share, head_mask=head_mask)
        ((logprobs * mask).sum() + 0.1 * (entropy * mask).sum()).backward()
        results[name] = (logprobs.detach(), entropy.detach(), features.detach(),
                         [p.grad.clone() for p in model.parameters() if p.grad is not None])
    full, masked = results["full"], results["masked"]
    assert rows[-1] == int(mask.sum()) < rows[0]  # the head read model tokens only
    assert (1 in prefix_runs) == bool(share)  # a batch-1 pass: the shared prefix ran once
    torch.testing.assert_close(masked[0][mask], full[0][mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(masked[1][mask], full[1][mask], atol=1e-5, rtol=0)
    assert bool((masked[0][~mask] == 0).all()) and bool((masked[1][~mask] == 0).all())
    torch.testing.assert_close(masked[2], full[2], atol=1e-5, rtol=0)
    assert relative_difference(masked[3], full[3]) < 1e-5
    model.zero_grad(set_to_none=True)


def test_a_head_that_is_more_than_its_embedding_runs_full_width(tiny, monkeypatch):
    """Where logits are not the output embedding alone (soft-capping, scaling), the full head
    runs, and the kept positions are the same."""
    import agentrl.trainers.policy as policy

    model, batch = tiny[0], two_turn_batch(4)
    mask = batch["response_mask"].bool()
    with torch.no_grad():
        plain = response_logprobs(model, batch, head_mask=batch["response_mask"])[0]
        monkeypatch.setattr(policy, "plain_head", lambda model: False)
        rows = head_rows(model)
        full = response_logprobs(model, batch, head_mask=batch["response_mask"])[0]
    assert rows[-1] == batch["responses"].numel() + len(batch["responses"])  # R + 1 a row
    torch.testing.assert_close(full, plain, atol=1e-5, rtol=0)
    assert bool((full[~mask] == 0).all())
