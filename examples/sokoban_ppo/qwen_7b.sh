#!/usr/bin/env bash
# PPO with a critic on Sokoban, Qwen2.5-7B-Instruct.
# Trains on 6x6 rooms with one box; validates on held-out 6x6 rooms and on 8x8 rooms.
#
#   bash examples/sokoban_ppo/qwen_7b.sh                 # every GPU of a running Ray cluster, else of this node (verl)
#   bash examples/sokoban_ppo/qwen_7b.sh --dry-run       # verl's config and command, validated
#   bash examples/sokoban_ppo/qwen_7b.sh 16 "" "" "" "" "" "" 8   # two nodes of 8 GPUs
#   bash examples/sokoban_ppo/qwen_7b.sh "" 16 8 "" "" "" "" "" "" "" "" 100 actor.lr=2e-6
#
# Hardware: 8 x A100 or H100 80GB, or 8 x L40 48GB (the preset follows the GPU's name; sizes and
# memory arithmetic in docs/HARDWARE.md, several nodes too). Time per step: not measured yet.
# Positional arguments and key=value overrides: as quick_train.sh (scripts/positional_args.sh);
# without GPUs this runs the local engine on the CPU.
set -euo pipefail
DEFAULT_TRAIN_PRESETS="[simpleSokobanAgent]"
DEFAULT_VAL_PRESETS="[simpleSokobanAgent,largeSokobanAgent]"
DEFAULT_MODEL=qwen_7b
source "$(dirname "$0")/../common.sh"
