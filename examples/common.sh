# Shared by examples/<game>_ppo/<model>.sh, which set the game's presets and the model, then
# source this: set-up, then the positional arguments exactly as quick_train.sh takes them
# (scripts/positional_args.sh), with the presets' sizes as defaults (configs/hardware/).
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/positional_args.sh
setup_environment

DEFAULT_GPUS=$(visible_gpus)   # every GPU of this node; 0 (the local engine on the CPU) without
DEFAULT_PROJECT=${DEFAULT_PROJECT:-agentrl}
DEFAULT_EXPERIMENT=${DEFAULT_EXPERIMENT:-$(basename "$(dirname "$0")")-$(basename "$0" .sh)}
train_from_positional_args "$@"
