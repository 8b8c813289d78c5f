"""agentrl: post-train LLMs as multi-turn game agents with reinforcement learning."""

from agentrl import envs  # noqa: F401  (registers the games with Gymnasium)

__version__ = "0.1.0"
