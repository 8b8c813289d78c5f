# Shared by examples/<game>_ppo/<model>.sh, which set the game's presets and the model, then
# source this: set-up, then the positional arguments exactly as quick_train.sh takes them
# (scripts/positional_args.sh), with the presets' sizes as defaults (configs/hardware/).
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/positional_args.sh"
check_positional_args "$@"
setup_environment

# GPUs: every GPU of a running Ray cluster (`ray start` on each node first: two nodes of 8 are
# 16 GPUs, 8 per node), else every GPU of this node; 0 (the local engine on the CPU) without.
if has_nvidia_gpu && cluster_gpus=$(python -m agentrl.verl.cluster 2>/dev/null); then
  read -r DEFAULT_GPUS DEFAULT_GPUS_PER_NODE <<<"$cluster_gpus"
  echo "$(basename "$0"): the running Ray cluster has $DEFAULT_GPUS GPUs," \
       "$DEFAULT_GPUS_PER_NODE per node; using them all (the GPUS and GPUS_PER_NODE arguments" \
       "choose)" >&2
else
  DEFAULT_GPUS=$(visible_gpus)
fi
DEFAULT_PROJECT=${DEFAULT_PROJECT:-agentrl}
DEFAULT_EXPERIMENT=${DEFAULT_EXPERIMENT:-$(basename "$(dirname "$0")")-$(basename "$0" .sh)}
train_from_positional_args "$@"
