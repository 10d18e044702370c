#!/usr/bin/env bash
# Configures and builds K3. Usage: scripts/build.sh [BUILD_DIR] [extra cmake args...]
# BUILD_DIR defaults to build (Release).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)"
