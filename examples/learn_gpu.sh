#!/usr/bin/env bash
# The learning benchmark at a peer's scale on one GPU: the local engine (no verl, no vLLM), the
# embedded SmolLM2-135M, tightBlocksworldTurnsAgent; a warm start on 192 oracle demonstrations,
# then PPO with 64 episodes a step (16 games x 4) for up to 100 steps, both judged greedy on the
# same 128 instance-disjoint held-out games (RAGEN/GRL run 8 x 16 episodes x 200 steps on
# Sokoban; docs/results/learning.md). Hardware: one GPU with >= 24 GB; about 10 minutes on an
# H100-class GPU (PPO's budget, 7 minutes by default, caps the steps).
#
#   bash examples/learn_gpu.sh                       # seed 0: sft and sft_ppo, JSON + plot
#   bash examples/learn_gpu.sh 3 200 20              # 3 seeds, 200 steps, 20 PPO minutes
#   bash examples/learn_gpu.sh 1 2 1 model=tiny device=cpu --val-groups 2 --sft-episodes 8
#                                                   # a smoke run on a CPU (the test's)
#
# Positional arguments (each has a default; "" keeps it), then extra arguments for
# scripts/bench/learn.py (its --flags and key=value config overrides):
#   1 training seeds (default 1)    2 most PPO steps (default 100)
#   3 PPO minutes per seed (default 7)
# Output: bench_results/learn_gpu.json and .png (OUT=... to change), runs under
# bench_results/learn_gpu_runs/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

SEEDS=${1:-1}; STEPS=${2:-100}; MINUTES=${3:-7}
shift $(( $# < 3 ? $# : 3 ))
OUT=${OUT:-bench_results/learn_gpu.json}

exec python scripts/bench/learn.py --recipes sft sft_ppo --seeds "$SEEDS" --steps "$STEPS" \
    --minutes "$MINUTES" --sft-episodes 192 --sft-epochs 1 --val-groups 128 \
    --run-dir "${OUT%.json}_runs" --out "$OUT" \
    device=cuda train.group_num=16 train.group_size=4 rollout.max_batch=64 \
    actor.micro_batch_size=16 sft.micro_batch_size=8 "$@"
