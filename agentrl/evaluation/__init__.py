"""Evaluation in one place: held-out play of every preset (:mod:`.held_out`), agent-setting
variants side by side (:mod:`.compare`) and the statistics every report quotes (:mod:`.stats`).

    from agentrl.evaluation import evaluate
    result = await evaluate(presets, llm, tokenizer=tokenizer, groups=8)
"""

from agentrl.evaluation.held_out import (
    SCRIPTED_POLICIES, TABLE_COLUMNS, EvalResult, evaluate, greedy_sampling,
)
from agentrl.evaluation.stats import wilson_interval

__all__ = ["SCRIPTED_POLICIES", "TABLE_COLUMNS", "EvalResult", "evaluate", "greedy_sampling",
           "wilson_interval"]
