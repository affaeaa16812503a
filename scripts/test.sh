#!/usr/bin/env bash
# The test command (README.md): installs what is missing (scripts/setup.sh test), builds FlashTile and runs
# every test suite.
#   1. the "ci" preset: release build, CUDA kernels compiled (a subset that covers every kernel template)
#      when nvcc is found; the GoogleTest suite through CTest on every CPU ISA path this machine executes
#      (FLASHTILE_CPU_ISA forces each; the list comes from `flashtile info --isa-paths`), and on each once more with
#      every forward on the tiled forward kernel and once with every forward it can take on the decode kernel
#      (FLASHTILE_CPU_FORWARD=tiles / decode), so that each kernel meets every forward case, not only those the
#      automatic choice gives it (src/cpu/decode_plan.h forward_on_decode);
#   2. `cmake --install` of that build into a temporary prefix, and the consumer project tests/consumer
#      built against the installed package (static and shared library) and run;
#   3. ASan + UBSan build of the CPU library and the same suite;
#   4. the Python package's tests (pip install . + pytest, scripts/ci_python.sh).
# It fails when a step finds nothing to run: no ISA path, a CTest run of zero tests, pytest collecting none.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${FLASHTILE_JOBS:-$(nproc)}
# Each step's wall time, printed as it ends and listed again at the exit (CI's budget for a run: 30 minutes).
times=()
t0=$(date +%s)
lap() { times+=("$(printf '%5ds  %s' "$SECONDS" "$1")"); echo "--- $1 took ${SECONDS}s"; SECONDS=0; }
ccache_on=0
report() {
  printf 'test.sh step times (%ds in all):\n' "$(( $(date +%s) - t0 ))"
  printf '  %s\n' "${times[@]}"
  if [ "$ccache_on" = 1 ]; then ccache --show-stats | grep -Ei 'hits|misses' || true; fi
}
trap report EXIT

bash scripts/setup.sh test
lap "setup"

# ccache: the Python package's `pip install .` compiles the same library sources with the same flags as the ci
# preset, and a re-run compiles what did not change; ccache returns those objects instead of compiling them again.
# CCACHE_BASEDIR hashes paths relative to this tree (hits across clones in other folders), CCACHE_NOHASHDIR lets
# the -g objects of the sanitizer build hit too. ccache's hash includes the compiler's name, and pip's build takes
# Python's sysconfig CXX (g++) where CMake alone takes c++: CC and CXX name one compiler for every build (with
# that, one object compiled in build/ci hits from the pip build here; the fresh root still counted 15 hits of 198,
# not explained yet: README). FLASHTILE_CCACHE=0 turns it off.
if [ "${FLASHTILE_CCACHE:-1}" = 1 ] && command -v ccache >/dev/null 2>&1; then
  export CC=${CC:-cc} CXX=${CXX:-c++}
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
  ccache --zero-stats >/dev/null
  ccache_on=1
fi

cmake --preset ci
cmake --build --preset ci -j "$jobs"
lap "ci build"
mapfile -t paths < <(build/ci/apps/flashtile/flashtile info --isa-paths)
if [ ${#paths[@]} -eq 0 ]; then
  echo "test.sh: FAIL: 'flashtile info --isa-paths' listed no CPU ISA path to test" >&2
  exit 1
fi
echo "CPU ISA paths to test: ${paths[*]}"
for isa in "${paths[@]}"; do
  for fwd in "" tiles decode; do
    echo "=== ctest, FLASHTILE_CPU_ISA=$isa FLASHTILE_CPU_FORWARD=$fwd ==="
    FLASHTILE_CPU_ISA=$isa FLASHTILE_CPU_FORWARD=$fwd ctest --preset ci -j "$jobs" --no-tests=error
    lap "ctest $isa${fwd:+ forward=$fwd}"
  done
done

echo "=== cmake --install and the consumer project (tests/consumer) ==="
bash scripts/consumer_check.sh build/ci
lap "install + consumer"

echo "=== ASan + UBSan ==="
cmake --preset sanitize
cmake --build --preset sanitize -j "$jobs"
lap "sanitize build"
for fwd in "" tiles decode; do
  FLASHTILE_CPU_FORWARD=$fwd ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --preset sanitize -j "$jobs" --no-tests=error
  lap "sanitize ctest${fwd:+ forward=$fwd}"
done

echo "=== Python package ==="
bash scripts/ci_python.sh
lap "python"
