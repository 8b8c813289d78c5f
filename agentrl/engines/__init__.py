"""Generation engines: anything with ``async generate(prompt_ids, sampling) -> (ids, logprobs)``."""

from agentrl.engines.constrained import Generation, TokenMask
from agentrl.engines.local import BatchingLLM, GenerationStats, SamplingParams

__all__ = ["BatchingLLM", "Generation", "GenerationStats", "SamplingParams", "TokenMask"]
