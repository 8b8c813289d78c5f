"""agentrl: post-train LLMs as multi-turn game agents with reinforcement learning."""

import os
import sys
import warnings

# OpenMP threads that spin while idle slow small CPU matmuls ~10x as soon as another process
# (or the rollout's own threads) wants a core: a step of the embedded model beside a second
# torch process took 3.5x its time alone with libgomp's default waiting, against 1.5x passive
# (docs/results/speed.md, "A busy machine"). OpenMP reads the policy once, when torch loads it:
# a program that imported torch first keeps spinning threads, so it is told.
if "torch" in sys.modules and "OMP_WAIT_POLICY" not in os.environ:
    warnings.warn("torch was imported before agentrl, so its OpenMP threads spin while they wait "
                  "and a busy machine slows them several times over: import agentrl first, or "
                  "set OMP_WAIT_POLICY=PASSIVE before starting Python", RuntimeWarning,
                  stacklevel=2)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from agentrl import envs  # noqa: F401  (registers the games with Gymnasium)

__version__ = "0.1.0"
