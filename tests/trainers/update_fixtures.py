"""A local trainer on the tiny model and a fixed batch of two-turn episodes, to test its update
stages without playing games."""

from __future__ import annotations

import torch

from agentrl.config import compose_config
from agentrl.rollout import to_batch
from agentrl.rollout.records import Trajectory
from agentrl.trainers.local import LocalTrainer


GRADIENT_CRITIC = ("critic.head_fit=gradient", "critic.sibling_pseudocount=null",
                   "algorithm.gamma_unit=token", "algorithm.lam=1.0")
"""The critic the update's mechanics are checked with: a value head trained by its own passes,
read by GAE at lambda 1 (the CPU preset's ridge head and sibling values have tests of their own,
which name them)."""


def at_verl_values(data: dict) -> dict:
    """A config dict with the CPU preset's local-engine keys at the values verl runs."""
    return {**data,
            "critic": {**data["critic"], "share_backbone": False, "head_fit": "gradient",
                       "sibling_pseudocount": None},
            "rollout": {**data["rollout"], "drop_uniform_groups": False},
            "algorithm": {**data["algorithm"], "lam": 1.0}}


def tiny_trainer(tmp_path, *overrides: str) -> LocalTrainer:
    """A LocalTrainer on the tiny model (no rollout is played unless asked), with
    :data:`GRADIENT_CRITIC` unless ``overrides`` say otherwise."""
    return LocalTrainer(compose_config([
        "model=tiny", f"run_dir={tmp_path / 'run'}", "threads=1", "seed=1", "trainer.logger=[]",
        "trainer.plot=false", "train.group_num=2", "train.group_size=2", *GRADIENT_CRITIC,
        *overrides]))


def two_turn_batch(n: int = 4, vocab: int = 1000, seed: int = 0, *,
                   turn_rewards: tuple[float, float] | None = None) -> dict[str, torch.Tensor]:
    """``n`` two-turn episodes of different lengths (so micro-batches trim differently): a
    prompt, a reply, an observation (mask 0), a reply; random ids, turn rewards on each reply."""
    generator = torch.Generator().manual_seed(seed)
    trajectories = []
    for i in range(n):
        prompt, first, observation, second = 3 + i, 2 + 2 * i, 2, 1 + (i * 3) % 4
        ids = torch.randint(10, vocab, (prompt + first + observation + second,), generator=generator).tolist()
        rewards = turn_rewards or (float(i % 3) - 1.0, 0.5 * i)
        length = first + observation + second
        trajectories.append(Trajectory(
            preset="p", seed=i, group_index=i // 2, prompt_ids=ids[:prompt],
            response_ids=ids[prompt:], response_mask=[1] * first + [0] * observation + [1] * second,
            response_logprobs=[-1.0] * length, turn_end_positions=[first - 1, length - 1],
            turn_rewards=list(rewards), success=False, episode_return=sum(rewards), num_turns=2))
    batch = to_batch(trajectories, pad_token_id=0, reward_placement="turn")
    batch["group_index"] = torch.tensor([t.group_index for t in trajectories])
    return batch


class GradientRecorder:
    """Records the gradients an optimizer is about to apply (a step pre-hook)."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.steps: list[list[torch.Tensor]] = []
        optimizer.register_step_pre_hook(self._record)

    def _record(self, optimizer, args, kwargs) -> None:
        self.steps.append([p.grad.detach().clone() for group in optimizer.param_groups
                           for p in group["params"] if p.grad is not None])


def relative_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    flat_a, flat_b = torch.cat([t.flatten() for t in a]), torch.cat([t.flatten() for t in b])
    return float((flat_a - flat_b).norm() / flat_b.norm().clamp(min=1e-30))
