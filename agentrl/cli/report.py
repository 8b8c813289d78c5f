"""`agentrl report RUN_DIR`: one self-contained HTML page of a training run (or of an `agentrl
sft` output folder, or of an `agentrl eval --out` file) to open in any browser, offline.

    agentrl report runs/agentrl/quick                      # -> runs/agentrl/quick/report.html
    agentrl report runs/agentrl/quick/sft                  # the warm start of agentrl sft
    agentrl report runs/agentrl/quick --reference random.json oracle.json
    agentrl report eval_results.json                       # -> eval_results.html

The page shows the run's config, learning curves from metrics.jsonl (success per preset with
random and oracle reference lines, return, format errors, valid actions, losses), a per-preset
table, and an episode browser over episodes/step_N.jsonl: pick a step, a split and a preset,
step through an episode turn by turn (observation, reply, actions, reward, flags), and compare
the same held-out game at another step side by side. The address keeps the selection
(#step=..&split=..&preset=..&seed=..&turn=..&compare=..), so a link opens the same view.

An `agentrl sft` output folder (or a run folder holding only its sft/) gives the warm start's
page: held-out success and the other rates before the first update and after the last, the loss,
its summary and settings (agentrl/cli/sft_report.py).

Reference lines: `agentrl eval --policy random|oracle --out FILE` results given with
--reference, and, unless --no-play-references, the oracle and random policies played now on the
run's validation seeds (no model; seconds for the grid games, TextWorld makes its games once).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agentrl.cli.arguments import positive_int, writable_path
from agentrl.cli.sft_report import SUMMARY_FILE, sft_data, sft_folder


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="a run folder (local or verl), an `agentrl sft` output "
                                       "folder or an `agentrl eval --out` JSON file")
    parser.add_argument("--out", default=None,
                        help="HTML file to write (default: RUN_DIR/report.html, or the eval "
                             "file's name with .html)")
    parser.add_argument("--reference", nargs="+", default=[], metavar="EVAL_JSON",
                        help="`agentrl eval --policy random|oracle --out` files: reference lines")
    parser.add_argument("--no-play-references", action="store_true",
                        help="do not play the random and oracle policies on the validation seeds")
    parser.add_argument("--screenshot", default=None, metavar="PNG",
                        help="also save a headless-Chromium screenshot of the page (needs "
                             "chromium)")
    parser.add_argument("--max-episode-steps", type=positive_int, default=40,
                        help="steps whose episodes the page holds, evenly spread with the first "
                             "and last (default 40: keeps a 1,000-step run's page small)")


def run(args: argparse.Namespace, out=None) -> int:
    from agentrl.report import REPORT_FILE, write_report
    from agentrl.report.data import read_eval_file

    out = out or sys.stdout
    if Path(args.source).name == SUMMARY_FILE and Path(args.source).is_file():
        args.source = str(Path(args.source).parent)  # agentrl sft's summary: its folder's page
    for reference in args.reference:  # checked before references are played
        read_eval_file(reference, "--reference")
    if args.out is not None:
        writable_path(args.out, "--out")
    if args.screenshot is not None:
        from agentrl.report.browser import CHROMIUM_NAMES, chromium

        writable_path(args.screenshot, "--screenshot")
        if chromium() is None:
            raise ValueError(f"--screenshot {args.screenshot} needs headless Chromium, and none "
                             f"is on the PATH (looked for {', '.join(CHROMIUM_NAMES)}); "
                             "allowed: no --screenshot, or install it (Debian: apt-get install "
                             "-y chromium)")
    options = {}
    if not _is_file(args.source):
        options = {"reference_files": args.reference,
                   "play_references": not args.no_play_references,
                   "max_episode_steps": args.max_episode_steps}
    sft = sft_folder(Path(args.source)) if Path(args.source).is_dir() else None
    if sft is not None:  # an `agentrl sft` output folder, or a run folder holding only one
        options.pop("max_episode_steps")
        path = _write_page(sft_data(sft, **options), args.out or Path(args.source) / REPORT_FILE)
    else:
        _check_run_folder(Path(args.source))
        path = write_report(args.source, args.out, **options)
    size = path.stat().st_size
    print(f"wrote {path} ({size / 1024:.0f} KiB); open it in a browser", file=out)
    if args.screenshot:
        from agentrl.report.browser import screenshot

        print(f"wrote {screenshot(path, args.screenshot)}", file=out)
    return 0


def _is_file(source: str) -> bool:
    return Path(source).is_file()


def _write_page(data: dict, out: str | Path) -> Path:
    from agentrl.report import render_page

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_page(data), encoding="utf-8")
    return out


def _check_run_folder(source: Path) -> None:
    """A folder with none of the files a run or `agentrl sft` writes: say what is accepted."""
    if source.is_dir() and not (source / "metrics.jsonl").is_file() \
            and not (source / "episodes").is_dir():
        raise ValueError(f"{source} is not a run folder: it has no metrics.jsonl or episodes/ "
                         f"(agentrl train) and no {SUMMARY_FILE} (agentrl sft writes it when "
                         "it ends); allowed: a run folder, an agentrl sft output folder or an "
                         "`agentrl eval --out` file")
