"""The reference policies' success on a run's own validation seeds: the random and the oracle
policy played through :func:`agentrl.evaluation.held_out.evaluate` (text level, no model:
seconds for grid games), so a learning curve reads against luck and against the best play.
The trainers' learning-curve plot and the report page both draw them.

    played_references(["simpleSokobanAgent"], groups=8)
    # {"simpleSokobanAgent": {"random": {"success": 0.125, "return": ..., "source": ...},
    #                         "oracle": {...}}}
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from agentrl.agents import load_agent_presets
from agentrl.evaluation.held_out import evaluate
from agentrl.evaluation.stats import rounded

__all__ = ["REFERENCE_POLICIES", "played_references"]

REFERENCE_POLICIES = ("random", "oracle")


def played_references(presets: Sequence[str], groups: int) -> dict[str, dict[str, dict]]:
    """The random and oracle policies' success on the first ``groups`` validation seeds (the
    seeds validation plays), per preset; presets unknown here are skipped."""
    available = load_agent_presets()
    chosen = {p: available[p] for p in presets if p in available}
    references: dict[str, dict[str, dict]] = {}
    if not chosen:
        return references
    for policy in REFERENCE_POLICIES:
        result = asyncio.run(evaluate(chosen, policy, groups=groups, progress=False))
        for preset in chosen:
            row = result.preset_metrics(preset)
            references.setdefault(preset, {})[policy] = {
                "success": rounded(row["success"]), "return": rounded(row["return"]),
                "source": f"played now on {groups} validation seeds"}
    return references
