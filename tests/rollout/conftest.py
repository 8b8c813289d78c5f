"""Shared fixtures for the rollout tests: the tiny tokenizers (fakes: rollout_fakes.py)."""

from __future__ import annotations

import pytest

from agentrl.models import load_tokenizer

TEMPLATES = ("tiny", "tiny-llama3")  # ChatML and Llama 3 formats on the same vocabulary


@pytest.fixture(scope="session", params=TEMPLATES)
def tokenizer(request):
    return load_tokenizer(request.param)


@pytest.fixture(scope="session")
def chatml_tokenizer():
    return load_tokenizer("tiny")
