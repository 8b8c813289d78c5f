"""The learning test: PPO lifts the tiny model from chance to success on a task it controls.

The task is a one-turn Bandit whose arms are the tiny model's four most likely first tokens
for the prompt, and whose paying arm is the *least* likely of the four. Training samples with
``top_k=4``, so chance is that token's share of the four (about a quarter), and greedy
validation starts at 0 (the argmax is another arm). Only a correct policy gradient moves
probability onto the paying token: with the advantages' sign flipped
(``AGENTRL_FLIP_ADVANTAGES=1``), the same run drives it out and the test fails.
"""

from __future__ import annotations

import os

import pytest
import torch

from agentrl.agents import Agent, agent_presets_from_dict
from agentrl.config import build_config, compose_config
from agentrl.models import load_model
from agentrl.rollout.episode import first_prompt_ids
from agentrl.trainers import ppo
from agentrl.trainers.local import LocalTrainer
from agentrl.trainers.sanity import first_token_bandit, likely_arms
from agentrl.trainers.tracking import read_metrics

ARMS = 4
STEPS = 15


def bandit_run(tmp_path, arms: list[str], steps: int, estimator: str = "gae"):
    base = compose_config(["model=tiny", f"algorithm.adv_estimator={estimator}"]).to_dict()
    base["agents"] = {"bandit": first_token_bandit(arms)}
    base.update(run_dir=str(tmp_path / "run"), seed=1, threads=1)
    base["train"].update(presets=["bandit"], group_num=4, group_size=4, total_steps=steps)
    base["val"].update(presets=["bandit"], group_num=4, group_size=1, test_freq=steps,
                       before_train=True)
    base["rollout"].update(top_k=ARMS, max_new_tokens=1, max_context_tokens=512,
                           constrained_actions=False)  # the first free token is the task
    base["actor"].update(lr=2e-3, micro_batch_size=16, ppo_epochs=2)
    base["critic"].update(lr=2e-3, share_backbone=True)
    base["trainer"].update(logger=[], plot=False, save_freq=0)
    return build_config(base)


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["gae", "grpo"])  # with a critic, and group-relative
def test_ppo_learns_the_paying_arm(estimator, tmp_path, monkeypatch, one_torch_thread):
    if os.environ.get("AGENTRL_FLIP_ADVANTAGES") == "1":
        real = ppo.compute_advantages

        def flipped(*args, **kwargs):
            advantages, returns = real(*args, **kwargs)
            return -advantages, returns

        monkeypatch.setattr(ppo, "compute_advantages", flipped)
    model, tokenizer = load_model("tiny")
    arms = likely_arms(model, tokenizer, ARMS)
    trainer = LocalTrainer(bandit_run(tmp_path, arms, steps=STEPS, estimator=estimator))
    try:
        result = trainer.fit()
    finally:
        trainer.close()
    records = read_metrics(result.metrics)
    train = [r["train/bandit/success"] for r in records if "train/bandit/success" in r]
    val = {r["step"]: r["val/bandit/success"] for r in records if "val/bandit/success" in r}
    print("arms", arms, "train success by step", train, "val", val)
    assert val[0] == 0.0, "greedy play starts on another arm"
    assert sum(train[:2]) / 2 < 0.5, "the first steps play near chance"
    assert sum(train[-3:]) / 3 >= 0.85 and val[STEPS] == 1.0, f"no learning: {train}"


def test_greedy_play_starts_on_an_arm_that_does_not_pay(one_torch_thread):
    """The learning test's starting point, in a second: the arms are distinct, the model's
    greedy first token is the first arm, and only the last arm pays."""
    model, tokenizer = load_model("tiny")
    arms = likely_arms(model, tokenizer, ARMS)
    assert len({arm.lower() for arm in arms}) == ARMS
    config = agent_presets_from_dict({"bandit": first_token_bandit(arms)})["bandit"]
    with Agent(config) as agent:
        ids = first_prompt_ids(tokenizer, agent.reset(seed=0))
        with torch.no_grad():
            greedy = model(torch.tensor([ids])).logits[0, -1].argmax().item()
        assert tokenizer.decode([greedy]).strip() == arms[0]
        assert not agent.step(arms[0]).success
    with Agent(config) as agent:
        agent.reset(seed=0)
        assert agent.step(arms[-1]).success
