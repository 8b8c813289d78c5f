"""Which recipe teaches a model a real game? Held-out greedy success before and after each.

    python scripts/bench/learn.py                      # tightBlocksworldTurnsAgent, 5 recipes x 3 seeds
    python scripts/bench/learn.py --recipes untrained sft sft_ppo --seeds 1 --minutes 30 threads=1
    python scripts/bench/learn.py --preset tightBlocksworldAgent --steps 40 lora.rank=8
    python scripts/bench/learn.py --preset first-token-bandit --recipes untrained ppo
    python scripts/bench/learn.py --steps 1 --val-groups 2 --seeds 1 model=tiny   # a smoke run
    agentrl bench learn [the same options]

Recipes (``--recipes``, default all but ``verl``; one table of differences, ``RECIPES``):

- ``untrained``: the model as it is, evaluated only (greedy play of the same model does not
  depend on a training seed, so it runs once);
- ``ppo``: PPO (the local trainer, :class:`agentrl.trainers.local.LocalTrainer`) for
  ``--steps`` steps with constrained action decoding off, in training and evaluation;
- ``ppo_constrained``: the same with constrained action decoding on (the local default);
- ``sft``: the supervised warm start on oracle play (:class:`agentrl.trainers.sft.SFTTrainer`,
  ``--sft-episodes`` demonstrations x ``--sft-epochs``), constrained decoding on;
- ``sft_ppo``: PPO from that SFT run's checkpoint (the same run, shared with ``sft``);
- ``verl`` (asked for by name: it needs vLLM's CPU build, ``bash env_setup.sh --verl-cpu``, and
  ~10-13 GB): the same warm start and PPO through verl's own trainers on this CPU
  (``agentrl sft backend=verl`` then ``agentrl train hardware=cpu-verl`` from its model
  folder, each a child process in a session of its own, ended with everything it started),
  the same demonstrations, episodes a step, ``--steps`` and constrained decoding, evaluated by
  the local evaluator from the final actor's Hugging Face folder. verl's SFT trainer learns
  whole episodes (no context windows), so this row trains and plays (its "before" too) with
  the preset's ``history_window`` 0, labelled ``verl (history_window=0)``; a whole episode is
  checked to fit verl's ``max_prompt_length``/``max_response_length`` first. Its stage records
  verl's ``timing_s/*`` per step (scripts/bench/learn_verl.py). ``--minutes`` and ``--lever``
  do not apply to it.

Every recipe is measured on the same ``--val-groups`` held-out seeds of ``--preset``
(:func:`agentrl.evaluation.evaluate`, greedy, one episode per game): "before" is the untrained
model under the recipe's decoding, "after" the trained one. Each recipe but ``untrained``
trains once per training seed (``--seeds`` N: seeds 0..N-1), each in its own run folder
``<--run-dir>/<recipe>/seed_<s>``. The table shows per recipe the mean after-success, its
spread over seeds (min-max and std), the gain over before, and the wall minutes of a run
(training, and with evaluation). Random legal play and the oracle are the reference rows. JSON
goes to ``--out`` (via :func:`agentrl.cli.bench.write_result`), the plot beside it (``.png``).

Budget: ``--steps`` PPO steps (the CPU hardware preset: 4 groups x 8 episodes a step) and
``--sft-episodes`` x ``--sft-epochs`` SFT. ``--minutes M`` also caps the training wall time of a
run: the trainers get a deadline (``fit(deadline=...)``) and stop after the PPO step or SFT
update that passes it (the last PPO step is validated and saved as usual), so a recipe never
trains longer than M minutes plus one step; ``sft_ppo``'s PPO gets what its SFT left of M (at
least one step). Evaluation is not counted.

Resuming: a finished stage writes ``stage.json`` in its folder and is not run again (with other
settings the benchmark refuses the folder, naming it). A stage's settings hold its resolved
config (the SFT and PPO sections, the preset's agent settings), so a default changed since it ran
is refused too, naming the key; a record from before they held it reads back on its overrides
alone, with a note. A stopped PPO run resumes from its newest
checkpoint (``resume=auto``, every ``trainer.save_freq`` steps), with a fresh ``--minutes``;
a finished PPO stage asked for more ``--steps`` (``--val-every`` may change too) goes on from
its last checkpoint when it is still there (``--keep-checkpoints``), its curve and minutes
counting from its first step.
``--only-seed S`` (repeatable) runs only those training seeds, so processes sharing one
``--run-dir`` can split a benchmark by seed; a last run without it reads every stage back and
writes the whole table.
The checkpoints of the stages a process trains are deleted at its end unless
``--keep-checkpoints`` (a 135M model with its optimizer state is ~1.6 GB a run); the stages it
only reads back (a shared warm start, a run kept with ``--keep-checkpoints``) and those of
other processes sharing ``--run-dir`` keep theirs. The SFT stage
saves its AdamW moments with its model (``sft.save_optimizer``; not with LoRA), so a lever with
``actor.warm_optimizer=true`` starts PPO from them.

Expected time (embedded SmolLM2-135M, 2 CPU cores, ``threads=1``, load ~2.5; measured on a
2-step smoke run): a PPO step of ``tightSokobanAgent`` ~30 s, an SFT update of 8
demonstrations ~50 s, 4 evaluation games ~9 s (32, batched: about a minute, estimated); so a
PPO run of the default 20 steps ~10 min, the default SFT (64 x 3: 24 updates) ~20 min, and all
five recipes x 3 seeds about 2.5-3 hours (``--minutes`` caps it).

Extra ``key=value`` arguments are config overrides of every run (``threads=1``,
``lora.rank=8``, ``actor.lr=...``); the recipe's own keys (decoding, presets, model) win.
``--lever NAME=KEY=VALUE[,KEY=VALUE]`` (repeatable) adds, per lever, one more run of every chosen recipe
that has a PPO stage, with those config overrides on its PPO stage only (``sft_ppo`` shares
the SFT stage of the recipe without the lever, so a lever row differs from ``sft_ppo`` in PPO
alone), each in ``<--run-dir>/<recipe>@<NAME>/``, rows labelled ``recipe @NAME``: the levers of
RL after the warm start, measured beside the recipes.
``--lever-only`` leaves out the rows without the lever (the SFT stage still runs), for a lever
measured against the plain rows of an earlier run.
``--compare VARIANT ...`` runs every recipe once per variant of the preset's agent settings
(``KEY=VALUE[,KEY=VALUE]`` as ``agentrl eval --compare``, e.g. ``enable_think=true
enable_think=false``), each in ``<--run-dir>/<variant>/``, rows labelled ``recipe [variant]``.
``--preset first-token-bandit`` keeps the older sanity task (:mod:`agentrl.trainers.sanity`):
a one-token Bandit over the model's ``--arms`` most likely first tokens (recipes ``untrained``
and ``ppo`` only).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import gc
import json
import shutil
import statistics
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from agentrl.cli.bench import script_module, write_result
from agentrl.config import build_config, compose_config
from agentrl.engines import BatchingLLM, SamplingParams
from agentrl.evaluation import EvalResult, evaluate
from agentrl.evaluation.stats import wilson_interval
from agentrl.models import load_model
from agentrl.trainers.checkpoint import CHECKPOINTS_DIR, latest_checkpoint
from agentrl.trainers.device import resolve_device
from agentrl.trainers.local import LocalTrainer
from agentrl.trainers.sft import SFTTrainer
from agentrl.trainers.ppo_update import pooled_explained_variance
from agentrl.trainers.tracking import read_metrics

BANDIT = "first-token-bandit"
STAGE_FILE = "stage.json"
TRAINED_STAGES: set[Path] = set()
"""The stage folders this process trained (made or extended): the only checkpoints it prunes."""
SFT_SECTIONS = ("model", "lora", "sft", "val")
PPO_SECTIONS = ("model", "lora", "train", "val", "rollout", "algorithm", "actor", "critic")
"""The config sections a stage's record holds resolved (:meth:`Configs.resolved`)."""
UNRESOLVED = {("sft", "output_dir"), ("train", "total_steps"), ("val", "test_freq")}
"""Keys a stage's settings hold otherwise (``steps``, ``val_every``) or that name a path."""
OUTPUT = script_module(Path(__file__).parent / "output" / "learn.py")
"""The table and the plot (scripts/bench/output/learn.py)."""
VERL = script_module(Path(__file__).parent / "learn_verl.py")
"""The ``verl`` recipe's commands, token budget and timings (scripts/bench/learn_verl.py)."""


class Recipe(NamedTuple):  # not a dataclass: the script also loads as a nameless module
    sft: bool
    """Starts from the SFT stage's checkpoint (or is that stage)."""
    ppo: bool
    constrained: bool
    """rollout.constrained_actions of its training and evaluation."""
    verl: bool = False
    """Trained by verl's own trainers (SFT, then PPO) in child processes, with the preset's
    history_window 0 (scripts/bench/learn_verl.py)."""


RECIPES = {
    "untrained": Recipe(sft=False, ppo=False, constrained=True),
    "ppo": Recipe(sft=False, ppo=True, constrained=False),
    "ppo_constrained": Recipe(sft=False, ppo=True, constrained=True),
    "sft": Recipe(sft=True, ppo=False, constrained=True),
    "sft_ppo": Recipe(sft=True, ppo=True, constrained=True),
    "verl": Recipe(sft=True, ppo=True, constrained=True, verl=True),
}
LOCAL_RECIPES = [name for name, recipe in RECIPES.items() if not recipe.verl]
"""The default: verl's recipe needs vLLM's CPU build and ~10-13 GB, so it is asked for."""
BANDIT_RECIPES = ("untrained", "ppo")  # the bandit's task is its first free token


def parse_levers(parser: argparse.ArgumentParser, texts: list[str]) -> dict[str, list[str]]:
    """``--lever NAME=KEY=VALUE[,KEY=VALUE]`` texts as {name: overrides}; a bad one is a usage
    error naming it."""
    levers = {}
    for text in texts:
        name, _, overrides = text.partition("=")
        pairs = [pair.strip() for pair in overrides.split(",") if pair.strip()]
        if not name.isidentifier() or not pairs or any("=" not in pair for pair in pairs):
            parser.error(f"--lever {text!r}: expected NAME=KEY=VALUE[,KEY=VALUE] with a NAME "
                         "of letters, digits and underscores")
        levers[name] = pairs
    return levers


def add_stage_arguments(parser: argparse.ArgumentParser, *, steps: int, steps_help: str,
                        val_groups: int, run_dir: str, out: str,
                        keep_checkpoints: bool = True) -> None:
    """The arguments of a benchmark built on these stages (ppo_gain, flawed_teacher, pool): one
    warm start per training seed, PPO from it within ``--minutes``, held-out games to compare
    on. Check them with :func:`check_stage_arguments`."""
    parser.add_argument("--preset", default="tightBlocksworldTurnsAgent")
    parser.add_argument("--seeds", type=int, default=3, help="training seeds (default 3)")
    parser.add_argument("--only-seed", type=int, action="append", default=None, metavar="S",
                        help="run only training seed S of the --seeds (repeatable)")
    parser.add_argument("--steps", type=int, default=steps, help=steps_help)
    parser.add_argument("--minutes", type=float, default=30.0,
                        help="PPO's training wall budget per seed (default 30)")
    parser.add_argument("--sft-episodes", type=int, default=192,
                        help="warm-start demonstrations (default 192, quick_train.sh's)")
    parser.add_argument("--sft-epochs", type=int, default=1, help="warm-start epochs (default 1)")
    parser.add_argument("--val-groups", type=int, default=val_groups,
                        help=f"held-out games each model plays (default {val_groups})")
    parser.add_argument("--run-dir", default=run_dir,
                        help="folder of the stage folders (reused: a stopped benchmark resumes)")
    parser.add_argument("--out", default=out,
                        help="JSON output path; the plot goes beside it as .png")
    if keep_checkpoints:
        parser.add_argument("--keep-checkpoints", action="store_true",
                            help="keep the checkpoints of the stages this run trains (a later "
                                 "run then starts from the same warm start file; without it the "
                                 "warm start is trained again, which on a CPU at threads=1 "
                                 "repeats bit for bit)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="config overrides of every stage")


def check_stage_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace,
                          positive: tuple[str, ...] = ()) -> argparse.Namespace:
    """:func:`add_stage_arguments`' values checked (a bad one is a usage error naming it, with
    ``positive``: more counts that must be >= 1), and what :class:`Configs` and the stages read
    from this script's own arguments filled in."""
    for name in ("seeds", "steps", "sft_episodes", "sft_epochs", "val_groups", *positive):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.minutes <= 0:
        parser.error("--minutes must be > 0")
    if args.only_seed and not all(0 <= seed < args.seeds for seed in args.only_seed):
        parser.error(f"--only-seed must be a training seed of --seeds {args.seeds}: "
                     f"0..{args.seeds - 1}")
    args.run_dir = Path(args.run_dir).resolve()
    args.val_every, args.arms = args.steps, 4
    args.keep_checkpoints = getattr(args, "keep_checkpoints", False)
    return args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tightBlocksworldTurnsAgent",
                        help=f"agent preset to train and evaluate on, or {BANDIT} "
                             "(default tightBlocksworldTurnsAgent, quick_train.sh's)")
    parser.add_argument("--recipes", nargs="+", choices=list(RECIPES), default=None,
                        help="recipes to compare (default: all but verl; the bandit: untrained ppo)")
    parser.add_argument("--seeds", type=int, default=3,
                        help="training seeds per recipe (default 3)")
    parser.add_argument("--only-seed", type=int, action="append", default=None,
                        metavar="S", help="run only training seed S of the --seeds (repeatable): "
                        "one benchmark split over processes sharing --run-dir, each its seeds")
    parser.add_argument("--steps", type=int, default=20, help="PPO steps per run (default 20)")
    parser.add_argument("--sft-episodes", type=int, default=64,
                        help="oracle demonstrations of the SFT stage (default 64)")
    parser.add_argument("--sft-epochs", type=int, default=3, help="SFT epochs (default 3)")
    parser.add_argument("--minutes", type=float, default=None,
                        help="wall budget of a run's training, in minutes (default: none)")
    parser.add_argument("--val-groups", type=int, default=32,
                        help="held-out games, the same for every recipe (default 32)")
    parser.add_argument("--val-every", type=int, default=None,
                        help="also validate every K PPO steps: per-seed held-out curves in the "
                             "JSON and the plot (default: at the last step only)")
    parser.add_argument("--arms", type=int, default=4, help=f"arms of {BANDIT} (default 4)")
    parser.add_argument("--run-dir", default="bench_results/learn_runs",
                        help="folder of the run folders (reused: a stopped benchmark resumes)")
    parser.add_argument("--out", default="bench_results/learn.json",
                        help="JSON output path; the plot goes beside it as .png")
    parser.add_argument("--keep-checkpoints", action="store_true",
                        help="keep the checkpoints of the stages this run trains (default: deleted "
                             "at the end; stages only read back always keep theirs)")
    parser.add_argument("--compare", nargs="+", default=None, metavar="VARIANT",
                        help="agent settings over --preset, KEY=VALUE[,KEY=VALUE]: every "
                             "recipe runs once per variant (e.g. enable_think=true "
                             "enable_think=false)")
    parser.add_argument("--lever-only", action="store_true",
                        help="run only the --lever rows of the PPO recipes (their SFT stage "
                             "still runs): the rows without the lever come from another run")
    parser.add_argument("--lever", action="append", default=[],
                        metavar="NAME=KEY=VALUE[,KEY=VALUE]",
                        help="one more run of each chosen PPO recipe with these overrides on "
                             "its PPO stage only (rows 'recipe @NAME'); repeat for more levers")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="config overrides of every run")
    args = parser.parse_args(argv)
    bandit = args.preset == BANDIT
    args.recipes = list(dict.fromkeys(args.recipes or (BANDIT_RECIPES if bandit
                                                       else LOCAL_RECIPES)))
    if bandit and set(args.recipes) - set(BANDIT_RECIPES):
        parser.error(f"--preset {BANDIT} allows --recipes {' '.join(BANDIT_RECIPES)}")
    if bandit and args.compare:
        parser.error(f"--compare needs an agent preset (--preset), not {BANDIT}")
    args.levers = parse_levers(parser, args.lever)
    if args.lever_only and not args.levers:
        parser.error("--lever-only needs a --lever")
    if args.levers and not any(RECIPES[r].ppo and not RECIPES[r].verl for r in args.recipes):
        parser.error("--lever needs a recipe with a PPO stage (ppo, ppo_constrained, "
                     "sft_ppo; not verl)")
    if "verl" in args.recipes and args.minutes is not None:
        parser.error("--minutes does not cap the verl recipe (verl's trainers take no "
                     "deadline); allowed: --minutes without verl in --recipes, or no --minutes")
    if args.val_every is None:
        args.val_every = args.steps
    for name in ("seeds", "steps", "sft_episodes", "sft_epochs", "val_groups", "arms",
                 "val_every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.minutes is not None and args.minutes <= 0:
        parser.error("--minutes must be > 0")
    if args.only_seed and not all(0 <= seed < args.seeds for seed in args.only_seed):
        parser.error(f"--only-seed must be a training seed of --seeds {args.seeds}: "
                     f"0..{args.seeds - 1}")
    if "verl" in args.recipes:  # last: an argument's own error holds on any machine
        from agentrl.verl.child_run import verl_cpu_python

        if verl_cpu_python() is None:
            parser.error("--recipes verl needs vLLM's CPU build, which no venv here has; "
                         "allowed: bash env_setup.sh --verl-cpu first, or the other recipes")
    args.run_dir = Path(args.run_dir).resolve()
    return args


# -- configs -------------------------------------------------------------------------------------
class Configs:
    """The config of each stage: the user's overrides, then the benchmark's and recipe's keys."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.before: dict[bool, dict[str, Any]] = {}
        """The untrained model's held-out row per decoding: the start of a PPO curve."""
        self.bandit_agents = None
        if args.preset == BANDIT:
            from agentrl.trainers.sanity import first_token_bandit, likely_arms

            base = compose_config(args.overrides)
            model, tokenizer = load_model(base.model.name, dtype=base.model.dtype,
                                          chat_template=base.model.chat_template)
            self.bandit_agents = {BANDIT: first_token_bandit(likely_arms(model, tokenizer,
                                                                         args.arms))}
            del model

    def settings(self, **stage: Any) -> dict[str, Any]:
        """What a stage's result depends on: a finished stage with other settings is refused."""
        args = self.args
        arms = {"arms": args.arms} if self.bandit_agents is not None else {}
        return {"preset": args.preset, "val_groups": args.val_groups,
                "overrides": args.overrides, **arms, **stage}

    def resolved(self, config: Any, sections: tuple[str, ...], *,
                 from_checkpoint: bool = False) -> dict[str, Any]:
        """``sections`` of a stage's config as JSON reads them back, with the preset's agent
        settings: the overrides alone miss a default that changed between two runs into one
        ``--run-dir``, and a stage trained under the old default must not read back as the new
        one's. Paths and the step count (a setting of its own) are left out, and the model's
        name when it is the checkpoint the stage starts from (its ``start_from``)."""
        data = json.loads(json.dumps(config.to_dict(), default=str))
        left_out = UNRESOLVED | ({("model", "name")} if from_checkpoint else set())
        values = {section: {key: value for key, value in data[section].items()
                            if (section, key) not in left_out} for section in sections}
        return {**values, "agent": data["agents"].get(self.args.preset)}

    def decoding(self, recipe: str) -> bool:
        """The recipe's constrained decoding (never for the bandit: its first free token is the
        task)."""
        return RECIPES[recipe].constrained and self.bandit_agents is None

    def build(self, *, constrained: bool, seed: int = 0, run_dir: Path | None = None,
              model: str | None = None, extra: tuple[str, ...] = ()) -> Any:
        args = self.args
        overrides = [*args.overrides, f"val.group_num={args.val_groups}", "val.group_size=1",
                     f"seed={seed}", "trainer.logger=[console]", *extra]
        if run_dir is not None:
            overrides.append(f"run_dir={run_dir}")
        data = compose_config(overrides).to_dict()
        if model is not None:
            data["model"]["name"] = model
        if self.bandit_agents is not None:
            data["agents"] = self.bandit_agents
            data["rollout"].update(top_k=args.arms, max_new_tokens=1)
        data["rollout"]["constrained_actions"] = constrained
        for section in ("train", "val", "sft"):
            data[section]["presets"] = [args.preset]
        return build_config(data)


# -- stages --------------------------------------------------------------------------------------
def stage_folder(run_dir: Path, recipe: str, seed: int, lever: str | None = None) -> Path:
    """``<run_dir>/<recipe>[@<lever>]/seed_<seed>``: a stage's record, metrics and checkpoints
    (the warm start's recipe is ``sft``)."""
    return run_dir / (f"{recipe}@{lever}" if lever else recipe) / f"seed_{seed}"


def cached_stage(folder: Path, settings: dict[str, Any], *, extends: bool = False
                 ) -> dict[str, Any] | None:
    """The finished stage's record in ``folder``, or None; other settings -> ValueError. With
    ``extends`` (a PPO stage), a finished run asked for more ``steps`` (and any ``val_every``)
    is None too when its last checkpoint is there: the trainer resumes from it."""
    path = folder / STAGE_FILE
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    stored = record["settings"]
    unchecked = "config" in settings and "config" not in stored
    if unchecked:  # a record from before stage records held their resolved config
        settings = {key: value for key, value in settings.items() if key != "config"}
    elif "config" in settings:
        settings = {**settings, "config": without_keys_added_since(stored["config"],
                                                                   settings["config"])}
    same = stored == settings
    goes_on = not same and extends and more_steps(stored, settings)
    if unchecked and (same or goes_on):
        print(f"note: {path} holds no resolved config; read back on its overrides alone "
              "(a default changed since it ran is not seen)", file=sys.stderr)
    if same:
        return record
    if goes_on:
        if latest_checkpoint(folder) is not None:  # what the trainer's resume=auto takes
            return None
        raise ValueError(f"{folder} ran {stored['steps']} steps and its checkpoint "
                         f"is gone, so it cannot go on to {settings['steps']}; allowed: its "
                         "--steps, or a run kept with --keep-checkpoints")
    raise ValueError(f"{folder} holds a run made with other settings "
                     f"({'; '.join(settings_changes(stored, settings))}); remove it or choose "
                     "another --run-dir")


def without_keys_added_since(stored: dict[str, Any], wanted: dict[str, Any]) -> dict[str, Any]:
    """``wanted`` (a resolved config's sections) without the keys ``stored`` predates that sit
    at their schema default: a key added to the config since, off by default, changes nothing
    a finished stage did. At another value it is kept, and refused as a change."""
    defaults = schema_defaults()
    return {section: {key: value for key, value in values.items()
                      if key in stored.get(section, {})
                      or defaults.get(section, {}).get(key, value) != value}
            if isinstance(values, dict) and section in defaults else values
            for section, values in wanted.items()}


@functools.cache
def schema_defaults() -> dict[str, dict[str, Any]]:
    """Each config section's keys at their dataclass defaults, as JSON reads them back."""
    root = compose_config([])
    defaults = {}
    for section in dataclasses.fields(root):
        value = getattr(root, section.name)
        if dataclasses.is_dataclass(value):
            defaults[section.name] = {
                field.name: json.loads(json.dumps(
                    field.default if field.default is not dataclasses.MISSING
                    else field.default_factory(), default=str))
                for field in dataclasses.fields(value)
                if field.default is not dataclasses.MISSING
                or field.default_factory is not dataclasses.MISSING}
    return defaults


def settings_changes(stored: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """``key: stored -> wanted`` for each setting that differs, the resolved config's as
    ``section.key`` (the whole config would bury the one key that changed)."""
    def changes(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
        return [f"{prefix}{key}: {old.get(key)!r} -> {new.get(key)!r}"
                for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)]

    old_config, new_config = stored.get("config") or {}, wanted.get("config") or {}
    return [*changes({k: v for k, v in stored.items() if k != "config"},
                     {k: v for k, v in wanted.items() if k != "config"}),
            *(line for section in sorted(set(old_config) | set(new_config))
              for line in changes(old_config.get(section) or {}, new_config.get(section) or {},
                                  f"{section}."))]


def more_steps(saved: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """Whether ``wanted`` is ``saved`` with a larger ``steps`` (``val_every`` free)."""
    free = ("steps", "val_every")
    same = ({k: v for k, v in saved.items() if k not in free}
            == {k: v for k, v in wanted.items() if k not in free})
    return same and wanted.get("steps", 0) > saved.get("steps", 0)


def portable(args: argparse.Namespace, path: str | Path | None) -> str | None:
    """A checkpoint path as stored: relative to ``--run-dir`` when inside it, so a benchmark
    folder committed or moved resumes with its settings unchanged."""
    if path is None:
        return None
    path = Path(path).resolve()
    return str(path.relative_to(args.run_dir)) if path.is_relative_to(args.run_dir) else str(path)


def located(args: argparse.Namespace, path: str | None) -> Path | None:
    """A stored checkpoint path (see :func:`portable`) as a path to open."""
    return None if path is None else args.run_dir / path  # an absolute path stays itself


def save_stage(folder: Path, settings: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    record = {"settings": settings, **record}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / STAGE_FILE).write_text(json.dumps(record, indent=1))
    TRAINED_STAGES.add(folder)
    return record


def eval_row(result: EvalResult, preset: str) -> dict[str, Any]:
    row = result.preset_metrics(preset)
    keys = ("success", "success_ci95", "episodes", "return", "action_is_valid", "format_error",
            "response_length")
    return {key: row[key] for key in keys if key in row}


def reference_rows(configs: Configs) -> dict[str, dict[str, Any]]:
    """Random legal play and the oracle on the held-out seeds (no model)."""
    config = configs.build(constrained=True)
    presets = dict(config.playing_presets(config.val.presets, config.rollout.max_new_tokens))
    return {policy: eval_row(asyncio.run(evaluate(presets, policy, groups=config.val.group_num,
                                                  progress=False)), configs.args.preset)
            for policy in ("random", "oracle")}


def untrained_stage(configs: Configs, constrained: bool) -> dict[str, Any]:
    """The model as it is, on the held-out seeds, under the given decoding."""
    args = configs.args
    folder = args.run_dir / "untrained" / ("constrained" if constrained else "free")
    settings = configs.settings(constrained=constrained)
    if (record := cached_stage(folder, settings)) is not None:
        return record
    config = configs.build(constrained=constrained)
    start = time.perf_counter()
    after = evaluate_model(config)
    return save_stage(folder, settings, {"after": after, "train_minutes": 0.0,
                                         "wall_minutes": (time.perf_counter() - start) / 60})


def evaluate_model(config: Any) -> dict[str, Any]:
    """Greedy held-out play of ``config.model`` as PPO's validation plays it: its row."""
    return eval_row(play_held_out(config), config.val.presets[0])


@contextlib.contextmanager
def engine(config: Any) -> Iterator[tuple[BatchingLLM, Any]]:
    """``(llm, tokenizer)``: ``config.model`` as PPO's validation plays it (float32 weights on
    ``config.device``, ``model.dtype`` as the compute dtype), closed and freed afterwards."""
    import torch

    if config.threads > 0:
        torch.set_num_threads(config.threads)
    device = resolve_device(config.device)
    model, tokenizer = load_model(config.model.name, dtype="float32", device=device,
                                  chat_template=config.model.chat_template)
    r = config.rollout
    llm = BatchingLLM(model, tokenizer, max_batch=r.max_batch, seed=config.seed, device=device,
                      prefix_cache_tokens=r.prefix_cache_tokens,
                      compute_dtype=None if config.model.dtype == "float32" else config.model.dtype)
    try:
        yield llm, tokenizer
    finally:
        llm.close()
        del model
        gc.collect()


def play_held_out(config: Any, label: str = "model", split: str = "val") -> EvalResult:
    """Greedy held-out play of ``config.model`` as PPO's validation plays it (on ``split``'s
    games), every episode in the result."""
    r = config.rollout
    tokens = config.val.max_new_tokens or r.max_new_tokens
    with engine(config) as (llm, tokenizer):
        return asyncio.run(evaluate(
            dict(config.playing_presets(config.val.presets, tokens)), llm,
            groups=config.val.group_num, split=split, tokenizer=tokenizer,
            sampling=SamplingParams(greedy=True, max_new_tokens=tokens,
                                    constrained_actions=config.constrained_actions),
            max_context_tokens=r.max_context_tokens, label=label))


def held_out_wins(config: Any, split: str = "val") -> list[bool]:
    """Each held-out game's win (in the split's seed order) of ``config.model``, greedy and
    constrained as PPO's validation plays."""
    result = play_held_out(config, label="paired", split=split)
    won = {t.seed: bool(t.success) for t in result.trajectories}
    return [won[seed] for seed in result.seeds]


def paired_stage(configs: Configs, folder: Path, name: str, seed: int, checkpoint: str,
                 owner: argparse.Namespace, split: str = "val") -> dict[str, Any]:
    """The held-out wins, game by game, of a stage's ``checkpoint`` (as its record stores it,
    ``owner`` the arguments of the benchmark that trained it) on ``split``'s first games: what
    paired comparisons of models on the same games (McNemar) read. Playing is cheap and depends
    on nothing else, so a record of another checkpoint (a PPO run resumed to more steps) is
    played again, not refused."""
    # a record names its split unless it is "val" (the records made before there was a choice)
    settings = configs.settings(model=name, checkpoint=checkpoint,
                                **({} if split == "val" else {"split": split}))
    with contextlib.suppress(ValueError):  # ValueError: made with other settings
        if (record := cached_stage(folder, settings)) is not None:
            return record
    config = configs.build(constrained=True, seed=seed, model=str(located(owner, checkpoint)))
    wins = held_out_wins(config, split)
    return save_stage(folder, settings, {"wins": wins, "success": sum(wins) / len(wins),
                                         "games": len(wins)})


def sft_stage(configs: Configs, seed: int, *, need_checkpoint: bool) -> dict[str, Any]:
    """Oracle demonstrations, SFT to the budget, evaluation, checkpoint (shared by sft_ppo)."""
    args = configs.args
    folder = stage_folder(args.run_dir, "sft", seed)
    config = configs.build(constrained=configs.decoding("sft"), seed=seed, run_dir=folder,
                           extra=(f"sft.episodes={args.sft_episodes}",
                                  f"sft.epochs={args.sft_epochs}", "sft.evaluate=false",
                                  f"sft.output_dir={folder}"))
    if not config.lora.rank:  # its moments, for a lever with actor.warm_optimizer=true
        config = dataclasses.replace(config, sft=dataclasses.replace(config.sft,
                                                                    save_optimizer=True))
    settings = configs.settings(episodes=args.sft_episodes, epochs=args.sft_epochs,
                                minutes=args.minutes,
                                config=configs.resolved(config, SFT_SECTIONS))
    record = cached_stage(folder, settings)
    if record is not None and (not need_checkpoint
                               or located(args, record["checkpoint"]).is_dir()):
        return record
    start = time.perf_counter()
    trainer = SFTTrainer(config)
    try:
        result = trainer.fit(deadline=deadline(args.minutes))
        after = eval_row(trainer.evaluate("after SFT"), args.preset)
    finally:
        trainer.close()
        gc.collect()  # a trainer's model, optimizer and caches: free before the next stage
    train_s = result.seconds["demonstrations"] + result.seconds["train"]
    return save_stage(folder, settings, {
        "after": after, "checkpoint": portable(args, result.checkpoint),
        "updates": result.updates,
        "demonstrations": result.demonstrations, "first_loss": result.losses[0],
        "last_loss": result.losses[-1], "train_minutes": train_s / 60,
        "wall_minutes": (time.perf_counter() - start) / 60})


def ppo_stage(configs: Configs, recipe: str, seed: int, start_from: dict[str, Any] | None,
              lever: tuple[str, list[str]] | None = None) -> dict[str, Any]:
    """PPO for ``--steps`` steps (or to the budget), validated at its last step; ``lever``
    (name, overrides) changes this stage's config alone."""
    args = configs.args
    name, lever_overrides = lever or ("", [])
    folder = stage_folder(args.run_dir, recipe, seed, name)
    minutes = args.minutes
    if minutes is not None and start_from is not None:
        minutes = max(minutes - start_from["train_minutes"], 1e-9)  # at least one step
    config = configs.build(
        constrained=configs.decoding(recipe), seed=seed, run_dir=folder,
        model=start_from and str(located(args, start_from["checkpoint"])),
        extra=(f"train.total_steps={args.steps}", f"val.test_freq={args.val_every}",
               "val.before_train=false", "trainer.keep_last=1", *lever_overrides))
    settings = configs.settings(steps=args.steps, minutes=args.minutes,
                                start_from=start_from and portable(
                                    args, located(args, start_from["checkpoint"])),
                                **({"lever": lever_overrides} if lever_overrides else {}),
                                **({"val_every": args.val_every}
                                   if args.val_every != args.steps else {}),
                                config=configs.resolved(config, PPO_SECTIONS,
                                                        from_checkpoint=start_from is not None))
    if (record := cached_stage(folder, settings, extends=True)) is not None:
        return record
    start = time.perf_counter()
    trainer = LocalTrainer(config)
    try:
        run = trainer.fit(deadline=deadline(minutes))
    finally:
        trainer.close()
        gc.collect()  # a trainer's model, optimizer and caches: free before the next stage
    records = read_metrics(run.metrics)
    key = f"val/{args.preset}/"
    last = next(r for r in reversed(records) if r.get(key + "success") is not None)
    after = {name: last[key + name] for name in ("success", "return", "action_is_valid",
                                                 "format_error", "response_length")
             if key + name in last}
    games = args.val_groups
    after["episodes"] = games
    after["success_ci95"] = list(wilson_interval(after["success"] * games, games))
    train_s = sum(r.get("timing/step_s", 0.0) for r in records if r["step"] > 0)
    curve = [(r["step"], r.get(f"train/{args.preset}/success")) for r in records if r["step"] > 0]
    origin = (start_from or {}).get("after") or configs.before.get(configs.decoding(recipe))
    val_curve = ([(0, origin["success"])] if origin else []) + [
        (r["step"], r[key + "success"]) for r in records
        if r["step"] > 0 and r.get(key + "success") is not None]
    return save_stage(folder, settings, {
        "after": after, "steps": run.step, "train_curve": curve, "val_curve": val_curve,
        "checkpoint": portable(args, run.checkpoint),
        "plot": str(run.plot) if run.plot else None, "train_minutes": train_s / 60,
        "wall_minutes": (time.perf_counter() - start) / 60})


def full_history_configs(args: argparse.Namespace) -> Configs:
    """The verl recipe's configs: the preset's history_window 0 (verl's SFT trains whole episodes),
    its folders under ``<run-dir>/verl`` (its untrained "before" in ``untrained/``)."""
    return Configs(argparse.Namespace(**{
        **vars(args), "overrides": [*args.overrides, *VERL.full_history(args.preset)],
        "run_dir": args.run_dir / "verl"}))


def verl_plan(configs: Configs, seed: int) -> Any:
    args = configs.args
    return VERL.Plan(preset=args.preset, seed=seed, steps=args.steps,
                     sft_episodes=args.sft_episodes, sft_epochs=args.sft_epochs,
                     val_groups=args.val_groups, overrides=tuple(args.overrides))


def check_verl_recipe(configs: Configs) -> dict[str, int]:
    """verl's config of the recipe composed (the verl rules checked) and a whole episode
    checked against its token budget, before any run starts; the measured bounds."""
    from agentrl.rollout.demonstrations import demonstration_seeds

    plan = verl_plan(configs, 0)
    config = compose_config(VERL.shared_keys(plan))
    return VERL.check_lengths(config, plan.preset, demonstration_seeds(VERL.LENGTH_SAMPLE, 0))


def verl_stage(configs: Configs, seed: int) -> dict[str, Any]:
    """verl's SFT, then its PPO from that checkpoint, each a child process (Ray never in this
    one), then the local evaluator from the final actor's model folder; verl's step timings."""
    from agentrl.verl.child_run import console_steps, verl_cpu_python

    args = configs.args
    folder = args.run_dir / f"seed_{seed}"
    settings = configs.settings(engine="verl", steps=args.steps, episodes=args.sft_episodes,
                                epochs=args.sft_epochs)
    if (record := cached_stage(folder, settings)) is not None:
        return record
    python = verl_cpu_python()
    if python is None:
        raise RuntimeError("the verl recipe needs vLLM's CPU build: bash env_setup.sh --verl-cpu")
    plan = verl_plan(configs, seed)
    start = time.perf_counter()
    sft_s = verl_sft(python, folder, plan)
    output, ppo_s = verl_ppo(python, folder, plan)
    after = evaluate_model(configs.build(constrained=True, seed=seed,
                                         model=str(VERL.actor_model(folder, args.steps))))
    records = read_metrics(folder / "ppo" / "metrics.jsonl")
    timings = VERL.step_timings(console_steps(output))
    if not args.keep_checkpoints:
        for checkpoints in (folder / "sft" / "verl", folder / "ppo" / "checkpoints"):
            shutil.rmtree(checkpoints, ignore_errors=True)
    return save_stage(folder, settings, {
        "after": after, "steps": len(timings["per_step"]), "val_curve": [],
        "train_curve": [(r["step"], r.get(f"train/{args.preset}/success")) for r in records
                        if r["step"] > 0 and f"train/{args.preset}/success" in r],
        "timings": timings, "sft_minutes": sft_s / 60, "ppo_minutes": ppo_s / 60,
        "ppo_step_minutes": sum(t.get("timing_s/step", 0.0)
                                for t in timings["per_step"].values()) / 60,
        "train_minutes": (sft_s + ppo_s) / 60,
        "wall_minutes": (time.perf_counter() - start) / 60})


def verl_sft(python: str, folder: Path, plan: Any) -> float:
    """verl's SFT run of the stage, or the one a stopped stage finished with the same plan but
    ``--steps`` (:func:`finished_run`, ``sft/finished.json``); its seconds."""
    same = {k: v for k, v in plan._asdict().items() if k != "steps"}
    kept = any((folder / "sft" / "verl").glob("global_step_*/huggingface"))
    return finished_run(VERL.sft_command(python, folder, plan), folder / "sft.log",
                        folder / "sft" / "finished.json", same, kept)[1]


def verl_ppo(python: str, folder: Path, plan: Any) -> tuple[str, float]:
    """verl's PPO run of the stage from its SFT model, or the one a stopped stage finished with
    the same plan while the actor's last folder is kept (:func:`finished_run`,
    ``ppo/finished.json``: a failed evaluation then does not train again); its console and
    seconds."""
    try:
        kept = VERL.actor_model(folder, plan.steps).is_dir()
    except FileNotFoundError:
        kept = False
    return finished_run(VERL.ppo_command(python, folder, plan, VERL.sft_model(folder)),
                        folder / "ppo.log", folder / "ppo" / "finished.json", plan._asdict(),
                        kept)


def finished_run(command: list[str], log: Path, record: Path, plan: dict[str, Any],
                 kept: bool) -> tuple[str, float]:
    """A child run's console and seconds: read back when ``record`` (written after the run
    exits cleanly) holds the same ``plan`` and its output is ``kept``, else run now."""
    same = json.loads(json.dumps(plan))
    if kept and record.is_file() and json.loads(record.read_text())["plan"] == same:
        return log.read_text(), json.loads(record.read_text())["seconds"]
    output, seconds = run_child(command, log)
    record.write_text(json.dumps({"plan": same, "seconds": seconds}))
    return output, seconds


def run_child(command: list[str], log: Path) -> tuple[str, float]:
    """A verl run in a session of its own, ended with everything it started; its output and
    seconds (start-up included). A failure raises with the output's tail."""
    from agentrl.verl.child_run import finish, start

    began = time.perf_counter()
    print(f"verl recipe: {' '.join(command[1:4])} ... (log: {log})", flush=True)
    output = finish(start(command, log), log, VERL.TIMEOUT_S)
    return output, time.perf_counter() - began


def deadline(minutes: float | None) -> float | None:
    """The trainers' deadline (``time.monotonic()`` clock) ``minutes`` from now."""
    return None if minutes is None else time.monotonic() + minutes * 60


# -- runs and summary ----------------------------------------------------------------------------
HEALTH = ("critic/vf_explained_var", "actor/pg_clipfrac", "actor/ppo_kl", "actor/entropy")
"""The RL health numbers a PPO run reports beside its result: the critic's explained variance,
the clip fraction, the KL of the update, the entropy per real choice."""


EV_FROM = 5
"""The critic's explained variance is averaged from this PPO step on (its first steps fit)."""


def critic_marks(records: list[dict[str, Any]]) -> dict[str, float | None]:
    """The critic's marks (the issue's) from a PPO run's metrics: the values GAE read, scored
    against GAE's returns and (below lambda 1 those returns hold the values themselves) against
    Monte-Carlo returns-to-go, averaged from step :data:`EV_FROM` on; and the first pooled over
    all steps."""
    later = (EV_FROM, None)
    return {"explained_variance_from_step_5": health_of(records, later)[HEALTH[0]],
            "explained_variance_pooled": pooled_explained_variance(records),
            "mc_explained_variance_from_step_5": health_of(
                records, later, ("critic/mc_explained_var",))["critic/mc_explained_var"]}


def health_of(records: list[dict[str, Any]], steps: tuple[int, int | None] = (1, None),
              keys: tuple[str, ...] = HEALTH) -> dict[str, float | None]:
    """A PPO run's mean :data:`HEALTH` numbers (or other metrics: ``keys``) over its steps
    ``steps[0]..steps[1]`` (inclusive; None: to its last) from its ``metrics.jsonl`` records;
    None where never logged."""
    first, last = steps
    chosen = [r for r in records
              if r.get("step", 0) >= max(first, 1) and (last is None or r["step"] <= last)]
    return {key: (statistics.fmean(values) if (values := [r[key] for r in chosen
                                                            if r.get(key) is not None]) else None)
            for key in keys}


def run_recipe(configs: Configs, name: str, seed: int, before: dict[str, Any],
               lever: tuple[str, list[str]] | None = None) -> dict[str, Any]:
    """One run of a recipe (with a ``--lever`` on its PPO stage): its stages, then
    before/after and its minutes."""
    recipe = RECIPES[name]
    ppo_folder = stage_folder(configs.args.run_dir, name, seed, lever and lever[0])
    if not recipe.sft and not recipe.ppo:
        stage = untrained_stage(configs, configs.decoding(name))
        return {"recipe": name, "seed": None, "before": before, **stage}
    stages = []
    if recipe.sft:  # its checkpoint is needed by a PPO stage that has not finished
        ppo_done = (ppo_folder / STAGE_FILE).is_file()
        stages.append(sft_stage(configs, seed, need_checkpoint=recipe.ppo and not ppo_done))
    if recipe.ppo:
        stages.append(ppo_stage(configs, name, seed, stages[-1] if stages else None, lever))
    run = {"recipe": name, "seed": seed, "before": before, "after": stages[-1]["after"],
           "train_minutes": sum(s["train_minutes"] for s in stages),
           "wall_minutes": sum(s["wall_minutes"] for s in stages),
           "steps": stages[-1].get("steps"), "stages": stages}
    if recipe.sft and recipe.ppo:
        run["after_sft"] = stages[0]["after"]
    if recipe.ppo:  # the window for the critic: its explained variance on steps 5-20
        records = read_metrics(ppo_folder / "metrics.jsonl")
        run["health"] = health_of(records)
        run["explained_variance_steps_5_20"] = health_of(records, (5, 20))[HEALTH[0]]
        run["explained_variance_pooled_steps_5_20"] = pooled_explained_variance(
            [r for r in records if 5 <= r.get("step", 0) <= 20])
    return run


def verl_run(configs: Configs, seed: int) -> dict[str, Any]:
    """One run of the verl recipe; "before" is the untrained model with every turn in the
    context too (``configs``: :func:`full_history_configs`)."""
    stage = verl_stage(configs, seed)
    return {"recipe": "verl", "seed": seed, "before": untrained_stage(configs, True)["after"],
            "after": stage["after"], "train_minutes": stage["train_minutes"],
            "wall_minutes": stage["wall_minutes"], "steps": stage["steps"], "stages": [stage]}


def summarize(name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and spread over a recipe's runs."""
    after = [r["after"]["success"] for r in runs]
    before = runs[0]["before"]["success"]
    steps = [r["steps"] for r in runs if r.get("steps") is not None]
    return {
        "recipe": name, "runs": len(runs), "before": before, "after_mean": statistics.fmean(after),
        "after_min": min(after), "after_max": max(after),
        "after_std": statistics.stdev(after) if len(after) > 1 else 0.0,
        "gain": statistics.fmean(after) - before,
        "format_error_after": statistics.fmean(r["after"].get("format_error", 0.0) for r in runs),
        "train_minutes": statistics.fmean(r["train_minutes"] for r in runs),
        "wall_minutes": statistics.fmean(r["wall_minutes"] for r in runs),
        "steps": statistics.fmean(steps) if steps else None,
        **({"health": {key: mean_of(r["health"][key] for r in runs) for key in HEALTH},
            **{key: mean_of(r.get(key) for r in runs) for key in (
                "explained_variance_steps_5_20", "explained_variance_pooled_steps_5_20")}}
           if all("health" in r for r in runs) else {}),
    }


def mean_of(values: Iterable[float | None]) -> float | None:
    """The mean of the values that are not None; None when none is."""
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def variant_overrides(preset: str, text: str) -> list[str]:
    """``enable_think=false`` -> ``agents.<preset>.enable_think=false`` (checked first)."""
    from agentrl.evaluation.compare import parse_variant

    variant = parse_variant(text)
    return [f"agents.{preset}.{key}={value}" for key, value in
            (pair.split("=", 1) for pair in text.split(",") if pair.strip())
            if key.strip() in variant.settings]


def run_variant(args: argparse.Namespace, variant: str | None) -> dict[str, Any]:
    """Every chosen recipe x seed with ``variant``'s agent settings (None: the preset's own),
    in ``<run-dir>/<variant>/`` when there is one; rows labelled ``recipe [variant]``."""
    if variant is not None:
        args = argparse.Namespace(**{
            **vars(args), "overrides": [*args.overrides, *variant_overrides(args.preset, variant)],
            "run_dir": args.run_dir / variant.replace("=", "-").replace(",", "_")})
    suffix = "" if variant is None else f" [{variant}]"
    configs = Configs(args)
    verl = full_history_configs(args) if "verl" in args.recipes else None
    if verl is not None:
        print(f"verl recipe: an episode of {args.preset} takes up to "
              f"{check_verl_recipe(verl)} tokens (prompt, response)", flush=True)
    references = reference_rows(configs) if args.preset != BANDIT else {}
    befores = {c: untrained_stage(configs, c)["after"] for c in dict.fromkeys(
        configs.decoding(name) for name in args.recipes if not RECIPES[name].verl)}
    configs.before = befores
    rows = [(name, None) for name in args.recipes
            if not (args.lever_only and RECIPES[name].ppo)] + [
        (name, lever) for lever in args.levers.items() for name in args.recipes
        if RECIPES[name].ppo and not RECIPES[name].verl]
    runs: dict[str, list[dict[str, Any]]] = {}
    for name, lever in rows:
        recipe = RECIPES[name]
        seeds = (args.only_seed or range(args.seeds)) if recipe.sft or recipe.ppo else range(1)
        label = name + (f" @{lever[0]}" if lever else "") + suffix
        if verl is not None and recipe.verl:
            label = f"{name} (history_window=0){suffix}"
            runs[label] = [verl_run(verl, seed) for seed in seeds]
            continue
        runs[label] = [run_recipe(configs, name, seed, befores[configs.decoding(name)], lever)
                       for seed in seeds]
    return {"references": {policy + suffix: row for policy, row in references.items()},
            "summary": [{"label": label, "variant": variant, "lever": lever and lever[0],
                         **summarize(name, recipe_runs)}
                        for (name, lever), (label, recipe_runs) in zip(rows, runs.items())],
            "runs": runs}


def prune_checkpoints(stages: Iterable[Path]) -> None:
    """Delete the checkpoints of these stage folders alone (:data:`TRAINED_STAGES`): a warm start
    this process read back may start another lever's PPO later, a run kept with
    ``--keep-checkpoints`` may go on to more steps, and another process sharing the run folder
    (``--only-seed``) may still be training (and resuming from) its own."""
    for folder in stages:
        shutil.rmtree(folder / CHECKPOINTS_DIR, ignore_errors=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    TRAINED_STAGES.clear()  # this call's stages only (tests call main more than once)
    base = Configs(args).build(constrained=True)
    parts = [run_variant(args, variant) for variant in args.compare or [None]]
    if not args.keep_checkpoints:
        prune_checkpoints(TRAINED_STAGES)
    result = {
        "model": base.model.name, "preset": args.preset, "recipes": args.recipes,
        "variants": args.compare, "levers": args.levers, "seeds": args.seeds,
        "steps": args.steps,
        "episodes_per_step": base.train.group_num * base.train.group_size,
        "sft_episodes": args.sft_episodes, "sft_epochs": args.sft_epochs,
        "minutes": args.minutes, "val_games": args.val_groups, "overrides": args.overrides,
        "references": {k: v for part in parts for k, v in part["references"].items()},
        "summary": [row for part in parts for row in part["summary"]],
        "runs": {k: v for part in parts for k, v in part["runs"].items()},
        "run_dir": str(args.run_dir),
    }
    result["plot"] = str(OUTPUT.plot(result, Path(args.out).with_suffix(".png")))
    OUTPUT.show(result, with_sft=any(RECIPES[name].sft for name in args.recipes))
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
