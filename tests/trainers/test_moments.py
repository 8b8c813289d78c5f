"""actor.warm_optimizer: PPO's AdamW takes over the warm start's moments, from an `agentrl sft`
checkpoint (sft.save_optimizer) or from the run's own warm start, and takes smaller first steps
than a fresh AdamW where the warm start's gradients were larger."""

from __future__ import annotations

import pytest
import torch

from agentrl.config import build_config
from agentrl.trainers import sft
from agentrl.trainers.local import LocalTrainer
from agentrl.trainers.moments import carry_moments
from test_sft import sft_config
from update_fixtures import at_verl_values


def _adamw(params, lr=1e-2):
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)


def test_carried_moments_scale_the_first_step_where_a_fresh_adamw_takes_sign_steps():
    torch.manual_seed(0)
    warm_param = torch.nn.Parameter(torch.zeros(64))
    warm = _adamw([warm_param], lr=1.0)
    for _ in range(5):  # the warm start: large, consistent gradients
        warm_param.grad = torch.full((64,), 10.0) + torch.randn(64)
        warm.step()
    small = torch.randn(64) * 1e-3  # a PPO gradient with little behind it

    fresh_param = torch.nn.Parameter(torch.zeros(64))
    fresh = _adamw([fresh_param])
    fresh_param.grad = small.clone()
    fresh.step()
    carried_param = torch.nn.Parameter(torch.zeros(64))
    carried = _adamw([carried_param])
    carry_moments(warm.state_dict(), carried)
    carried_param.grad = small.clone()
    carried.step()

    torch.testing.assert_close(fresh_param.detach().abs(), torch.full((64,), 1e-2))  # lr * sign
    # the carried first moment still points where the warm start went (negative steps), and
    # the carried second moment keeps the step at the warm start's scale, not the sign's
    assert carried.param_groups[0]["lr"] == 1e-2  # PPO's own learning rate
    assert float(carried.state[carried_param]["step"]) == 6.0
    step = carried_param.detach()
    assert (step < 0).all() and (step.abs() < 1e-2).all()


def test_moments_of_other_parameters_are_refused():
    warm_param = torch.nn.Parameter(torch.zeros(3))
    warm = _adamw([warm_param])
    warm_param.grad = torch.ones(3)
    warm.step()
    with pytest.raises(ValueError, match="shape"):
        carry_moments(warm.state_dict(), _adamw([torch.nn.Parameter(torch.zeros(4))]))
    with pytest.raises(ValueError, match="parameters"):
        carry_moments(warm.state_dict(), _adamw([torch.nn.Parameter(torch.zeros(3)),
                                                 torch.nn.Parameter(torch.zeros(3))]))


def _ppo_from(tmp_path, model: str, **actor_keys):
    data = sft_config(tmp_path).to_dict()
    data["model"]["name"] = model
    data["run_dir"] = str(tmp_path / "ppo")
    data["train"].update(group_num=1, group_size=2, total_steps=1)
    data["actor"].update(actor_keys)
    data["trainer"].update(logger=[], plot=False)
    return build_config(data)


def test_ppo_starts_from_the_moments_an_sft_checkpoint_saved(tmp_path, one_torch_thread):
    trainer = sft.SFTTrainer(sft_config(tmp_path, epochs=1, save_optimizer=True))
    try:
        result = trainer.fit()
        saved = trainer.optim.state_dict()["state"]
    finally:
        trainer.close()
    assert (result.checkpoint / "optimizer.pt").is_file()
    ppo = LocalTrainer(_ppo_from(tmp_path, str(result.checkpoint), warm_optimizer=True))
    try:
        params = [p for p in ppo.actor.parameters() if p.requires_grad]
        for index, param in enumerate(params):
            torch.testing.assert_close(ppo.actor_optim.state[param]["exp_avg_sq"],
                                       saved[index]["exp_avg_sq"])
        assert ppo.actor_optim.param_groups[0]["lr"] == ppo.config.actor.lr
    finally:
        ppo.close()
    fresh = LocalTrainer(_ppo_from(tmp_path, str(result.checkpoint)))
    try:
        assert not fresh.actor_optim.state  # without the key PPO's AdamW starts from zeros
    finally:
        fresh.close()


def test_a_checkpoint_without_moments_names_the_key_that_saves_them(tmp_path, one_torch_thread):
    trainer = sft.SFTTrainer(sft_config(tmp_path, epochs=1))
    try:
        result = trainer.fit()
    finally:
        trainer.close()
    assert not (result.checkpoint / "optimizer.pt").exists()  # off by default: 2x the model
    with pytest.raises(ValueError, match="sft.save_optimizer=true"):
        LocalTrainer(_ppo_from(tmp_path, str(result.checkpoint), warm_optimizer=True))


def test_the_runs_own_warm_start_hands_its_moments_to_ppo(tmp_path, one_torch_thread):
    data = _ppo_from(tmp_path, "tiny", warm_optimizer=True).to_dict()
    data["train"].update(total_steps=1, sft_steps=1)
    data["val"].update(before_train=False, test_freq=0)
    trainer = LocalTrainer(build_config(data))
    try:
        trainer.train_step(1)  # the warm start's one update, then its end
        params = [p for p in trainer.actor.parameters() if p.requires_grad]
        assert trainer.warm_start.optim is None  # freed, its moments now PPO's
        assert all(float(trainer.actor_optim.state[p]["step"]) == 1.0 for p in params)
        assert any(trainer.actor_optim.state[p]["exp_avg_sq"].abs().sum() > 0 for p in params)
    finally:
        trainer.close()


@pytest.mark.parametrize("key", ["actor.warm_optimizer", "sft.save_optimizer"])
def test_moments_with_lora_or_on_verl_are_refused(tmp_path, key):
    section, name = key.split(".")
    data = sft_config(tmp_path).to_dict()
    data[section][name] = True
    with pytest.raises(ValueError, match=f"{key}=true is not allowed with lora.rank=4"):
        build_config({**data, "lora": {"rank": 4, "alpha": 8}})
    with pytest.raises(ValueError, match=f"{key}=True is not allowed with backend='verl'"):
        build_config({**at_verl_values(data), "backend": "verl",
                      "model": {**data["model"], "name": str(tmp_path)}})
