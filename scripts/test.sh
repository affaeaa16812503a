#!/usr/bin/env bash
# The test command (README.md): builds FlashTile and runs every test suite.
#   1. the "ci" preset: release build, CUDA kernels compiled (a subset that covers every kernel template)
#      when nvcc is found; the GoogleTest suite through CTest on every CPU
#      ISA path this machine executes (FLASHTILE_CPU_ISA forces each);
#   2. ASan + UBSan build of the CPU library and the same suite;
#   3. the Python package's tests (pip install . + pytest), when the package is present.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${FLASHTILE_JOBS:-$(nproc)}

cmake --preset ci
cmake --build --preset ci -j "$jobs"
paths=$(build/ci/apps/flashtile/flashtile info | sed -n 's/^cpu isa paths runnable here: //p')
echo "CPU ISA paths to test: $paths"
for isa in $paths; do
  echo "=== ctest, FLASHTILE_CPU_ISA=$isa ==="
  FLASHTILE_CPU_ISA=$isa ctest --preset ci -j "$jobs"
done

echo "=== ASan + UBSan ==="
cmake --preset sanitize
cmake --build --preset sanitize -j "$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --preset sanitize -j "$jobs"

if [ -f pyproject.toml ] && [ -f scripts/ci_python.sh ]; then
  echo "=== Python package ==="
  bash scripts/ci_python.sh
fi
