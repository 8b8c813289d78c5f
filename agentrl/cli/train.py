"""`agentrl train [key=value ...]`: PPO on the games, configured by hydra overrides.

    agentrl train                                          # CPU preset, embedded model
    agentrl train model=tiny train.total_steps=2 experiment=smoke
    agentrl train 'train.presets=[tetrisType1Agent]' actor.lr=2e-5 resume=never
    agentrl train --print-config hardware=cpu              # the resolved config, nothing runs
    agentrl train hardware=a100 model=qwen_3b              # the verl backend (multi-GPU, vLLM)
    agentrl train --dry-run hardware=a100 model=qwen_7b    # verl's config and command, validated

Keys and defaults: configs/base.yaml (every key documented there). The run writes its
checkpoints, metrics.jsonl, WandB files and learning_curves.png under `run_dir`
(default runs/<project>/<experiment>); running the same command again resumes it.
`backend=verl` (the GPU hardware presets set it) hands the run to verl's own trainer:
see agentrl/verl/launch.py and docs/HARDWARE.md. It needs vLLM: `hardware=cpu-verl` finds vLLM's
CPU build in the venv `bash env_setup.sh --verl-cpu` made ($AGENTRL_VERL_CPU_PYTHON, else
$AGENTRL_VERL_CPU_VENV/bin/python, else <checkout>/.venv-verl-cpu/bin/python) and re-runs the
command with that Python; without one it stops before anything starts and says what to run.

Before the model loads, a resume is checked (agentrl/trainers/checkpoint.py): a damaged newest
checkpoint is skipped with a warning, a run whose checkpoints are all damaged is not started
over, and a changed training config or a `train.total_steps` below the checkpoint's step is
refused (`resume_config_changes=allow` goes on with a changed config).

Ctrl-C stops the run wherever it is (rollout, update, validation, saving) with one line naming
the stage and step, the newest intact checkpoint and the command that resumes, and exit status
130 (agentrl/cli/interrupt.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from agentrl.cli.first_prompts import check_first_prompts
from agentrl.cli.interrupt import (
    AFTER_STEP, EXIT_INTERRUPTED, fit_or_stop, resume_command, say, stage_of, stopped_line,
)
from agentrl.config import compose_config
from agentrl.evaluation.decoding import run_decoding

REEXEC_ENV = "AGENTRL_REEXECUTED"


def add_config_arguments(parser: argparse.ArgumentParser, example: str, dry_run_help: str
                         ) -> None:
    """The arguments every config-driven command takes (``train``, ``sft``)."""
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help=f"hydra overrides of configs/base.yaml (e.g. {example})")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved, validated config and exit")
    parser.add_argument("--dry-run", action="store_true", help=dry_run_help)


def config_to_run(args: argparse.Namespace, check: Callable[[Any], None] | None = None
                  ) -> Any | None:
    """The composed, validated config (``check`` raises on what the command cannot use); None
    once printed (``--print-config``, or ``--dry-run`` with the local backend, which has
    nothing else to show)."""
    config = compose_config(args.overrides)
    if check is not None:
        check(config)
    if args.print_config or (args.dry_run and config.backend == "local"):
        print(yaml.safe_dump(config.to_dict(), sort_keys=False), end="")
        return None
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, "train.total_steps=4",
                         "backend=verl: print verl's config and the command, validated by verl, "
                         "and exit (no Ray, no GPU); local: as --print-config")


def run(args: argparse.Namespace) -> int:
    config = config_to_run(args, check_verl_lengths)
    if config is None:
        return 0
    if config.backend == "verl":
        from agentrl.verl.launch import launch

        check_override_types(config.verl.overrides)
        if not args.dry_run or config.device == "cpu":  # a GPU preset's dry run needs no vLLM
            _find_vllm(config, args, rerun=not args.dry_run)
        status = launch(config, dry_run=args.dry_run)
        if status == EXIT_INTERRUPTED:  # verl was stopped and its last records taken in
            from agentrl.trainers.verl_checkpoints import newest_intact

            say(stopped_line("verl's run", newest_intact(config.run_dir / "checkpoints"),
                             resume_command("train", args.overrides)))
        return status
    from agentrl.trainers.resume import resume_checkpoint
    from agentrl.trainers.local import LocalTrainer

    # before the model loads
    checkpoint = resume_checkpoint(config.run_dir, config.resume, config.to_dict())
    if checkpoint is not None and _finished(config, checkpoint, args.overrides):
        return 0
    check_first_prompts(config)
    print(f"validation decoding: {run_decoding(config.to_dict()).describe()}", flush=True)
    fitted = fit_or_stop(lambda: LocalTrainer(config), lambda error, trainer: stopped_line(
        _where(stage_of(error.__traceback__), trainer), newest_checkpoint(config.run_dir),
        resume_command("train", args.overrides)))
    if fitted is None:
        return EXIT_INTERRUPTED
    trainer, result = fitted
    trainer.close()
    print(f"\nrun {result.run_id}: {result.step} steps in {result.run_dir}")
    last = _held_out(result.step, result.last_val_success)
    print(f"  checkpoint: {result.checkpoint} (the last{last})")
    if result.best is not None:  # what the run folder stands for (agentrl eval/play --model)
        best = result.best
        print(f"  best:       {result.best_checkpoint} "
              f"(the best{_held_out(best.step, best.val_success)}; eval and play take it)")
    if result.stopped:
        print(f"  stopped early: {result.stopped}")
    print(f"  metrics:    {result.metrics}")
    if result.plot is not None:
        print(f"  plot:       {result.plot}")
    return 0


def _finished(config: Any, checkpoint: Path, overrides: Sequence[str]) -> bool:
    """A run whose checkpoint reached ``train.total_steps`` has nothing to train: say so, and
    how to train it further (True), instead of loading the model to do nothing."""
    from agentrl.trainers.checkpoint import checkpoint_step

    step, total = checkpoint_step(checkpoint), config.train.total_steps
    if step is None or step < total:
        return False
    more = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") != "train.total_steps"]
    print(f"the run in {config.run_dir} is finished: its checkpoint {checkpoint} is step {step} "
          f"of train.total_steps={total}; nothing to train.\n"
          f"  to train it further: {shlex.join(['agentrl', 'train', *more])} "
          f"train.total_steps=<more than {step}>\n"
          f"  to start over: another run_dir, or resume=never (its history is overwritten)\n"
          f"  to evaluate it: agentrl eval --model {shlex.quote(str(config.run_dir))}")
    return True


def check_verl_lengths(config: Any) -> None:
    """backend=verl: ``verl.max_response_length`` (every reply and observation after the first
    prompt) holds at least one reply at its token limit."""
    if config.backend != "verl":
        return
    reply = max(config.rollout.max_new_tokens, config.val.max_new_tokens or 0)
    if config.verl.max_response_length < reply:
        raise ValueError(f"verl.max_response_length={config.verl.max_response_length} cannot "
                         f"hold one reply of up to {reply} tokens (rollout.max_new_tokens, "
                         f"val.max_new_tokens); allowed: an integer >= {reply} (it holds every "
                         "reply and observation of an episode after its first prompt)")


def _where(stage: str | None, trainer: Any) -> str:
    """Ctrl-C's stage with the step it belongs to."""
    if trainer is None or stage is None or stage == "loading the model":
        return stage or "start-up"
    step = trainer.step if stage in AFTER_STEP else trainer.step + 1
    return f"{stage} (step {step})"


def newest_checkpoint(run_dir: str | Path, folder: str = "checkpoints") -> Path | None:
    """The newest intact checkpoint under ``run_dir/folder``, or None."""
    from agentrl.trainers.checkpoint import newest_intact_checkpoint

    root = Path(run_dir) / folder
    try:
        return newest_intact_checkpoint(root) if root.is_dir() else None
    except ValueError:  # every checkpoint damaged
        return None


def _held_out(step: int, success: float | None) -> str:
    """``: step 12, held-out success 34.4%`` (the success left out when not validated)."""
    return f": step {step}" + ("" if success is None else f", held-out success {100 * success:.1f}%")


def _find_vllm(config: Any, args: argparse.Namespace, rerun: bool = True) -> None:
    """verl's rollout needs vLLM. On a CPU (``hardware=cpu-verl``) it lives in the venv of
    ``env_setup.sh --verl-cpu``: re-run this command there (a dry run says where it is and
    goes on here, where verl's config is checked); else say what to run."""
    if importlib.util.find_spec("vllm") is not None:
        return
    command = ["-m", "agentrl.cli", "train", *args.overrides]
    if config.device != "cpu":
        raise ValueError(f"backend=verl needs vLLM, which {sys.executable} lacks; allowed: "
                         "install the GPU stack (bash env_setup.sh --gpu), or hardware=cpu "
                         "(the local engine)")
    from agentrl.verl.child_run import VERL_CPU_VENV, verl_cpu_venv_python

    python = verl_cpu_venv_python()
    if python is not None and not rerun:
        print(f"vLLM's CPU build is in {python.parent.parent}: the run re-runs itself with "
              f"{python}", file=sys.stderr, flush=True)
        return
    if python is not None and os.environ.get(REEXEC_ENV) is None:
        print(f"vLLM's CPU build is in {python.parent.parent}: running "
              f"{python} {' '.join(command)}", file=sys.stderr, flush=True)
        os.environ[REEXEC_ENV] = "1"
        os.execv(python, [str(python), *command])
    raise ValueError(f"hardware=cpu-verl needs vLLM's CPU build, which {sys.executable} lacks; "
                     "allowed: bash env_setup.sh --verl-cpu (then this command re-runs itself "
                     f"with {VERL_CPU_VENV}/bin/python), or hardware=cpu (the local engine)")


def check_override_types(overrides: Sequence[str]) -> None:
    """Each raw ``verl.overrides`` value has the type of the verl default it replaces (verl's
    own checks let ``ppo_epochs=abc`` through to the run)."""
    if not overrides:
        return
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from agentrl.verl.launch import compose_verl_config

    defaults = compose_verl_config([], validate=False)
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        default = OmegaConf.select(defaults, override.key_or_group, default=None)
        value = override.value()
        if not _fits(default, value):
            kind = {bool: "true or false", int: "an integer"}.get(type(default), "a number")
            raise ValueError(f"verl.overrides: {override.input_line!r} gives "
                             f"{override.key_or_group} (default {default!r}) the value "
                             f"{value!r}; allowed: {kind}")


def _fits(default: Any, value: Any) -> bool:
    """A number or a flag of verl's config stays one (null and interpolations pass)."""
    if value is None or (isinstance(value, str) and value.startswith("${")):
        return True
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, (int, float)):
        return (isinstance(value, (int, float)) and not isinstance(value, bool)
                and (isinstance(default, float) or isinstance(value, int)))
    return True
