"""Headless Chromium for the report: the page's DOM after its script ran, and a screenshot.
Used by ``agentrl report --screenshot`` and by the tests that check the page in a real browser.

    from agentrl.report.browser import chromium, dump_dom, screenshot
    html = dump_dom(page, fragment="step=2&split=val&click=next")
    screenshot(page, "report.png")

Debian's package is ``chromium`` (``apt-get install -y chromium``; scripts/test.sh installs it
when missing). ``--no-sandbox`` lets it run as root in containers.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

__all__ = ["CHROMIUM_NAMES", "chromium", "dump_dom", "screenshot"]

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", "--hide-scrollbars")
TIMEOUT_S = 120


def chromium() -> str | None:
    """The first Chromium or Chrome executable on the PATH, or None."""
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def _url(page: str | Path, fragment: str = "") -> str:
    return Path(page).resolve().as_uri() + (f"#{fragment}" if fragment else "")


def _run(args: list[str]) -> subprocess.CompletedProcess:
    executable = chromium()
    if executable is None:
        raise RuntimeError(f"no Chromium found (looked for {', '.join(CHROMIUM_NAMES)}); "
                           "on Debian: apt-get install -y chromium")
    done = subprocess.run([executable, *FLAGS, *args], capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"chromium failed ({done.returncode}): {done.stderr[-1500:]}")
    return done


def dump_dom(page: str | Path, fragment: str = "") -> str:
    """The page's DOM, serialized after its scripts ran (``fragment``: the URL's ``#...``)."""
    return _run(["--dump-dom", _url(page, fragment)]).stdout


def screenshot(page: str | Path, out: str | Path, fragment: str = "",
               size: tuple[int, int] = (1400, 2400)) -> Path:
    """A PNG of the page (``size``: the window, so the whole page fits)."""
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    _run([f"--screenshot={out}", f"--window-size={size[0]},{size[1]}", _url(page, fragment)])
    if not out.is_file():
        raise RuntimeError(f"chromium wrote no screenshot to {out}")
    return out
