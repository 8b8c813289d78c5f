"""`agentrl make-data [key=value ...]`: the verl backend's task files, without training.

    agentrl make-data hardware=a100 model=qwen_3b 'train.presets=[simpleSokobanAgent]'
    agentrl make-data --out data/sokoban train.total_steps=50 train.group_num=8
    agentrl make-data --sft 'sft.presets=[simpleSokobanAgent]' sft.episodes=512   # verl's SFT data

Writes `train.parquet` (train.total_steps x train.group_num rows: one game per group, seeds from
the training split) and `val.parquet` (val.group_num held-out games per validation preset) into
`--out`, by default `<run_dir>/data`, where `agentrl train backend=verl` reads them. The train
command writes them itself before every run (the same rows: they depend on the config only), so
this is for looking at them, or for making TextWorld's games ahead of time. Row layout:
agentrl/verl/data.py.

`--sft` writes the supervised warm start's data instead: `sft_train.parquet` (sft.episodes oracle
episodes of sft.presets, a `messages` column as verl's multi-turn SFT dataset reads it) and
`sft_val.parquet` (oracle episodes on the held-out seeds), by default into <sft.output_dir>/data
where `agentrl sft backend=verl` reads them. Layout: agentrl/verl/sft.py.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from agentrl.cli.arguments import writable_path
from agentrl.config import compose_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="hydra overrides of configs/base.yaml (e.g. train.group_num=8)")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for train.parquet and val.parquet (default <run_dir>/data; "
                             "with --sft: sft_*.parquet, default <sft.output_dir>/data)")
    parser.add_argument("--sft", action="store_true",
                        help="write the SFT warm start's multi-turn data (verl's SFT trainer)")


def run(args: argparse.Namespace) -> int:
    import pyarrow.parquet as pq

    from agentrl.verl.data import write_tasks

    config = compose_config(args.overrides)
    if args.out is not None:
        writable_path(args.out, "--out", folder=True)
    if args.sft:
        from agentrl.cli.sft import check_whole_chats
        from agentrl.verl.sft import sft_paths, write_sft_data

        check_whole_chats(config)

        out = args.out if args.out is not None else sft_paths(config)[0].parent
        paths = write_sft_data(config, out)
    else:
        out = args.out if args.out is not None else config.run_dir / "data"
        paths = write_tasks(config, out)
    for path in paths:
        print(f"{path}: {pq.read_metadata(path).num_rows} rows")
    return 0
