"""Evaluation in one place: held-out play of every preset (:mod:`.held_out`), agent-setting
variants side by side (:mod:`.compare`), the reference policies' rows (:mod:`.references`) and
the statistics every report quotes (:mod:`.stats`).

    from agentrl.evaluation import evaluate
    result = await evaluate(presets, llm, tokenizer=tokenizer, groups=8)
"""

from agentrl.evaluation.held_out import (
    SCRIPTED_POLICIES, TABLE_COLUMNS, EvalResult, evaluate, greedy_sampling,
)
from agentrl.evaluation.references import REFERENCE_POLICIES, played_references
from agentrl.evaluation.stats import rounded, wilson_interval

__all__ = ["REFERENCE_POLICIES", "SCRIPTED_POLICIES", "TABLE_COLUMNS", "EvalResult", "evaluate",
           "greedy_sampling", "played_references", "rounded", "wilson_interval"]
