"""docs/ENVS.md's presets table stays true: scripts/envs_table.py re-measures it on 20 seeds."""

from __future__ import annotations

import pytest

from agentrl.agents import load_agent_presets

CHECK_SEEDS = 20
CHECK_TEXTWORLD_SEEDS = 3


@pytest.fixture(scope="module")
def table_script(load_script):
    return load_script("scripts/envs_table.py")


@pytest.fixture(scope="module")
def fresh_rows(table_script):
    return table_script.measure(load_agent_presets(), CHECK_SEEDS, CHECK_TEXTWORLD_SEEDS)


@pytest.mark.slow
def test_the_table_lists_every_preset_and_agrees_with_a_fresh_measure(table_script, fresh_rows):
    problems = table_script.differences(table_script.read_table(), fresh_rows)
    assert not problems, "\n".join(problems) + "\n(python scripts/envs_table.py rewrites it)"


@pytest.mark.slow
def test_a_stale_table_is_caught(table_script, fresh_rows):
    """A changed budget, a missing preset and a wrong rate each fail the check."""
    rows = table_script.parse_table(table_script.read_table())
    table = table_script.read_table()
    name, cells = next(iter(rows.items()))
    line = next(line for line in table.splitlines() if line.startswith(f"| `{name}`"))

    budget = line.replace(f"| {cells[4]} |", "| 1 / 1 |", 1)
    assert any("settings" in p for p in table_script.differences(
        table.replace(line, budget), fresh_rows))
    assert "presets differ" in table_script.differences(
        table.replace(line + "\n", "").replace("\n" + line, ""), fresh_rows)[0]
    wrong = "99.0" if float(cells[8].split()[0]) < 50 else "1.0"
    rate = line.replace(f"| {cells[8]} |", f"| {wrong} (0.0-100.0) |", 1)
    assert any("random success" in p for p in table_script.differences(
        table.replace(line, rate), fresh_rows))


def test_every_laptop_preset_separates_skill_from_luck(table_script):
    """The tight presets are for showing learning: the table must back their promise."""
    rows = table_script.parse_table(table_script.read_table())
    tight = [name for name in rows if name.startswith("tight")]
    assert tight
    for name in tight:
        assert float(rows[name][7]) == 100.0, name
        assert float(rows[name][8].split()[0]) <= 25.0, name
