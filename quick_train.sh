#!/usr/bin/env bash
# Train a model to play the games with PPO, from a fresh machine, in one command.
#
#   bash quick_train.sh                         # CPU: the embedded SmolLM2-135M, a few steps
#   bash quick_train.sh 0 4 4 2 1 "[simpleSokobanAgent]" "[largeSokobanAgent]" 1 agentrl sokoban embedded 20
#   bash quick_train.sh 0 2 2 1 1 "[banditAgent]" "[banditAgent]" 1 agentrl smoke tiny 2 trainer.logger=[console]
#
# Positional arguments (each has a default; give them in this order, "" keeps a default):
#    1 GPUS              GPUs to use (default: 0 on a machine without CUDA, else 1)
#    2 GROUP_NUM         training groups per step, each on a new game          (default 2)
#    3 GROUP_SIZE        episodes per group, all on the group's game           (default 4)
#    4 VAL_GROUP_NUM     held-out games per validation preset                  (default 2)
#    5 VAL_GROUP_SIZE    episodes per held-out game                            (default 1)
#    6 TRAIN_PRESETS     agent presets to train on, a hydra list               (default [quickSokobanAgent])
#    7 VAL_PRESETS       agent presets to validate on                          (default [quickSokobanAgent])
#    8 GPUS_PER_NODE     GPUs per node (multi-node runs)                       (default: GPUS)
#    9 PROJECT           WandB project, and runs/<project>/                    (default agentrl)
#   10 EXPERIMENT        run name, and runs/<project>/<experiment>/            (default quick)
#   11 MODEL             a preset of configs/model/ (embedded, tiny) or a model folder / hub id
#                                                                             (default embedded)
#   12 TOTAL_STEPS       training steps                                        (default 4 on CPU)
# Anything after them is a hydra key=value override of configs/base.yaml, passed through.
#
# Set-up (env_setup.sh, idempotent) runs first. On a machine without a GPU this trains on the
# CPU preset (configs/hardware/cpu.yaml) and prints where the checkpoint, metrics and plot are.
# Running the same command again resumes the run from its newest checkpoint.
set -euo pipefail
cd "$(dirname "$0")"

has_cuda() { python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; }

bash env_setup.sh

if has_cuda; then default_gpus=1; else default_gpus=0; fi
GPUS=${1:-$default_gpus}
GROUP_NUM=${2:-2}
GROUP_SIZE=${3:-4}
VAL_GROUP_NUM=${4:-2}
VAL_GROUP_SIZE=${5:-1}
TRAIN_PRESETS=${6:-[quickSokobanAgent]}
VAL_PRESETS=${7:-[quickSokobanAgent]}
GPUS_PER_NODE=${8:-$GPUS}
PROJECT=${9:-agentrl}
EXPERIMENT=${10:-quick}
MODEL=${11:-embedded}
TOTAL_STEPS=${12:-4}
shift $(( $# < 12 ? $# : 12 ))

for name in GPUS GROUP_NUM GROUP_SIZE VAL_GROUP_NUM VAL_GROUP_SIZE GPUS_PER_NODE TOTAL_STEPS; do
  if ! [[ ${!name} =~ ^[0-9]+$ ]]; then
    echo "quick_train.sh: $name must be a whole number, got '${!name}'" >&2
    exit 2
  fi
done

if [[ -f configs/model/$MODEL.yaml ]]; then model_override="model=$MODEL"; else model_override="model.name=$MODEL"; fi

if (( GPUS == 0 )); then
  hardware=(hardware=cpu)
elif (( GPUS == 1 )) && has_cuda; then
  hardware=(hardware=cpu device=cuda)  # the local engine on one GPU
else
  echo "quick_train.sh: GPUS=$GPUS needs the verl backend, which this version does not ship;" \
       "use GPUS=0 (CPU) or GPUS=1 (one CUDA GPU, local engine)" >&2
  exit 2
fi
: "$GPUS_PER_NODE"  # read by the multi-GPU backend

exec python -m agentrl.cli train "${hardware[@]}" "$model_override" \
  train.group_num="$GROUP_NUM" train.group_size="$GROUP_SIZE" \
  val.group_num="$VAL_GROUP_NUM" val.group_size="$VAL_GROUP_SIZE" \
  "train.presets=$TRAIN_PRESETS" "val.presets=$VAL_PRESETS" \
  project="$PROJECT" experiment="$EXPERIMENT" train.total_steps="$TOTAL_STEPS" \
  "$@"
