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

# The article's pipeline on the same model: PyTorch -> ONNX (naive export:
# dynamic axes, concatenated KV cache, experts dispatched by NonZero) ->
# k3 compile at O3 (fused and lowered to the planned executor; the compile
# report shows what each pass matched) -> one interleaved benchmark of the
# ONNX model compiled at O0 (the graph op by op, the baseline) and at O3.
# Short prompt and generation: O0 is the slow baseline by design.
if [ ! -f models/k3-base.naive.onnx ]; then
  PYTHONPATH=python .venv/bin/python -m k3ref.export_onnx --model "$model" --out models/k3-base.naive.onnx --style naive
fi
build/bin/k3 compile models/k3-base.naive.onnx --out models/k3-base.naive.O3.k3m --opt-level 3 \
  --report out/compile-k3-base-naive-O3.json
build/bin/k3 bench --model models/k3-base.naive.onnx --compare O0,O3 --batch 1 --prompt-len 8 \
  --gen-len 16 --repeat 3 --temperature 0 --threads 2 --markdown out/bench-k3-base-O0-vs-O3.md
