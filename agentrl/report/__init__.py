"""One self-contained HTML page of a run: config, learning curves with random/oracle reference
lines, a per-preset table and an episode browser (:mod:`agentrl.report.data` gathers the data;
``page.html`` draws it with its own small script: no network, no server).

    from agentrl.report import write_report
    write_report("runs/agentrl/quick")                   # -> runs/agentrl/quick/report.html
    write_report("eval_results.json", "eval.html")       # an `agentrl eval --out` file
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from agentrl.report.data import eval_data, run_data

__all__ = ["REPORT_FILE", "render_page", "report_data", "write_report"]

REPORT_FILE = "report.html"
PLACEHOLDER = "__AGENTRL_DATA__"


def render_page(data: dict[str, Any]) -> str:
    """The page with ``data`` embedded as JSON (``</`` escaped so no text can end the script)."""
    template = resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8")
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False)
    payload = payload.replace("</", "<\\/").replace("<!--", "<\\u0021--")
    return template.replace(PLACEHOLDER, payload, 1)


def report_data(source: str | Path, **options: Any) -> dict[str, Any]:
    """:func:`run_data` of a run folder, or :func:`eval_data` of an eval JSON file."""
    source = Path(source)
    if source.is_file():
        return eval_data(source)
    if not source.is_dir():
        raise ValueError(f"{source}: no such run folder or eval file")
    return run_data(source, **options)


def write_report(source: str | Path, out: str | Path | None = None, **options: Any) -> Path:
    """Write the page of ``source`` to ``out`` (default: ``<run_dir>/report.html``, or the eval
    file's name with ``.html``); returns its path."""
    source = Path(source)
    if out is None:
        out = source.with_suffix(".html") if source.is_file() else source / REPORT_FILE
    page = render_page(report_data(source, **options))  # a bad source makes no folder
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out
