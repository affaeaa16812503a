#!/usr/bin/env bash
# The test command (README.md): installs what is missing (scripts/setup.sh test), builds FlashTile and runs
# every test suite.
#   1. the "ci" preset: release build, CUDA kernels compiled (a subset that covers every kernel template)
#      when nvcc is found; the GoogleTest suite through CTest on every CPU ISA path this machine executes
#      (FLASHTILE_CPU_ISA forces each; the list comes from `flashtile info --isa-paths`);
#   2. `cmake --install` of that build into a temporary prefix, and the consumer project tests/consumer
#      built against the installed package (static and shared library) and run;
#   3. ASan + UBSan build of the CPU library and the same suite;
#   4. the Python package's tests (pip install . + pytest, scripts/ci_python.sh).
# It fails when a step finds nothing to run: no ISA path, a CTest run of zero tests, pytest collecting none.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${FLASHTILE_JOBS:-$(nproc)}

bash scripts/setup.sh test

cmake --preset ci
cmake --build --preset ci -j "$jobs"
mapfile -t paths < <(build/ci/apps/flashtile/flashtile info --isa-paths)
if [ ${#paths[@]} -eq 0 ]; then
  echo "test.sh: FAIL: 'flashtile info --isa-paths' listed no CPU ISA path to test" >&2
  exit 1
fi
echo "CPU ISA paths to test: ${paths[*]}"
for isa in "${paths[@]}"; do
  echo "=== ctest, FLASHTILE_CPU_ISA=$isa ==="
  FLASHTILE_CPU_ISA=$isa ctest --preset ci -j "$jobs" --no-tests=error
done

echo "=== cmake --install and the consumer project (tests/consumer) ==="
bash scripts/consumer_check.sh build/ci

echo "=== ASan + UBSan ==="
cmake --preset sanitize
cmake --build --preset sanitize -j "$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --preset sanitize -j "$jobs" --no-tests=error

echo "=== Python package ==="
bash scripts/ci_python.sh
