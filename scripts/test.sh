#!/usr/bin/env bash
# The whole test suite on a fresh machine: set-up, Release build + all tests
# (C++ unit tests with ctest, end-to-end against the PyTorch reference with
# pytest), then an AddressSanitizer + UndefinedBehaviorSanitizer build running
# the C++ tests and the CLI bad-input tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"

# pytest's temporary files (about 3 GB of checkpoints and compiled models a run)
# go under the clone and are removed when the run passes: pytest's default
# keeps the last three runs in the system temp dir, and a CI machine whose disk
# filled mid-build (stop 41) failed with "No space left on device".
pytest_tmp="$PWD/build/pytest-tmp"
disk() { echo "-- disk: $(df -h --output=avail . | tail -1 | tr -d ' ') free"; }
disk

echo "== Release build"
scripts/build.sh build -DK3_WERROR=ON
echo "== C++ tests (Release)"
ctest --test-dir build --output-on-failure -j2 --timeout 600
echo "== End-to-end tests against the PyTorch reference"
K3_BIN="$PWD/build/bin/k3" python -m pytest tests/e2e -q -p no:cacheprovider --basetemp="$pytest_tmp"
rm -rf "$pytest_tmp"
disk

echo "== Sanitizer build (ASan + UBSan)"
scripts/build.sh build-asan -DK3_WERROR=ON -DK3_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo -DK3_BUILD_BENCH=OFF
echo "== C++ tests (ASan + UBSan)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j2 --timeout 900
echo "== CLI bad-input tests (ASan + UBSan binary)"
K3_BIN="$PWD/build-asan/bin/k3" ASAN_OPTIONS=detect_leaks=1 python -m pytest tests/e2e/test_cli_errors.py -q -p no:cacheprovider \
  --basetemp="$pytest_tmp"
rm -rf "$pytest_tmp"
disk
