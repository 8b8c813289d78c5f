"""`agentrl sft [key=value ...]`: supervised warm start on the oracle's play, before PPO.

    agentrl sft model=embedded 'sft.presets=[quickSokobanAgent]' 'val.presets=[quickSokobanAgent]'
    agentrl sft model=tiny sft.episodes=8 sft.epochs=2 lora.rank=8 sft.lr=1e-3
    agentrl sft sft.random_action_share=0.2         # also show recoveries from random moves
    agentrl train model=<the checkpoint it prints> ...  # the `next:` line it prints
    agentrl sft --dry-run backend=verl hardware=a100 model=qwen_halfb   # verl's SFT, validated

The oracle plays `sft.episodes` games of `sft.presets` (default train.presets) through the same
agent and rollout code as PPO's episodes; the model learns its replies (cross-entropy on the
reply tokens only), held-out greedy success is measured before and after (val.presets,
val.group_num games), and a checkpoint is written under `sft.output_dir` (default
<run_dir>/sft) that `agentrl train model=...` and `agentrl eval --model ...` load. Keys and
defaults: the `sft` section of configs/base.yaml (LoRA: the `lora` section); algorithm and
layout: agentrl/trainers/sft.py. Its last line, `next: agentrl train model=<checkpoint> ...`,
trains and validates the presets it warmed up, with this command's other overrides.
Ctrl-C stops it with one line saying where, and exit status 130 (agentrl/cli/interrupt.py).

`backend=verl` runs verl's own SFT trainer (`torchrun -m verl.trainer.sft_trainer`) on the
multi-turn parquet that `agentrl make-data --sft` writes; `--dry-run` prints that command and
verl's composed SFT config, checked by verl's config classes, without a GPU.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from agentrl.cli.first_prompts import check_first_prompts
from agentrl.cli.interrupt import (
    EXIT_INTERRUPTED, fit_or_stop, resume_command, stage_of, stopped_line,
)
from agentrl.cli.train import add_config_arguments, config_to_run, newest_checkpoint


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, "sft.episodes=32",
                         "backend=verl: print verl's SFT config and command, validated by verl, "
                         "and exit (no GPU); local: as --print-config")


def run(args: argparse.Namespace) -> int:
    config = config_to_run(args, _no_ppo_overrides)
    if config is None:
        return 0
    if config.backend == "verl":
        from agentrl.verl.sft import launch_sft

        return launch_sft(config, dry_run=args.dry_run)
    from agentrl.trainers.sft import SFTTrainer

    check_first_prompts(config, sft=True)  # before the model loads

    def stopped(error: BaseException, trainer) -> str:
        stage = stage_of(error.__traceback__)
        return stopped_line(f"SFT's {stage}" if stage else "start-up",
                            newest_checkpoint(_output_dir(config)),
                            resume_command("sft", args.overrides), resumes=False)

    fitted = fit_or_stop(lambda: SFTTrainer(config), stopped)
    if fitted is None:
        return EXIT_INTERRUPTED
    trainer, result = fitted
    trainer.close()
    print(f"\nSFT: {result.demonstrations} demonstrations, {result.tokens} reply tokens, "
          f"{result.updates} updates in {result.seconds['train']:.0f} s; loss "
          f"{result.losses[0]:.3f} -> {result.losses[-1]:.3f}")
    for label, evaluation in (("before", result.before), ("after", result.after)):
        if evaluation is not None:
            rates = ", ".join(f"{preset} {100 * evaluation.preset_metrics(preset)['success']:.1f}%"
                              for preset in evaluation.presets)
            print(f"  held-out greedy success {label}: {rates}")
    print(f"  checkpoint: {result.checkpoint}")
    print(f"  next: {next_command(config, args.overrides, result.checkpoint)}")
    return 0


def next_command(config, overrides: list[str], checkpoint) -> str:
    """``agentrl train`` from ``checkpoint`` on what was warmed up: the presets the oracle
    played (``sft.presets``, else ``train.presets``) trained and validated, unless the command
    set ``train.presets`` / ``val.presets`` itself; this command's other overrides (hardware,
    reply limits, agent settings, run_dir) carried over, ``sft.*`` and the model left out."""
    warmed = list(config.sft.presets or config.train.presets)
    kept = [o for o in overrides
            if not _key(o).startswith("sft.") and _key(o) not in ("model", "model.name")]
    given = {_key(o) for o in kept}
    listed = f"[{','.join(warmed)}]"
    added = [f"{key}={listed}" for key in ("train.presets", "val.presets") if key not in given]
    return shlex.join(["agentrl", "train", f"model={checkpoint}", *kept, *added])


def _key(override: str) -> str:
    """The key of a hydra override (``+a.b=1`` -> ``a.b``)."""
    return override.split("=", 1)[0].lstrip("+~")


def _output_dir(config) -> Path:
    return Path(config.sft.output_dir or Path(config.run_dir) / "sft")


def _no_ppo_overrides(config) -> None:
    """``verl.overrides`` are keys of verl's PPO trainer: neither SFT trainer reads them. And
    the checkpoint's folder can be written, before the oracle plays and the model trains."""
    from agentrl.cli.arguments import check_folder_to_write

    check_folder_to_write(_output_dir(config), "sft.output_dir")
    if config.backend == "verl":
        check_whole_chats(config)
    if config.verl.overrides:
        raise ValueError(f"verl.overrides={list(config.verl.overrides)} are keys of verl's PPO "
                         "trainer, which agentrl sft does not run; allowed: none here (the "
                         "sft section sets the SFT trainer; verl.overrides go to agentrl train)")


def check_whole_chats(config) -> None:
    """verl's SFT data (``agentrl sft backend=verl``, ``make-data --sft``) learns every reply of
    an episode in the whole conversation before it, so a preset whose replies see less (a
    ``history_window``) would be taught in contexts it never plays in; ``agentrl train`` refuses
    such a preset on verl's one-row-per-episode trainer for the same reason. ``context: state``
    is written a row per turn, as it plays. ``ValueError`` naming the preset's key."""
    for name in dict.fromkeys([*config.sft_presets, *config.val.presets]):
        window = config.agents[name].history_window
        if window:
            raise ValueError(f"agents.{name}.history_window={window} is not allowed in verl's "
                             "SFT data (agentrl sft backend=verl, make-data --sft): each row is "
                             "a whole episode and every reply is learned in all the turns "
                             "before it, not in the window it plays with; allowed: "
                             "history_window 0 (all turns), context: state (a row per turn), "
                             "or backend=local (agentrl sft hardware=cpu plays the windows)")
