"""Test-wide settings: a private cache so tests never read or write the user's game pool."""

import os
import tempfile

import pytest


def pytest_configure(config):
    # Set at start-up (not in a fixture) so subprocesses started by tests inherit it.
    # AGENTRL_TEST_CACHE keeps generated games between local runs; CI starts empty.
    os.environ["AGENTRL_CACHE"] = os.environ.get("AGENTRL_TEST_CACHE") or tempfile.mkdtemp(
        prefix="agentrl-test-cache-"
    )


@pytest.fixture(scope="session")
def cache_dir() -> str:
    return os.environ["AGENTRL_CACHE"]


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread: a tiny model gains nothing from two, and on a busy 2-core machine
    OpenMP's spinning threads make small batched matmuls ~10x slower (50 s vs 15 s measured)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny():
    """The tiny random-initialised model and its tokenizer."""
    from agentrl.models import load_model

    return load_model("tiny")
