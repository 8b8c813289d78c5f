"""The agent layer: game <-> chat turns (prompts, answer parsing, penalties).

>>> from agentrl.agents import Agent, load_agent_presets
>>> agent = Agent(load_agent_presets()["simpleSokobanAgent"])
>>> messages = agent.reset(seed=0)

- :mod:`agentrl.agents.config`: ``AgentConfig`` and the presets of ``configs/agents.yaml``.
- :mod:`agentrl.agents.parsing`: ``<think>…</think><answer>A || B</answer>`` -> actions.
- :mod:`agentrl.agents.agent`: ``Agent`` (one class for every game), ``TurnResult``,
  ``AgentWrapper`` (what a wrapped agent forwards).
"""

from agentrl.agents.agent import GAME_SPECS, Agent, AgentWrapper, GameSpec, TurnResult
from agentrl.agents.config import AgentConfig, agent_presets_from_dict, load_agent_presets
from agentrl.agents.parsing import ParsedResponse, format_response, parse_response

__all__ = [
    "GAME_SPECS", "Agent", "AgentConfig", "AgentWrapper", "GameSpec", "ParsedResponse", "TurnResult",
    "agent_presets_from_dict", "format_response", "load_agent_presets",
    "parse_response",
]
