"""`agentrl eval`: play held-out games and report per-preset metrics.

    agentrl eval --groups 8                                        # the embedded model
    agentrl eval --policy oracle --presets all --groups 4          # reference rows
    agentrl eval --policy random --groups 8 --out random.json
    agentrl eval --model RUN_DIR                      # its best step, as the run validated
    agentrl eval --model RUN_DIR --checkpoint last    # its newest step (or step_N)
    agentrl eval --model RUN_DIR --presets simpleSokobanAgent largeSokobanAgent
    agentrl eval --model RUN_DIR/checkpoints/step_000100 --out step100.json
    agentrl eval --model Qwen/Qwen2.5-0.5B-Instruct --device cuda --max-batch 64
    agentrl eval --presets babyaiGoTo3Agent --compare enable_think=true enable_think=false

Every preset plays the same GROUPS games (the first seeds of the held-out split, see
agentrl/envs/splits.py), each GROUP_SIZE times. The model decodes greedily unless
--temperature is set. A training run (local or verl: a verl run's newest intact step, or
--checkpoint step_N, from the Hugging Face model its actor saved) or checkpoint plays as the
run validated, so its last
validation number and this one agree: its val.presets, val.group_num and val.group_size, its
agent presets as the run had them (history windows, prompts), constrained or free
(rollout.constrained_actions), its reply limit (val.max_new_tokens, else
rollout.max_new_tokens) and context budget, each unless a flag says otherwise
(--[no-]constrained, --max-new-tokens, ...; agentrl/cli/run_settings.py). Any other model
decodes free, each preset at its own reply limit. A `decoding:` line and the JSON's
"decoding" say how replies were decoded and where the settings came from. --policy oracle / random play without a model: the game's known solution
and uniformly random legal actions, the bounds a trained model sits between.

Prints a table (success % with its 95% Wilson interval, mean return, mean turns, valid-action
%, format-error %, mean response tokens per preset) and writes the same numbers with the seeds and settings as JSON to
--out (default eval_results.json; where that exists, an earlier eval's, the first free
eval_results_N.json, N = 2, 3, ...: only an --out that names a file replaces it), with
--log-episodes episodes per preset recorded turn by turn
(`agentrl report eval_results.json` shows them). --model takes 'embedded', 'tiny', a Hugging Face folder or
hub id, a training checkpoint folder (its actor/ model is loaded) or a training run folder (its
best checkpoint by held-out validation, checkpoints/best.json, else its newest; --checkpoint
last|step_N chooses another). Presets are the names in configs/agents.yaml, or 'all' (TextWorld
presets generate their games on first use: slow once).

--compare VARIANT [VARIANT ...] plays every variant (agent settings KEY=VALUE[,KEY=VALUE] laid
over each preset, e.g. enable_think=false; one that repeats an earlier one's settings is played
once) on the same seeds and prints one table (success,
return, reply tokens, seconds per episode per variant and preset); the JSON holds each
variant's results and a PNG of the table goes to --plot (default: --out with .png).
See agentrl/evaluation/compare.py.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentrl.cli.arguments import (
    check_device, non_negative_float, non_negative_int, positive_int, writable_path,
)

DEFAULT_PRESETS = ("simpleSokobanAgent", "tetrisType1Agent", "blocksworldTextAgent")
POLICIES = ("model", "oracle", "random")
SPLITS = ("val", "test")
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("float32", "bfloat16", "float16")
DEFAULT_OUT = "eval_results.json"
TABLE_WIDTH = 160
"""Console width when the output is not a terminal (a file or a pipe), so rows never wrap."""
CHECKPOINT_MODEL = Path("actor")
"""A training checkpoint keeps its Hugging Face model in this sub-folder."""
CHECKPOINTS_DIR = "checkpoints"
"""A training run keeps its checkpoints here (``agentrl.trainers.checkpoint.CHECKPOINTS_DIR``)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--presets", nargs="+", default=None, metavar="PRESET",
                        help="agent presets, or 'all' (default: a run's val.presets, else "
                             f"{' '.join(DEFAULT_PRESETS)})")
    parser.add_argument("--groups", type=positive_int, default=None,
                        help="held-out games per preset (default: a run's val.group_num, else 4)")
    parser.add_argument("--group-size", type=positive_int, default=None,
                        help="episodes per game (default: a run's val.group_size, else 1; >1 is "
                             "useful with --temperature)")
    parser.add_argument("--policy", choices=POLICIES, default="model",
                        help="who plays: the model (default), the oracle or random legal actions")
    parser.add_argument("--model", default="embedded",
                        help="embedded (default), tiny, an HF folder or hub id, a checkpoint or a "
                             "run folder")
    parser.add_argument("--checkpoint", default=None, metavar="best|last|step_N",
                        help="which checkpoint of a run folder --model loads (default best: by "
                             "held-out validation)")
    parser.add_argument("--split", choices=SPLITS, default="val",
                        help="held-out seed range (default val)")
    parser.add_argument("--out", default=None,
                        help=f"JSON file for the results, replaced if it exists (default "
                             f"{DEFAULT_OUT}, or where that exists the first free "
                             f"{Path(DEFAULT_OUT).stem}_N.json: an earlier eval is kept)")
    parser.add_argument("--device", choices=DEVICES, default="auto",
                        help="where the model runs (default auto: cuda when available)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32",
                        help="model weights' dtype (default float32)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=None,
                        help="cap on one reply's tokens (default: a run's validation limit, "
                             "else each preset's own)")
    parser.add_argument("--max-context-tokens", type=positive_int, default=None,
                        help="token budget of one episode's context (default: a run's "
                             "rollout.max_context_tokens, else 8192; at most the model's own)")
    parser.add_argument("--temperature", type=non_negative_float, default=0.0,
                        help="sampling temperature (default 0: greedy)")
    parser.add_argument("--constrained", action=argparse.BooleanOptionalAction, default=None,
                        help="mask the model's replies to well-formed answers of each turn's "
                             "valid actions, or not (--no-constrained); default: as a run "
                             "validated (its rollout.constrained_actions), else free")
    parser.add_argument("--max-batch", type=positive_int, default=None,
                        help="most replies decoded together (default: a run's "
                             "rollout.max_batch, else 16)")
    parser.add_argument("--prefix-cache-tokens", type=non_negative_int, default=None,
                        help="keys/values of past turns kept, so a turn reads only its new "
                             "tokens (default: a run's rollout.prefix_cache_tokens, else 65536; "
                             "0 = off)")
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch CPU threads (default: torch's choice; 1 is often faster on "
                             "a busy machine)")
    parser.add_argument("--seed", type=non_negative_int, default=0,
                        help="seeds the random policy and the sampler (default 0)")
    parser.add_argument("--log-episodes", type=non_negative_int, default=8,
                        help="episode records (turn by turn) kept in the JSON per preset, for "
                             "`agentrl report` (default 8; 0 = none)")
    parser.add_argument("--compare", nargs="+", default=None, metavar="VARIANT",
                        help="agent settings to compare on the same seeds, one variant per "
                             "argument: KEY=VALUE[,KEY=VALUE], e.g. enable_think=true "
                             "enable_think=false")
    parser.add_argument("--plot", default=None,
                        help="PNG of the --compare table (default: --out with .png)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def select_presets(names: list[str], available: Mapping[str, Any]) -> dict[str, Any]:
    """The named presets in the order given ('all' = every one); unknown names -> ValueError."""
    names = list(available) if "all" in names else list(dict.fromkeys(names))
    unknown = [name for name in names if name not in available]
    if unknown:
        raise ValueError(f"unknown preset(s) {unknown} for --presets; allowed: 'all' or "
                         f"{', '.join(available)}")
    return {name: available[name] for name in names}


def model_path(name: str, flag: str = "--model") -> str:
    """The model folder ``name`` stands for: a model folder, a checkpoint's ``actor/``, a
    training run's best (else newest) intact checkpoint's ``actor/``
    (:func:`agentrl.trainers.checkpoint.model_folder`), or else ``name`` itself (a built-in
    model or a hub id). A path that is no model fails, naming ``flag``."""
    path = Path(name).expanduser()
    if not path.exists() and ("/" not in name or _looks_like_hub_id(name)) \
            and not name.startswith((".", "~")):
        return name
    from agentrl.trainers.checkpoint import model_folder

    try:
        return str(model_folder(path))
    except ValueError as error:  # it names the path
        raise ValueError(f"{flag}: {error}") from None


def _looks_like_hub_id(name: str) -> bool:
    """``owner/model``: one slash, no leading one."""
    return name.count("/") == 1 and not name.startswith("/")


def load_named_model(name: str, flag: str = "--model", **options: Any):
    """:func:`agentrl.models.load_model` of :func:`model_path`; a name that loads nothing
    fails as a ``ValueError`` naming ``flag`` (its message lists what was tried)."""
    from agentrl.models import load_model
    from agentrl.models.loading import ModelNotFoundError

    try:
        return load_model(model_path(name, flag), **options)
    except (ModelNotFoundError, OSError) as error:
        raise ValueError(f"{flag} {name}: {error}") from None


def run(args: argparse.Namespace, out=None) -> int:
    from rich.console import Console

    from agentrl.agents import load_agent_presets
    from agentrl.evaluation import evaluate

    out = out or sys.stdout
    from agentrl.trainers.checkpoint import chosen_model

    args.model = chosen_model(args.model, args.checkpoint)  # a run folder's --checkpoint
    settings = None
    if args.policy == "model":
        from agentrl.cli.run_settings import run_settings

        settings = run_settings(args.model)  # a run plays as its validation did
    available = settings.agents if settings is not None else load_agent_presets()
    names = args.presets or (settings.val_presets if settings is not None else DEFAULT_PRESETS)
    presets = select_presets(list(names), available)
    named_out = args.out is not None
    args.out = args.out if named_out else str(free_path(DEFAULT_OUT))
    writable_path(args.out, "--out")
    if args.plot is not None:
        writable_path(args.plot, "--plot")
    if args.policy == "model":
        check_device(args.device)
    variants = None
    if args.compare:
        from agentrl.evaluation.compare import apply_variant, parse_variant

        variants = distinct_variants([parse_variant(text) for text in args.compare], out)
        for variant in variants:  # a bad value fails before the model loads
            apply_variant(presets, variant)
    llm = decoding = None
    if args.policy == "model":
        presets, decoding = _decoding(args, presets, settings)
        sampling = _sampling(args, presets, decoding)  # bad settings fail before the model loads
        llm = _load_llm(args, settings)
        policy, label = llm, args.model
        options = {"sampling": sampling,
                   "max_context_tokens": min(decoding.max_context_tokens, _model_context(llm))}
    else:
        policy, label, options = args.policy, args.policy, {}
    groups = args.groups or (settings.groups if settings is not None else 4)
    group_size = args.group_size or (settings.group_size if settings is not None else 1)
    common = dict(groups=groups, group_size=group_size, split=args.split,
                  seed=args.seed, label=label, progress=not args.no_progress, **options)
    try:
        if variants:
            from agentrl.evaluation.compare import compare

            results = asyncio.run(compare(presets, policy, variants, **common))
        else:
            result = asyncio.run(evaluate(presets, policy, **common))
    finally:
        if llm is not None:
            llm.close()
    console = Console(file=out, width=None if out.isatty() else TABLE_WIDTH)
    if decoding is not None:
        console.print(f"decoding: {decoding.describe()}", highlight=False, soft_wrap=True)
    if variants:
        report = _comparison_report(results, args, label, console)
    else:
        console.print(result.table())
        report = result.to_dict()
        report["episodes"] = result.episode_records(args.log_episodes)
    if llm is not None:
        report["decoding"] = decoding.to_dict()
        report["model"] = {"name": args.model, "path": model_path(args.model),
                           "sampling": dataclasses.asdict(options["sampling"]),
                           "generation": llm.stats.as_dict()}
    path = Path(args.out) if named_out else free_path(DEFAULT_OUT)  # taken meanwhile: the next
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    kept = "" if named_out or path.name == DEFAULT_OUT else (
        f" ({DEFAULT_OUT} is kept, an earlier eval's; --out names the file to write)")
    console.print(f"wrote {path}{kept}", highlight=False, soft_wrap=True)
    return 0


def free_path(name: str | Path) -> Path:
    """``name`` where no file is there, else the first free ``<stem>_N<suffix>`` (N = 2, 3,
    ...) beside it: a default output never replaces an earlier one."""
    path = Path(name)
    number = 2
    while path.exists():
        path = Path(name).with_name(f"{Path(name).stem}_{number}{Path(name).suffix}")
        number += 1
    return path


def distinct_variants(variants: list, out) -> list:
    """The variants with distinct settings, each once in the order first given; the ones left
    out are named on ``out`` (``enable_think=True`` repeats ``enable_think=true``)."""
    kept: dict[str, Any] = {}
    repeats: dict[str, list[str]] = {}
    for variant in variants:
        key = json.dumps(variant.settings, sort_keys=True, default=str)
        if key in kept:
            repeats.setdefault(kept[key].label, []).append(variant.label)
        else:
            kept[key] = variant
    for label, same in repeats.items():
        print(f"--compare: {', '.join(map(repr, same))} repeat{'s' if len(same) == 1 else ''} "
              f"{label!r}: played once", file=out)
    return list(kept.values())


def _comparison_report(results, args: argparse.Namespace, label: str, console) -> dict:
    """Print the --compare table, draw its PNG; the JSON report of every variant."""
    from agentrl.evaluation.compare import comparison_rows, comparison_table, plot_comparison

    rows = comparison_rows(results)
    first = results[0][1]
    title = (f"{label} on {first.split} seeds ({len(first.seeds)} per preset x "
             f"{first.group_size}), variants compared")
    console.print(comparison_table(rows, title))
    plot = plot_comparison(rows, args.plot or Path(args.out).with_suffix(".png"), title)
    console.print(f"wrote {plot}")
    return {"comparison": rows, "plot": str(plot),
            "variants": {variant.label: result.to_dict() for variant, result in results}}


def _load_llm(args: argparse.Namespace, settings=None):
    import torch

    from agentrl.engines import BatchingLLM

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    max_batch = args.max_batch or (settings and settings.max_batch) or 16
    cache = args.prefix_cache_tokens
    if cache is None:
        cache = settings.prefix_cache_tokens if settings and settings.prefix_cache_tokens \
            is not None else 65536
    model, tokenizer = load_named_model(args.model, device=args.device, dtype=args.dtype)
    return BatchingLLM(model, tokenizer, max_batch=max_batch, seed=args.seed,
                       prefix_cache_tokens=cache)


def _decoding(args: argparse.Namespace, presets: dict[str, Any], settings):
    """The presets as they play and how replies are decoded: a flag, else the run's
    validation (``settings``), else greedy, free, each preset's own reply limit."""
    from agentrl.cli.run_settings import played_presets
    from agentrl.evaluation.decoding import Decoding, history_shown

    run = settings.decoding if settings is not None else None
    limit = args.max_new_tokens or (run.max_new_tokens if run else None)
    if run is not None:  # the run's reply limit is the one its prompts state
        presets = played_presets(presets, limit)
    constrained = args.constrained if args.constrained is not None else bool(
        run and run.constrained)
    context = args.max_context_tokens or (run and run.max_context_tokens) or 8192
    flags = [flag for flag, given in (
        ("--max-new-tokens", args.max_new_tokens is not None),
        ("--constrained" if args.constrained else "--no-constrained", args.constrained is not None),
        ("--temperature", args.temperature > 0),
        ("--max-context-tokens", args.max_context_tokens is not None)) if given]
    source = run.source if run else "agentrl eval's defaults"
    if flags:
        source += f", with {', '.join(flags)}"
    return presets, Decoding(constrained=constrained, max_new_tokens=limit,
                             temperature=args.temperature, max_context_tokens=context,
                             history_windows={name: history_shown(config)
                                              for name, config in presets.items()},
                             source=source)


def _sampling(args: argparse.Namespace, presets: Mapping[str, Any], decoding):
    from agentrl.evaluation import greedy_sampling

    sampling = greedy_sampling(presets)
    if decoding.max_new_tokens is not None:
        sampling = dataclasses.replace(sampling, max_new_tokens=decoding.max_new_tokens)
    if decoding.temperature > 0:
        sampling = dataclasses.replace(sampling, greedy=False, temperature=decoding.temperature)
    return dataclasses.replace(sampling, constrained_actions=decoding.constrained)


def _model_context(llm) -> int:
    return llm.max_positions or sys.maxsize
