"""A micro-batch's shared prompt prefix runs once (agentrl.trainers.shared_prefix) and changes
nothing: log-probs, entropy, critic features and values within 1e-5, parameter gradients within
1e-5 relative, on rows of two groups whose prompts differ after a common system prompt, with
and without constrained-decoding masks, with LoRA, and for a critic with its own backbone. The
prefix really runs once (the embeddings read fewer tokens), and the trainer's whole update is
the same with the sharing on or off."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch

from agentrl.engines.constrained import TokenMask
from agentrl.rollout import to_batch
from agentrl.rollout.records import Trajectory
from agentrl.trainers.timing import StageTimer
from agentrl.trainers.microbatch import micro_rows, prefix_order
from agentrl.trainers.policy import ValueModel, backbone_of, checkpointing, response_logprobs
from agentrl.trainers.shared_prefix import plan_prefix_runs, shared_prefix_length
from update_fixtures import GradientRecorder, relative_difference, tiny_trainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SYSTEM = 24  # tokens every row starts with
ROOMS = (9, 14)  # then each group's own room: prompts differ after the system prompt


def shared_prompt_batch(*, constrained: bool = False, vocab: int = 1000) -> dict[str, torch.Tensor]:
    """Two groups of three two-turn episodes, interleaved (group 0, 1, 0, 1, ...): a common
    system prompt, a room per group (different lengths, so left padding differs), replies of
    different lengths with an observation between them; token masks on some reply tokens."""
    generator = torch.Generator().manual_seed(3)
    ids = lambda n: torch.randint(10, vocab, (n,), generator=generator).tolist()  # noqa: E731
    system, rooms = ids(SYSTEM), [ids(n) for n in ROOMS]
    trajectories = []
    for i in range(6):
        group = i % 2
        first, observation, second = 2 + i, 3, 1 + i % 3
        response = ids(first + observation + second)
        length = len(response)
        masks = None
        if constrained:  # allow a few ids (the sampled one among them), or forbid a few others
            masks = [None] * length
            for k in [*range(first), *range(first + observation, length)]:
                if k % 3 != 2:
                    allow = k % 2 == 0
                    chosen = response[k]
                    others = [(chosen + d) % vocab for d in (1, 7, 42)]
                    masks[k] = TokenMask(tuple([chosen, *others] if allow else others), allow)
        trajectories.append(Trajectory(
            preset="p", seed=group, group_index=group, prompt_ids=system + rooms[group],
            response_ids=response, response_mask=[1] * first + [0] * observation + [1] * second,
            response_logprobs=[-1.0] * length, turn_end_positions=[first - 1, length - 1],
            turn_rewards=[0.5 * i - 1.0, 1.0 - 0.3 * i], success=False,
            episode_return=-0.8 * i, num_turns=2, response_token_masks=masks))
    return to_batch(trajectories, pad_token_id=0, reward_placement="turn")


class TokenCounter:
    """Tokens the embedding layer of ``model`` reads (a forward hook)."""

    def __init__(self, model):
        self.tokens = 0
        model.get_input_embeddings().register_forward_hook(self._count)

    def _count(self, module, args, output) -> None:
        self.tokens += args[0].numel()


def actor_pass(model, micro, share: int, *, precision=contextlib.nullcontext) -> dict:
    """Log-probs, entropy and features of ``micro``, and the gradients of a loss on all three."""
    model.zero_grad(set_to_none=True)
    with precision():
        logprobs, entropy, features = response_logprobs(
            model, micro, with_entropy=True, entropy_grad=True, with_features=True,
            shared_prefix_tokens=share)
    mask = micro["response_mask"].float()
    weights = torch.linspace(-1, 1, features.shape[-1])
    loss = ((logprobs + 0.1 * entropy + (features.float() * weights).sum(-1)) * mask).sum()
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    return {"logprobs": logprobs.detach(), "entropy": entropy.detach(),
            "features": features.detach().float(), "grads": grads}


def assert_same(shared: dict, unshared: dict, mask: torch.Tensor, tolerance: float) -> None:
    for key in ("logprobs", "entropy", "features"):
        a, b = shared[key], unshared[key]
        difference = float((a - b)[mask].abs().max())
        assert difference < tolerance * max(1.0, float(b[mask].abs().max())), (key, difference)
    assert len(shared["grads"]) == len(unshared["grads"]) > 0
    assert relative_difference(shared["grads"], unshared["grads"]) < tolerance


@pytest.fixture(scope="module")
def model():
    from agentrl.models import load_model

    model = load_model("tiny")[0]
    model.eval()
    return model


def test_prefix_length_is_the_rows_common_prompt_start():
    batch = shared_prompt_batch()
    response_length = batch["responses"].shape[1]
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
    assert shared_prefix_length(inputs, response_length) == SYSTEM  # two groups
    group = micro_rows(batch, torch.tensor([0, 2, 4]))
    inputs = {k: group[k] for k in ("input_ids", "attention_mask", "position_ids")}
    response_length = group["responses"].shape[1]
    # a group's whole first prompt but its last token (it predicts the first reply token)
    assert shared_prefix_length(inputs, response_length) == SYSTEM + ROOMS[0] - 1
    first = int(group["attention_mask"][0].argmax())  # row 0's first real column
    inputs["input_ids"] = inputs["input_ids"].clone()
    inputs["input_ids"][0, first + 5] += 1
    assert shared_prefix_length(inputs, response_length) == 5
    inputs["input_ids"][0, first] += 1
    assert shared_prefix_length(inputs, response_length) == 0
    one = micro_rows(batch, torch.tensor([1]))
    inputs = {k: one[k] for k in ("input_ids", "attention_mask", "position_ids")}
    assert shared_prefix_length(inputs, response_length) == 0


def test_prefix_order_puts_a_groups_members_together():
    batch = shared_prompt_batch()
    rows = prefix_order(batch, torch.tensor([5, 0, 1, 2, 3, 4]))
    groups = batch["group_index"][rows].tolist()
    assert groups in ([0, 0, 0, 1, 1, 1], [1, 1, 1, 0, 0, 0])
    assert rows[:3].tolist() in ([0, 2, 4], [5, 1, 3])  # equal prompts keep their order


@pytest.mark.parametrize("rows", [[0, 1, 2, 3, 4, 5], [1, 3, 5]], ids=["two-groups", "one-group"])
@pytest.mark.parametrize("variant", ["plain", "constrained", "lora"])
def test_actor_pass_with_the_shared_prefix_equals_the_unshared_pass(model, variant, rows):
    if variant == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(__import__("copy").deepcopy(model), LoraConfig(
            r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
        for name, param in model.named_parameters():  # adapters that are not zero
            if "lora_B" in name:
                torch.nn.init.normal_(param, std=0.05, generator=torch.Generator().manual_seed(0))
        model.eval()
    batch = shared_prompt_batch(constrained=variant == "constrained")
    if variant == "constrained":
        assert (batch["constraint_kind"] >= 0).any()
    micro = micro_rows(batch, torch.tensor(rows))
    counter = TokenCounter(model)
    unshared = actor_pass(model, micro, 0)
    read_unshared, counter.tokens = counter.tokens, 0
    shared = actor_pass(model, micro, 1)
    assert counter.tokens < read_unshared - (len(rows) - 1.5) * SYSTEM  # the prefix ran once
    assert_same(shared, unshared, micro["response_mask"].bool(), 1e-5)


def test_bfloat16_autocast_with_the_shared_prefix_is_as_close_as_bfloat16_allows(model):
    """Under autocast the two passes round differently (other matmul shapes); both stay about
    as close to the float32 pass as each other, and to each other as bf16 is to float32."""
    micro = micro_rows(shared_prompt_batch(), torch.arange(6))
    bf16 = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    exact = actor_pass(model, micro, 0)
    unshared, shared = (actor_pass(model, micro, share, precision=bf16) for share in (0, 1))
    mask = micro["response_mask"].bool()
    def error(result: dict) -> float:
        return float((result["logprobs"] - exact["logprobs"])[mask].abs().max())

    assert error(shared) < 2 * error(unshared) + 1e-3
    bf16_noise = relative_difference(unshared["grads"], exact["grads"])  # 4e-3 measured
    assert relative_difference(shared["grads"], unshared["grads"]) < 2 * bf16_noise


def test_gradient_checkpointing_falls_back_to_the_unshared_pass(model):
    """transformers drops past_key_values in a checkpointed layer: every token is read."""
    checkpointed = __import__("copy").deepcopy(model)
    checkpointed.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs={"use_reentrant": False})
    micro = micro_rows(shared_prompt_batch(), torch.arange(6))
    counter = TokenCounter(checkpointed)
    with checkpointing(checkpointed):
        unshared = actor_pass(checkpointed, micro, 0)
        read_unshared, counter.tokens = counter.tokens, 0
        shared = actor_pass(checkpointed, micro, 1)
    assert counter.tokens == read_unshared
    assert_same(shared, unshared, micro["response_mask"].bool(), 1e-5)


@pytest.mark.parametrize("share_backbone", [False, True])
def test_critic_values_and_gradients_with_the_shared_prefix_equal_the_unshared(model,
                                                                               share_backbone):
    critic = ValueModel.from_actor(model, share_backbone=share_backbone)
    torch.nn.init.normal_(critic.head.weight, generator=torch.Generator().manual_seed(1))
    micro = micro_rows(shared_prompt_batch(), torch.arange(6))
    mask = micro["response_mask"].bool()
    out = {}
    for share in (0, 1):
        critic.zero_grad(set_to_none=True)
        values = critic(micro, shared_prefix_tokens=share)
        (values * mask).sum().backward()
        out[share] = values.detach(), [p.grad.clone() for p in critic.trainable_parameters()]
    assert float((out[1][0] - out[0][0])[mask].abs().max()) < 1e-5
    assert relative_difference(out[1][1], out[0][1]) < 1e-5


@pytest.mark.parametrize("micro", [3, 1], ids=["group-per-micro-batch", "group-per-run"])
@pytest.mark.parametrize("critic", ["critic.share_backbone=false", "critic.share_backbone=true"])
def test_the_update_with_the_shared_prefix_equals_the_unshared_update(tmp_path, critic, micro):
    """One PPO step of the trainer (old log-probs, values, GAE, critic and actor updates over
    micro-batches of 3, each a group's members once ordered, or of 1, a group's three making one
    run): the same gradients and weights, with fewer tokens read."""
    out = {}
    for share in (0, 16):
        trainer = tiny_trainer(tmp_path / str(share), "actor.lr=1e-4", "critic.lr=1e-4",
                               f"actor.micro_batch_size={micro}", "train.group_size=3", critic,
                               f"actor.shared_prefix_tokens={share}")
        recorders = {"actor": GradientRecorder(trainer.actor_optim),
                     "critic": GradientRecorder(trainer.critic_optim)}
        counter = TokenCounter(trainer.actor)
        groups, actor_micro = [], trainer.updater._actor_micro

        def recording(micro, size, prefix):
            groups.append(sorted(set(micro["group_index"].tolist())))
            return actor_micro(micro, size, prefix)

        trainer.updater._actor_micro = recording
        trainer.step = 1
        metrics = trainer.updater.update(shared_prompt_batch(), StageTimer())
        assert metrics["guard/skipped_updates"] == 0
        out[share] = {"grads": {role: r.steps[0] for role, r in recorders.items()},
                      "weights": [p.detach().clone() for p in trainer.actor.parameters()],
                      "tokens": counter.tokens, "metrics": metrics, "groups": groups}
    by_group = [[[g]] * (3 // micro) for g in (0, 1)]  # the interleaved rows, by group
    assert out[16]["groups"] in (by_group[0] + by_group[1], by_group[1] + by_group[0])
    assert out[16]["tokens"] < out[0]["tokens"]
    for role in ("actor", "critic"):
        assert relative_difference(out[16]["grads"][role], out[0]["grads"][role]) < 1e-5, role
    assert max(float((a - b).abs().max())
               for a, b in zip(out[16]["weights"], out[0]["weights"])) < 1e-6
    for key in ("actor/pg_loss", "critic/vf_loss", "critic/returns_mean"):
        assert out[16]["metrics"][key] == pytest.approx(out[0]["metrics"][key], rel=1e-5, abs=1e-7)


def group_rows(batch) -> torch.Tensor:
    """The six rows ordered by prompt: a group's three members side by side."""
    return prefix_order(batch, torch.arange(6))


def test_micro_batches_of_a_group_form_one_run_with_the_groups_prefix():
    batch = shared_prompt_batch()
    rows = group_rows(batch)
    runs = plan_prefix_runs(batch, rows, 1, min_tokens=1)
    assert [len(run.micro_batches) for run in runs] == [3, 3]
    assert sorted(run.ids.shape[1] for run in runs) == [SYSTEM + ROOMS[0] - 1, SYSTEM + ROOMS[1] - 1]
    for run in runs:
        members = torch.cat(run.micro_batches)
        assert len(set(batch["group_index"][members].tolist())) == 1
    assert [len(run.micro_batches) for run in plan_prefix_runs(batch, rows, 1, 0)] == [1] * 6
    # a prefix longer than any group shares: every micro-batch alone, unshared (one row each)
    assert all(run.ids is None for run in plan_prefix_runs(batch, rows, 1, min_tokens=64))


def run_pass(model, batch, rows, micro_batch_size: int, share: int) -> dict:
    """Log-probs of ``rows`` micro-batch by micro-batch through their planned runs, and the
    summed gradients of a loss on them (the trainer's accumulation)."""
    model.zero_grad(set_to_none=True)
    logprobs = []
    for run in plan_prefix_runs(batch, rows, micro_batch_size, share):
        for part in run.micro_batches:
            micro = micro_rows(batch, part)
            out = response_logprobs(model, micro, shared_prefix_tokens=share,
                                    prefix=run.prefix("actor"))[0]
            mask = micro["response_mask"].float()
            (out * mask * torch.linspace(0.5, 1.5, out.shape[1])).sum().backward()
            logprobs.append(out.detach()[micro["response_mask"].bool()])
        run.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    return {"logprobs": torch.cat(logprobs), "grads": grads}


@pytest.mark.parametrize("variant", ["plain", "lora", "lora_qv"])
def test_a_run_reads_its_prefix_once_and_gives_the_unshared_gradients(model, variant):
    """Micro-batches of one row: each group's prefix runs once for its three micro-batches, and
    their gradients on its keys and values reach the weights once, summed. With LoRA on the
    query and value projections only, the first layer's keys need no gradient."""
    if variant.startswith("lora"):
        from peft import LoraConfig, get_peft_model

        targets = (["q_proj", "v_proj"] if variant == "lora_qv"
                   else ["q_proj", "k_proj", "v_proj", "o_proj"])
        model = get_peft_model(__import__("copy").deepcopy(model), LoraConfig(
            r=4, lora_alpha=8, target_modules=targets))
        for name, param in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(param, std=0.05, generator=torch.Generator().manual_seed(0))
        model.eval()
    batch = shared_prompt_batch()
    rows = group_rows(batch)
    counter = TokenCounter(model)
    unshared = run_pass(model, batch, rows, 1, 0)
    read_unshared, counter.tokens = counter.tokens, 0
    shared = run_pass(model, batch, rows, 1, 1)
    # each group's prefix is read once instead of three times
    assert read_unshared - counter.tokens == 2 * sum(SYSTEM + room - 1 for room in ROOMS)
    assert float((shared["logprobs"] - unshared["logprobs"]).abs().max()) < 1e-5
    assert len(shared["grads"]) == len(unshared["grads"]) > 0
    assert relative_difference(shared["grads"], unshared["grads"]) < 1e-5


def test_rows_that_do_not_start_with_the_runs_prefix_are_refused(model):
    batch = shared_prompt_batch()
    rows = group_rows(batch)
    run = plan_prefix_runs(batch, rows, 1, min_tokens=1)[0]
    group = batch["group_index"][run.micro_batches[0][0]]
    stranger = next(r for r in rows if batch["group_index"][r] != group)
    with pytest.raises(ValueError, match="do not start with"):
        response_logprobs(model, micro_rows(batch, stranger[None]), shared_prefix_tokens=1,
                          prefix=run.prefix("actor"))


@pytest.mark.parametrize("micro_batch_size", [1, 2, 4, 5])
def test_the_planned_runs_never_read_more_than_micro_batches_sharing_alone(model,
                                                                           micro_batch_size):
    batch = shared_prompt_batch()
    rows = group_rows(batch)
    counter = TokenCounter(model)
    with torch.no_grad():
        for start in range(0, 6, micro_batch_size):  # each micro-batch its own prefix
            response_logprobs(model, micro_rows(batch, rows[start:start + micro_batch_size]),
                              shared_prefix_tokens=1)
        alone, counter.tokens = counter.tokens, 0
        for run in plan_prefix_runs(batch, rows, micro_batch_size, min_tokens=1):
            for part in run.micro_batches:
                response_logprobs(model, micro_rows(batch, part), shared_prefix_tokens=1,
                                  prefix=run.prefix("actor"))
    assert counter.tokens <= alone
    if micro_batch_size < 3:  # a group spans micro-batches: its prefix is read once, not again
        assert counter.tokens < alone
