"""Fixtures for the verl adapter tests (helpers: verl_fakes.py)."""

from __future__ import annotations

import sys
import time

import pytest
from verl_runs import SFT_LR, cpu_sft_overrides, sft_model_folder

from agentrl.verl import child_run

SFT_TIMEOUT_S = 600
"""verl's one-step SFT run (torchrun and its worker, ~60 s): one that hangs is ended with its
session, and the tests that need it fail, instead of holding CI to its limit."""


@pytest.fixture
def embedded_prompt_tokenizer(monkeypatch):
    """A launch measures every first prompt with the model's tokenizer
    (:func:`agentrl.verl.data.prompt_tokenizer`); a hub model's is not on a CI machine, and
    tests download nothing: the embedded model's tokenizer (a ChatML template, as Qwen2.5's)
    stands in."""
    from agentrl.models import load_tokenizer
    from agentrl.verl import data

    monkeypatch.setattr(data, "prompt_tokenizer", lambda config: load_tokenizer("embedded"))


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """The tiny model's tokenizer and config as an HF folder: what verl's workers load from
    ``actor_rollout_ref.model.path`` (no weights: the rollout is faked)."""
    from agentrl.models import load_model

    model, tokenizer = load_model("tiny")
    path = tmp_path_factory.mktemp("tiny-hf")
    model.config.architectures = [type(model).__name__]  # verl asserts exactly one
    model.config.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def verl_sft_folder(tmp_path_factory):
    """verl's SFT trainer run once on this CPU (torchrun, one step at ``SFT_LR`` on 8 bandit
    demonstrations from ``model=tiny_vllm``): the Hugging Face folder of its checkpoint.
    ``test_verl_sft.py`` checks it; ``test_cpu_trainer.py``'s PPO run starts from it. A child
    run (``agentrl sft``) in a session of its own, ended after ``SFT_TIMEOUT_S``."""
    run_dir = tmp_path_factory.mktemp("verl-sft") / "run"
    command = [sys.executable, "-m", "agentrl.cli", "sft",
               *cpu_sft_overrides(run_dir, f"sft.lr={SFT_LR}")]
    started = time.monotonic()
    log = run_dir.parent / "sft.log"
    child_run.finish(child_run.start(command, log), log, SFT_TIMEOUT_S)
    print(f"verl's SFT run: {time.monotonic() - started:.0f} s")
    return sft_model_folder(run_dir)
