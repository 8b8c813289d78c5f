"""Updates that reuse their samples (issue 42, item 3): with several passes or mini-batches a
step's later updates see a ratio away from 1, so the clip acts (``actor/pg_clipfrac``,
``actor/ppo_kl`` > 0), and ``actor.target_kl`` stops a step's passes at the first mini-batch
whose approximate KL to the sampling policy passes it (``actor/passes`` counts what ran)."""

from __future__ import annotations

import pytest
import torch

from agentrl.config import build_config, compose_config
from agentrl.trainers import ppo
from agentrl.trainers.timing import StageTimer
from agentrl.trainers.update_loop import KL_TERM, UpdateShape, run_epochs
from update_fixtures import at_verl_values, tiny_trainer, two_turn_batch


def drifting_loss(weight: torch.nn.Parameter):
    """A micro-batch loss whose reported KL is how far ``weight`` moved from 0."""

    def micro_loss(micro, size: ppo.MiniBatchSize, prefix):
        loss = -weight.sum() * micro["responses"].shape[0] / size.sequences
        kl = float(weight.detach().abs().sum()) * micro["responses"].shape[0] / size.sequences
        return loss, {"actor/pg_loss": float(loss.detach()), KL_TERM: kl}, {}

    return micro_loss


def run(target_kl: float | None, epochs: int = 3, mini: int = 2):
    weight = torch.nn.Parameter(torch.zeros(1))
    optim = torch.optim.SGD([weight], lr=0.1)
    steps = []
    optim.register_step_post_hook(lambda *_: steps.append(float(weight.detach())))
    batch = {"responses": torch.ones(4, 2, dtype=torch.long),
             "prompts": torch.ones(4, 1, dtype=torch.long),
             "attention_mask": torch.ones(4, 3, dtype=torch.long)}
    shape = UpdateShape(epochs=epochs, mini_batch_size=mini, micro_batch_size=1,
                        shared_prefix_tokens=0, grad_clip=1e9, target_kl=target_kl)
    metrics, skipped = run_epochs(batch, drifting_loss(weight), optim, [weight], shape,
                                  loss_mask=torch.ones(4, 2), generator=torch.Generator(),
                                  role="actor")
    return metrics, steps


def test_without_a_target_every_pass_runs():
    metrics, steps = run(None)
    assert len(steps) == 6 and metrics["actor/passes"] == 3.0
    assert "actor/kl_stopped" not in metrics


def test_the_first_mini_batch_past_the_target_stops_the_passes_before_its_step():
    # each step moves the weight by 0.1; the KL read before a step is the distance so far
    metrics, steps = run(target_kl=0.25)
    assert steps == pytest.approx([0.1, 0.2, 0.3])  # the 4th mini-batch read 0.3 > 0.25
    assert metrics["actor/passes"] == 1.5 and metrics["actor/kl_stopped"] == 1.0


def test_a_target_never_reached_stops_nothing():
    metrics, steps = run(target_kl=10.0)
    assert len(steps) == 6 and metrics["actor/passes"] == 3.0
    assert metrics["actor/kl_stopped"] == 0.0


def test_a_mini_batch_is_whole_trajectories_however_many_rows_each_has():
    # 4 trajectories cut into 1, 2, 3 and 2 rows (turns or context windows): a mini-batch of 2
    # trajectories is 2 optimizer steps a pass, each over all the rows of its 2 episodes
    episodes = torch.tensor([0, 1, 1, 2, 2, 2, 3, 3])
    rows = len(episodes)
    batch = {"responses": torch.ones(rows, 2, dtype=torch.long),
             "prompts": torch.ones(rows, 1, dtype=torch.long),
             "attention_mask": torch.ones(rows, 3, dtype=torch.long),
             "episode_index": episodes}
    weight = torch.nn.Parameter(torch.zeros(1))
    optim = torch.optim.SGD([weight], lr=0.1)
    seen: list[list[int]] = [[]]
    optim.register_step_post_hook(lambda *_: seen.append([]))

    def micro_loss(micro, size: ppo.MiniBatchSize, prefix):
        seen[-1].extend(int(e) for e in micro["episode_index"])
        loss = -weight.sum() * micro["responses"].shape[0] / size.sequences
        return loss, {"actor/pg_loss": float(loss.detach())}, {}

    shape = UpdateShape(epochs=2, mini_batch_size=2, micro_batch_size=1,
                        shared_prefix_tokens=0, grad_clip=1e9)
    metrics, _ = run_epochs(batch, micro_loss, optim, [weight], shape,
                            loss_mask=torch.ones(rows, 2), generator=torch.Generator(),
                            role="actor")
    steps = seen[:-1]
    assert len(steps) == 4 and metrics["actor/passes"] == 2.0
    for step in steps:
        assert len(set(step)) == 2  # two trajectories ...
        assert sorted(step) == sorted(int(e) for e in episodes if int(e) in step)  # ... whole
    for first, second in ((steps[0], steps[1]), (steps[2], steps[3])):  # a pass: each once
        assert sorted(set(first) | set(second)) == [0, 1, 2, 3]


def update(tmp_path, *overrides: str) -> dict[str, float]:
    trainer = tiny_trainer(tmp_path, "actor.lr=2e-2", "actor.micro_batch_size=2", *overrides)
    try:
        trainer.step = 1
        return trainer.updater.update(two_turn_batch(4), StageTimer(), 1)
    finally:
        trainer.close()


def test_one_pass_over_one_mini_batch_never_clips(tmp_path, one_torch_thread):
    metrics = update(tmp_path)
    assert metrics["actor/ppo_kl"] == 0.0 and metrics["actor/pg_clipfrac"] == 0.0
    assert metrics["actor/passes"] == 1.0


@pytest.mark.parametrize("shape", [("actor.ppo_epochs=2",),
                                   ("actor.ppo_mini_batch_size=2",)])
def test_later_updates_of_a_step_see_the_ratio_move_and_the_clip_act(tmp_path, shape,
                                                                     one_torch_thread):
    metrics = update(tmp_path, *shape)
    assert metrics["actor/approx_kl"] > 0.0
    assert metrics["actor/pg_clipfrac"] > 0.0
    assert metrics["actor/ppo_kl"] != 0.0


def test_target_kl_stops_the_actor_passes(tmp_path, one_torch_thread):
    metrics = update(tmp_path, "actor.ppo_epochs=3", "actor.ppo_mini_batch_size=2",
                     "actor.target_kl=1e-6")
    # the first mini-batch reads the old policy (KL 0) and steps; the second passes the target
    assert metrics["actor/passes"] == 0.5 and metrics["actor/kl_stopped"] == 1.0


@pytest.mark.parametrize("value", ["0", "-0.1", "abc"])
def test_a_bad_target_kl_fails_naming_the_key(value):
    with pytest.raises(ValueError, match="target_kl"):
        compose_config(["model=tiny", f"actor.target_kl={value}"])


VERL_VALUES = {"actor.target_kl": None, "critic.ppo_mini_batch_size": None,
               "critic.head_hidden": 0, "critic.standardize_features": False}


@pytest.mark.parametrize("key,value", [("actor.target_kl", 0.02),
                                       ("critic.ppo_mini_batch_size", 2),
                                       ("critic.standardize_features", True),
                                       ("critic.head_hidden", 8)])
def test_verl_refuses_the_local_keys(tmp_path, key, value):
    data = at_verl_values(compose_config(["model=tiny"]).to_dict())
    data.update(backend="verl", model={**data["model"], "name": str(tmp_path)})
    for setting, allowed in VERL_VALUES.items():
        section, name = setting.split(".")
        data[section][name] = allowed
    build_config(data)  # verl's values pass
    section, name = key.split(".")
    data[section][name] = value
    with pytest.raises(ValueError, match=f"{key}={value!r} is not allowed with backend='verl'"):
        build_config(data)
