#!/usr/bin/env bash
# PPO with a critic on TextWorld, Qwen2.5-3B-Instruct.
# Trains on easy quests; validates on held-out easy quests and on medium ones.
#
#   bash examples/textworld_ppo/qwen_3b.sh                 # every GPU of a running Ray cluster, else of this node (verl)
#   bash examples/textworld_ppo/qwen_3b.sh --dry-run       # verl's config and command, validated
#   bash examples/textworld_ppo/qwen_3b.sh 16 "" "" "" "" "" "" 8   # two nodes of 8 GPUs
#   bash examples/textworld_ppo/qwen_3b.sh "" 16 8 "" "" "" "" "" "" "" "" 100 actor.lr=2e-6
#
# Hardware: 8 x A100 or H100 80GB, or 8 x L40 48GB (the preset follows the GPU's name; sizes and
# memory arithmetic in docs/HARDWARE.md, several nodes too). Time per step: not measured yet.
# The task files hold one TextWorld game per group and step (1,600 for 200 steps of 8 groups),
# generated into the on-disk game pool before verl starts: about a second of CPU each, spread
# over the node's cores.
# Positional arguments and key=value overrides: as quick_train.sh (scripts/positional_args.sh);
# without GPUs this runs the local engine on the CPU.
set -euo pipefail
DEFAULT_TRAIN_PRESETS="[textworldEasyAgent]"
DEFAULT_VAL_PRESETS="[textworldEasyAgent,textworldMediumAgent]"
DEFAULT_MODEL=qwen_3b
source "$(dirname "$0")/../common.sh"
