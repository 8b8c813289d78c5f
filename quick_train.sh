#!/usr/bin/env bash
# Train the embedded default model (SmolLM2-135M-Instruct) on an easy game preset.
#
#   bash quick_train.sh
#
# Placeholder: PPO training arrives with the local trainer. Until then this script sets the
# machine up and shows the games working end to end (the oracle solving one episode of each).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
bash env_setup.sh
for game in sokoban tetris blocksworld textworld; do
  agentrl play "$game" --seed 0 --oracle | tail -n 1
done
echo "quick_train.sh: training is not available yet; it arrives with the local PPO trainer."
