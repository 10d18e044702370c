#!/usr/bin/env bash
# The main job: set up, build, create the article's model (k3-base, random
# weights, about 456M parameters), generate with timing at 2 threads, then
# benchmark it (article settings: prompt 128, 128 new tokens, batch 1/4/8).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh build
model=models/k3-base
if [ ! -f "$model/model.safetensors" ]; then
  build/bin/k3 init-model --preset k3-base --seed 7 --out "$model"
fi
mkdir -p out
build/bin/k3 generate --model "$model" --prompt-ids 5,17,42,99 --max-new-tokens 64 --temperature 0 --threads 2 --json
build/bin/k3 bench --model "$model" --batch 1,4,8 --prompt-len 128 --gen-len 128 --repeat 3 --threads 2 \
  --markdown out/bench-k3-base.md --json out/bench-k3-base.json --plot out/bench-k3-base.svg
