#!/usr/bin/env bash
# The main job: set up, build, create the article's model (k3-base, random
# weights, about 456M parameters) and generate with timing at 2 threads.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh build
model=models/k3-base
if [ ! -f "$model/model.safetensors" ]; then
  build/bin/k3 init-model --preset k3-base --seed 7 --out "$model"
fi
build/bin/k3 generate --model "$model" --prompt-ids 5,17,42,99 --max-new-tokens 64 --temperature 0 --threads 2 --json
