#!/usr/bin/env bash
# Train a model to play the games with PPO, from a fresh machine, in one command.
#
#   bash quick_train.sh                         # CPU: the embedded SmolLM2-135M, warm start + PPO
#   bash quick_train.sh 0 4 4 32 1 "[simpleSokobanAgent]" "[largeSokobanAgent]" 1 agentrl sokoban embedded 20 0
#   bash quick_train.sh 0 2 2 1 1 "[banditAgent]" "[banditAgent]" 1 agentrl smoke tiny 2 0 trainer.logger=[console]
#   bash quick_train.sh 8 "" "" "" "" "" "" 8 agentrl quick-gpu qwen_3b    # 8 GPUs: verl, A100 sizes
#   bash quick_train.sh --dry-run 16 "" "" "" "" "" "" 8                   # 2 nodes: what would run
#
# Positional arguments (each has a default; give them in this order, "" keeps a default):
#    1 GPUS              GPUs to use (default: 0 on a machine without CUDA, else 1)
#    2 GROUP_NUM         training groups per step, each on a new game          (default 4)
#    3 GROUP_SIZE        episodes per group, all on the group's game           (default 8)
#    4 VAL_GROUP_NUM     held-out games per validation preset                  (default 32)
#    5 VAL_GROUP_SIZE    episodes per held-out game                            (default 1)
#    6 TRAIN_PRESETS     agent presets to train on, a hydra list               (default [tightBlocksworldTurnsAgent])
#    7 VAL_PRESETS       agent presets to validate on                          (default [tightBlocksworldTurnsAgent])
#                        (verl: [tightBlocksworldAgent]: it trains one row an episode, no history window)
#    8 GPUS_PER_NODE     GPUs per node (multi-node runs)                       (default: GPUS)
#    9 PROJECT           WandB project, and runs/<project>/                    (default agentrl)
#   10 EXPERIMENT        run name, and runs/<project>/<experiment>/            (default quick)
#   11 MODEL             a preset of configs/model/ (embedded, tiny, qwen_halfb, qwen_3b, qwen_7b)
#                        or a model folder / hub id                            (default embedded)
#   12 TOTAL_STEPS       PPO steps                                             (default 8 on CPU)
#   13 SFT_STEPS         warm-start steps before them: SFT on the game oracle's play, one
#                        mini-batch of demonstrations each (train.sft_steps)  (default 24 on CPU)
# On the verl backend, 2-4 and 12 default to the hardware preset's values, 11 to qwen_halfb,
# 13 to 0 (verl's SFT is its own command: agentrl sft backend=verl).
# Anything after them is a hydra key=value override of configs/base.yaml, passed through.
# `--dry-run` (anywhere): print what this would run and stop: the resolved config of a local run,
# or verl's config and command, validated. `--help`: this text.
#
# Arguments are checked first; then set-up (env_setup.sh, idempotent; --gpu where nvidia-smi
# sees a GPU) runs. Relative paths (run_dir=..., a model folder) are the caller's. Then:
# - GPUS=0: the local engine on the CPU preset (configs/hardware/cpu.yaml), the defaults above;
# - GPUS>0 with verl and vLLM installed: verl (FSDP + vLLM + Ray) on the GPU's hardware preset
#   (a100, h100, l40; HARDWARE=... chooses), verl.n_gpus_per_node=GPUS_PER_NODE and
#   verl.nnodes=GPUS/GPUS_PER_NODE; group sizes and steps default to the preset's (8 x 16 on
#   A100s), the model to qwen_halfb (Qwen2.5-0.5B-Instruct). Several nodes: docs/HARDWARE.md;
# - GPUS=1 without vLLM: the local engine on that GPU.
# It prints the last checkpoint and the best by held-out validation (step and held-out success
# of each; eval and play take the best), the metrics and the plot. Running the same command
# again resumes the run from its newest checkpoint. Argument handling: scripts/positional_args.sh.
set -euo pipefail
source "$(dirname "$0")/scripts/positional_args.sh"
check_positional_args "$@"
setup_environment

if has_cuda; then DEFAULT_GPUS=1; else DEFAULT_GPUS=0; fi
DEFAULT_PROJECT=agentrl
DEFAULT_EXPERIMENT=quick

backend_defaults() {  # CPU-sized for the local engine; the GPU presets' own sizes for verl
  if [[ $1 == local ]]; then
    # one move a turn, one past turn kept: a history window verl cannot train (one row an episode)
    DEFAULT_TRAIN_PRESETS="[tightBlocksworldTurnsAgent]" DEFAULT_VAL_PRESETS="[tightBlocksworldTurnsAgent]"
    DEFAULT_GROUP_NUM=4 DEFAULT_GROUP_SIZE=8 DEFAULT_VAL_GROUP_NUM=32 DEFAULT_VAL_GROUP_SIZE=1
    DEFAULT_MODEL=embedded DEFAULT_TOTAL_STEPS=8 DEFAULT_SFT_STEPS=24
    # 8 demonstrations a step with all their context windows (~18 rows), each of 192 seen
    # once; 4 rows in a forward/backward pass (their shared rules run once a pass);
    # validation before step 1, after the warm start and at the end
    DEFAULT_OVERRIDES=(sft.episodes=192 sft.micro_batch_size=4 val.test_freq=24)
  else
    DEFAULT_TRAIN_PRESETS="[tightBlocksworldAgent]" DEFAULT_VAL_PRESETS="[tightBlocksworldAgent]"
    DEFAULT_MODEL=qwen_halfb
  fi
}

train_from_positional_args "$@"
