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
