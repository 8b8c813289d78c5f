#!/usr/bin/env bash
# The first-run check of the verl backend on this node, before a long job (`agentrl doctor`):
# three short runs of verl's own trainer with the job's hardware preset and model (the legacy
# trainer 3 steps, the same constrained 2 steps, V1 with context windows 2 steps), then a
# PASS/FAIL/SKIP table: rollout_probs_diff, peak memory per phase against the preflight's
# estimate, constraint_violations, masked log-probs with use_remove_padding on and off, the
# critic at cut episodes' last token, V1's rows. Hardware: a node with NVIDIA GPUs after
# `bash env_setup.sh --gpu`; at most 10 minutes. Without a GPU: the rows a CPU can run, on
# hardware=cpu-verl model=tiny_vllm (vLLM's CPU build: `bash env_setup.sh --verl-cpu`; ~6 min
# on 2 cores); the others say SKIP and why.
#
#   bash examples/check_gpu.sh                        # this node's GPUs, its preset, qwen_halfb
#   bash examples/check_gpu.sh qwen_7b                # the model of the job to come
#   bash examples/check_gpu.sh qwen_3b verl.nnodes=2 verl.n_gpus_per_node=8   # a 2-node cluster
#
# Positional argument: 1 MODEL (qwen_halfb | qwen_3b | qwen_7b; default qwen_halfb; tiny_vllm
# on a CPU), then key=value overrides for agentrl (they win). HARDWARE=a100|h100|l40 chooses
# the preset (default: by the first GPU, as quick_train.sh does).
# Output: the table; logs and run folders in runs/doctor (OUT=... to change). Exit status 1
# when a row fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/positional_args.sh

if [[ ${1:-} == -h || ${1:-} == --help ]]; then print_help; exit 0; fi
MODEL=${1:-}
if [[ -n $MODEL && $MODEL != *=* ]]; then shift; else MODEL=""; fi
OUT=${OUT:-runs/doctor}

if has_nvidia_gpu; then
  gpus=$(visible_gpus)
  overrides=("hardware=${HARDWARE:-$(gpu_hardware_preset)}" "model=${MODEL:-qwen_halfb}"
             "hardware.gpu_memory_gb=$(gpu_memory_gb)" "verl.n_gpus_per_node=$gpus")
else
  echo "$(basename "$0"): no NVIDIA GPU: the rows a CPU can run (hardware=cpu-verl)" >&2
  overrides=("hardware=cpu-verl" "model=${MODEL:-tiny_vllm}")
fi
exec python -m agentrl.cli doctor --out "$OUT" "${overrides[@]}" "$@"
