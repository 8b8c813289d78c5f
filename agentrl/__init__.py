"""agentrl: post-train LLMs as multi-turn game agents with reinforcement learning."""

import os

# OpenMP threads that spin while idle slow small CPU matmuls ~10x as soon as another process
# (or the rollout's own threads) wants a core: generation with the embedded model measured
# 1.9 tokens/s spinning vs 16 passive, 2 threads each, on a busy 2-core machine. Set before
# torch loads OpenMP.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from agentrl import envs  # noqa: F401  (registers the games with Gymnasium)

__version__ = "0.1.0"
