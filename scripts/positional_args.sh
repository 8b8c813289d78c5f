# Positional arguments of quick_train.sh and examples/*/*.sh -> one `agentrl train` command.
# Sourced, not run; the caller sets its defaults first:
#
#   DEFAULT_TRAIN_PRESETS="[simpleSokobanAgent]" DEFAULT_MODEL=qwen_3b
#   source scripts/positional_args.sh
#   check_positional_args "$@"         # --help, and bad arguments, before anything slow
#   setup_environment                  # env_setup.sh, with --gpu on a machine with NVIDIA GPUs
#   train_from_positional_args "$@"    # exec's agentrl train
#
# Nothing changes the working folder: a relative run_dir=, agents_file= or model path is the
# caller's (env_setup.sh runs in the checkout, in a subshell).
#
# The arguments, in this order ("" or a missing one keeps the default):
#    1 GPUS            2 GROUP_NUM       3 GROUP_SIZE      4 VAL_GROUP_NUM
#    5 VAL_GROUP_SIZE  6 TRAIN_PRESETS   7 VAL_PRESETS     8 GPUS_PER_NODE
#    9 PROJECT        10 EXPERIMENT     11 MODEL          12 TOTAL_STEPS
#   13 SFT_STEPS       (warm-start steps of SFT on oracle play before the TOTAL_STEPS PPO steps:
#                       train.sft_steps = SFT_STEPS, train.total_steps = TOTAL_STEPS + SFT_STEPS)
# then key=value overrides of configs/base.yaml, passed through last (so they win); the first
# argument with a '=' starts them, so arguments left out at the end keep their defaults.
# `--dry-run`, anywhere: print what would run and stop: the local backend's resolved config, or
# verl's config and command, validated (GPUS > 0 on a machine without a GPU plans verl).
# `--help` / `-h`, anywhere: the calling script's header comment.
#
# Backend: GPUS > 0 with verl and vLLM installed -> verl, on the hardware preset named by
# $HARDWARE or by the GPU (80 GB and more: H100/H200/H800 -> h100, others -> a100; less: l40,
# the 48 GB sizes), hardware.gpu_memory_gb = the GPU's memory (the preflight fits the run to it),
# verl.n_gpus_per_node = GPUS_PER_NODE (default GPUS) and verl.nnodes = GPUS / GPUS_PER_NODE
# (several nodes: `ray start` on each first, docs/HARDWARE.md). Otherwise the local engine:
# GPUS=0 on the CPU preset, GPUS=1 on that GPU.
#
# Defaults: DEFAULT_<NAME> (empty or unset: the presets' value), and DEFAULT_OVERRIDES, an array
# of key=value overrides placed before the caller's own (which win). A caller may define
# `backend_defaults local|verl` to set them per backend; it runs once the backend is known.

POSITIONAL_NAMES=(GPUS GROUP_NUM GROUP_SIZE VAL_GROUP_NUM VAL_GROUP_SIZE TRAIN_PRESETS
                  VAL_PRESETS GPUS_PER_NODE PROJECT EXPERIMENT MODEL TOTAL_STEPS SFT_STEPS)
declare -A CONFIG_KEYS=(
  [GROUP_NUM]=train.group_num [GROUP_SIZE]=train.group_size [VAL_GROUP_NUM]=val.group_num
  [VAL_GROUP_SIZE]=val.group_size [TRAIN_PRESETS]=train.presets [VAL_PRESETS]=val.presets
  [PROJECT]=project [EXPERIMENT]=experiment [TOTAL_STEPS]=train.total_steps
)
WHOLE_NUMBERS=" GPUS GROUP_NUM GROUP_SIZE VAL_GROUP_NUM VAL_GROUP_SIZE GPUS_PER_NODE TOTAL_STEPS SFT_STEPS "
AGENTRL_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

has_nvidia_gpu() { nvidia-smi -L >/dev/null 2>&1; }
has_cuda() { python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; }
has_verl_gpu_stack() {
  python -c "import importlib.util as u, sys; sys.exit(0 if u.find_spec('verl') and u.find_spec('vllm') else 1)" 2>/dev/null
}
visible_gpus() { if has_nvidia_gpu; then nvidia-smi -L | grep -c '^GPU'; else echo 0; fi; }

setup_environment() {  # in the checkout (env_setup.sh keeps its venvs there), in a subshell
  if has_nvidia_gpu; then (cd "$AGENTRL_ROOT" && bash env_setup.sh --gpu)
  else (cd "$AGENTRL_ROOT" && bash env_setup.sh); fi
}

# The calling script's header comment (from line 2 to `set -euo pipefail`).
print_help() { sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed -E 's/^# ?//'; }

# --help, and what can be checked without Python: the number of positional arguments, whole
# numbers. Exits (0 for --help, 2 with a message) before set-up runs.
check_positional_args() {
  local arg count=0 index=0 name
  for arg in "$@"; do
    if [[ $arg == -h || $arg == --help ]]; then print_help; exit 0; fi
  done
  for arg in "$@"; do
    [[ $arg == --dry-run ]] && continue
    [[ $arg == *=* ]] && break
    if [[ $arg == -* && -n $arg ]]; then
      positional_error "unknown option '$arg'; allowed: --dry-run, --help, ${#POSITIONAL_NAMES[@]}" \
                       "positional arguments, then key=value overrides"
    fi
    count=$((count + 1))
    if (( count > ${#POSITIONAL_NAMES[@]} )); then
      positional_error "too many arguments: '$arg' is argument $count, but there are" \
                       "${#POSITIONAL_NAMES[@]} positional ones (${POSITIONAL_NAMES[*]}); allowed" \
                       "after them: key=value overrides"
    fi
    name=${POSITIONAL_NAMES[$index]}
    index=$((index + 1))
    if [[ $WHOLE_NUMBERS == *" $name "* && -n $arg && ! $arg =~ ^[0-9]+$ ]]; then
      positional_error "$name must be a whole number, got '$arg'"
    fi
  done
}

# The hardware preset of this machine's first GPU (a100 without one: a dry run on a CPU),
# chosen by its memory first: a 40 GB A100/A800 gets the 48 GB sizes (l40), which the verl
# preflight then fits to its real memory (gpu_memory_gb below).
gpu_hardware_preset() {
  local name memory_mib
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || true)
  if [[ -z $name ]]; then echo a100; return; fi
  memory_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
  if (( memory_mib >= 75000 )); then
    case $name in
      *H100* | *H200* | *H800*) echo h100 ;;
      *A100* | *A800*) echo a100 ;;
      *) echo "$(basename "$0"): no hardware preset names '$name'; a100 by its memory" \
              "(HARDWARE=a100|h100|l40 chooses)" >&2
         echo a100 ;;
    esac
  else
    case $name in
      *L40*) ;;
      *) echo "$(basename "$0"): '$name' has $memory_mib MiB; the 48 GB preset l40, fitted to" \
              "it by the preflight (HARDWARE=a100|h100|l40 chooses)" >&2 ;;
    esac
    echo l40
  fi
}

# The first GPU's memory in GB (10^9 bytes), for hardware.gpu_memory_gb.
gpu_memory_gb() {
  local memory_mib
  memory_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
  awk -v mib="$memory_mib" 'BEGIN { printf "%.1f\n", mib * 1048576 / 1e9 }'
}

positional_error() { echo "$(basename "$0"): $*" >&2; exit 2; }

train_from_positional_args() {
  local dry_run=() args=() arg name
  for arg in "$@"; do
    if [[ $arg == --dry-run ]]; then dry_run=(--dry-run); else args+=("$arg"); fi
  done
  set -- ${args[@]+"${args[@]}"}
  declare -A given=()
  for name in "${POSITIONAL_NAMES[@]}"; do  # a key=value ends them: the overrides follow
    if [[ ${1-} == *=* ]]; then break; fi
    given[$name]=${1-}
    if (( $# )); then shift; fi
  done

  local gpus=${given[GPUS]:-${DEFAULT_GPUS:-0}} backend
  [[ $gpus =~ ^[0-9]+$ ]] || positional_error "GPUS must be a whole number, got '$gpus'"
  if (( gpus > 0 )) && has_verl_gpu_stack; then
    backend=verl
  elif (( gpus == 0 )) || { (( gpus == 1 )) && has_cuda; }; then
    backend=local
  elif (( ${#dry_run[@]} )); then  # planning a GPU run on a machine without one
    backend=verl
  else
    positional_error "GPUS=$gpus needs the verl backend (verl and vLLM: bash env_setup.sh --gpu)" \
                     "or one CUDA GPU for the local engine"
  fi
  if declare -F backend_defaults >/dev/null; then backend_defaults "$backend"; fi

  declare -A value=()
  for name in "${POSITIONAL_NAMES[@]}"; do
    local default_name="DEFAULT_$name"
    value[$name]=${given[$name]:-${!default_name:-}}
    if [[ $WHOLE_NUMBERS == *" $name "* && -n ${value[$name]} && ! ${value[$name]} =~ ^[0-9]+$ ]]; then
      positional_error "$name must be a whole number, got '${value[$name]}'"
    fi
  done

  local overrides=()
  if [[ $backend == verl ]]; then
    overrides+=(backend=verl "hardware=${HARDWARE:-$(gpu_hardware_preset)}")
    if has_nvidia_gpu; then overrides+=("hardware.gpu_memory_gb=$(gpu_memory_gb)"); fi
    if (( gpus > 0 )); then
      local per_node=${value[GPUS_PER_NODE]:-$gpus}
      (( per_node > 0 && gpus % per_node == 0 )) \
        || positional_error "GPUS=$gpus is not a whole number of nodes of GPUS_PER_NODE=$per_node"
      overrides+=("verl.n_gpus_per_node=$per_node" "verl.nnodes=$(( gpus / per_node ))")
    fi
  elif (( gpus == 0 )); then
    overrides+=(hardware=cpu)
  else
    overrides+=(hardware=cpu device=cuda)  # the local engine on one GPU
  fi
  local model=${value[MODEL]}
  if [[ -n $model ]]; then  # a preset, a path (a model, checkpoint or run folder), a hub id
    if [[ -f $AGENTRL_ROOT/configs/model/$model.yaml || -e $model ]]; then overrides+=("model=$model")
    else overrides+=("model.name=$model"); fi
  fi
  local sft_steps=${value[SFT_STEPS]:-0}
  if (( sft_steps > 0 )); then  # the warm start's steps come before TOTAL_STEPS of PPO
    overrides+=("train.sft_steps=$sft_steps")
    if [[ -n ${value[TOTAL_STEPS]} ]]; then value[TOTAL_STEPS]=$(( value[TOTAL_STEPS] + sft_steps )); fi
  fi
  for name in "${POSITIONAL_NAMES[@]}"; do
    if [[ -n ${CONFIG_KEYS[$name]:-} && -n ${value[$name]} ]]; then
      overrides+=("${CONFIG_KEYS[$name]}=${value[$name]}")
    fi
  done
  exec python -m agentrl.cli train ${dry_run[@]+"${dry_run[@]}"} "${overrides[@]}" \
    ${DEFAULT_OVERRIDES[@]+"${DEFAULT_OVERRIDES[@]}"} "$@"
}
