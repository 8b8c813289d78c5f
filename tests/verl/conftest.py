"""Fixtures for the verl adapter tests (helpers: verl_fakes.py)."""

from __future__ import annotations

import pytest


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
