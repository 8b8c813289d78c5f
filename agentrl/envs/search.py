"""Breadth-first search shared by the oracles: shortest action sequence to a goal state."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable


def shortest_plan(
    start: Hashable,
    successors: Callable[[Hashable], Iterable[tuple[str, Hashable]]],
    is_goal: Callable[[Hashable], bool],
    max_states: int = 1_000_000,
) -> list[str] | None:
    """Fewest actions from ``start`` to a goal, or ``None`` when no goal is reachable.

    ``successors(state)`` yields ``(action, next_state)``; states must be hashable. The search
    gives up (returns ``None``) after ``max_states`` distinct states so a call is always bounded.
    """
    if is_goal(start):
        return []
    parents: dict[Hashable, tuple[Hashable, str] | None] = {start: None}
    frontier = deque([start])
    while frontier:
        state = frontier.popleft()
        for action, child in successors(state):
            if child in parents:
                continue
            parents[child] = (state, action)
            if is_goal(child):
                return _unwind(parents, child)
            if len(parents) >= max_states:
                return None
            frontier.append(child)
    return None


def _unwind(parents: dict, state: Hashable) -> list[str]:
    plan = []
    while parents[state] is not None:
        state, action = parents[state]
        plan.append(action)
    return plan[::-1]
