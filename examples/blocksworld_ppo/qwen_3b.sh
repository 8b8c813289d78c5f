#!/usr/bin/env bash
# PPO with a critic on BlocksWorld, Qwen2.5-3B-Instruct.
# Trains on two to four blocks described in text; validates on held-out instances and on five
# blocks.
#
#   bash examples/blocksworld_ppo/qwen_3b.sh                 # every GPU of a running Ray cluster, else of this node (verl)
#   bash examples/blocksworld_ppo/qwen_3b.sh --dry-run       # verl's config and command, validated
#   bash examples/blocksworld_ppo/qwen_3b.sh 16 "" "" "" "" "" "" 8   # two nodes of 8 GPUs
#   bash examples/blocksworld_ppo/qwen_3b.sh "" 16 8 "" "" "" "" "" "" "" "" 100 actor.lr=2e-6
#
# Hardware: 8 x A100 or H100 80GB, or 8 x L40 48GB (the preset follows the GPU's name; sizes and
# memory arithmetic in docs/HARDWARE.md, several nodes too). Time per step: not measured yet.
# Positional arguments and key=value overrides: as quick_train.sh (scripts/positional_args.sh);
# without GPUs this runs the local engine on the CPU.
set -euo pipefail
DEFAULT_TRAIN_PRESETS="[blocksworldTextAgent]"
DEFAULT_VAL_PRESETS="[blocksworldTextAgent,blocksworldText5Agent]"
DEFAULT_MODEL=qwen_3b
source "$(dirname "$0")/../common.sh"
