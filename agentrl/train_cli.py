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
see agentrl/verl/launch.py and docs/HARDWARE.md.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

import yaml

from agentrl.config import compose_config


def add_config_arguments(parser: argparse.ArgumentParser, example: str, dry_run_help: str
                         ) -> None:
    """The arguments every config-driven command takes (``train``, ``sft``)."""
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help=f"hydra overrides of configs/base.yaml (e.g. {example})")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved, validated config and exit")
    parser.add_argument("--dry-run", action="store_true", help=dry_run_help)


def config_to_run(args: argparse.Namespace) -> Any | None:
    """The composed, validated config; None once printed (``--print-config``, or ``--dry-run``
    with the local backend, which has nothing else to show)."""
    config = compose_config(args.overrides)
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
    config = config_to_run(args)
    if config is None:
        return 0
    if config.backend == "verl":
        from agentrl.verl.launch import launch

        return launch(config, dry_run=args.dry_run)
    from agentrl.trainers.local import LocalTrainer

    trainer = LocalTrainer(config)
    try:
        result = trainer.fit()
    finally:
        trainer.close()
    print(f"\nrun {result.run_id}: {result.step} steps in {result.run_dir}")
    print(f"  checkpoint: {result.checkpoint}")
    print(f"  metrics:    {result.metrics}")
    if result.plot is not None:
        print(f"  plot:       {result.plot}")
    return 0
