"""`agentrl make-data [key=value ...]`: the verl backend's task files, without training.

    agentrl make-data hardware=a100 model=qwen_3b 'train.presets=[simpleSokobanAgent]'
    agentrl make-data --out data/sokoban train.total_steps=50 train.group_num=8

Writes `train.parquet` (train.total_steps x train.group_num rows: one game per group, seeds from
the training split) and `val.parquet` (val.group_num held-out games per validation preset) into
`--out`, by default `<run_dir>/data`, where `agentrl train backend=verl` reads them. The train
command writes them itself before every run (the same rows: they depend on the config only), so
this is for looking at them, or for making TextWorld's games ahead of time. Row layout:
agentrl/verl/data.py.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from agentrl.config import compose_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="hydra overrides of configs/base.yaml (e.g. train.group_num=8)")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for train.parquet and val.parquet (default <run_dir>/data)")


def run(args: argparse.Namespace) -> int:
    import pyarrow.parquet as pq

    from agentrl.verl.data import write_tasks

    config = compose_config(args.overrides)
    out = args.out if args.out is not None else config.run_dir / "data"
    for path in write_tasks(config, out):
        print(f"{path}: {pq.read_metadata(path).num_rows} rows")
    return 0
