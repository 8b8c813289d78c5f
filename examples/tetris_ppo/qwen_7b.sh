#!/usr/bin/env bash
# PPO with a critic on Tetris, Qwen2.5-7B-Instruct.
# Trains on 3x3 boards with one piece type; validates on held-out boards, on 4x4 boards and on
# two piece types.
#
#   bash examples/tetris_ppo/qwen_7b.sh                 # every GPU of a running Ray cluster, else of this node (verl)
#   bash examples/tetris_ppo/qwen_7b.sh --dry-run       # verl's config and command, validated
#   bash examples/tetris_ppo/qwen_7b.sh 16 "" "" "" "" "" "" 8   # two nodes of 8 GPUs
#   bash examples/tetris_ppo/qwen_7b.sh "" 16 8 "" "" "" "" "" "" "" "" 100 actor.lr=2e-6
#
# Hardware: 8 x A100 or H100 80GB, or 8 x L40 48GB (the preset follows the GPU's name; sizes and
# memory arithmetic in docs/HARDWARE.md, several nodes too). Time per step: not measured yet.
# Positional arguments and key=value overrides: as quick_train.sh (scripts/positional_args.sh);
# without GPUs this runs the local engine on the CPU.
set -euo pipefail
DEFAULT_TRAIN_PRESETS="[tetrisType1Agent]"
DEFAULT_VAL_PRESETS="[tetrisType1Agent,tetrisType1LargeAgent,tetrisType2Agent]"
DEFAULT_MODEL=qwen_7b
source "$(dirname "$0")/../common.sh"
