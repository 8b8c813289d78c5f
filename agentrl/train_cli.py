"""`agentrl train [key=value ...]`: PPO on the games, configured by hydra overrides.

    agentrl train                                          # CPU preset, embedded model
    agentrl train model=tiny train.total_steps=2 experiment=smoke
    agentrl train 'train.presets=[tetrisType1Agent]' actor.lr=2e-5 resume=never
    agentrl train --print-config hardware=cpu              # the resolved config, nothing runs

Keys and defaults: configs/base.yaml (every key documented there). The run writes its
checkpoints, metrics.jsonl, WandB files and learning_curves.png under `run_dir`
(default runs/<project>/<experiment>); running the same command again resumes it.
"""

from __future__ import annotations

import argparse
import logging

import yaml

from agentrl.config import compose_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="hydra overrides of configs/base.yaml (e.g. train.total_steps=4)")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved, validated config and exit")


def run(args: argparse.Namespace) -> int:
    config = compose_config(args.overrides)
    if args.print_config:
        print(yaml.safe_dump(config.to_dict(), sort_keys=False), end="")
        return 0
    if config.backend != "local":
        raise ValueError(f"backend={config.backend!r} is not available in this version; "
                         "allowed: local")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
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
