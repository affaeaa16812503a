#!/usr/bin/env bash
# GPU check for the CUDA backend, run on the GPU machine with the repository as cwd:
#   build (ninja, all cores) -> GPU tests (GoogleTest, float64 oracle) -> torch parity (math SDPA, float64)
#   -> compute-sanitizer memcheck + racecheck on small shapes -> benchmark -> short table last.
# Logs and JSON go to $OUT (default ./gpu-check-out).
#
# Environment:
#   FT_ARCHS=90            SASS architectures (FLASHTILE_CUDA_ARCHS); the H200 needs 90 only
#   FT_KERNELS=all         FLASHTILE_CUDA_KERNELS subset, e.g. "hdim64;hdim128"
#   FT_BUILD=build/gpu     build directory
#   FT_PREBUILT            a carried folder from scripts/pack_prebuilt.sh (the GPU tests and the C ABI library built
#                          on the dev VM): no build here; the steps that need the Python package are left out
#   FT_PYTHON=auto         build + pip install the Python package (auto: when python/ and pyproject.toml exist);
#                          build: the package's modules from the C++ build's own objects (no second compile of the
#                          kernels), staged in $BUILD/pkg and put on PYTHONPATH
#   FT_PY_KERNELS          the package's kernel subset (default: FT_KERNELS); step `pytest` runs tests/python
#   FT_STEPS="tests parity sanitize bench"   which steps to run (also: pytest, variants, profile, breakdown, cpu,
#                          decode, pipes, cp, cpbench, cptrace)
#                          decode: bench/gpu_decode.py (the KV-cache cells against torch; FT_DECODE_ARGS)
#                          cp, cpbench: tests/gpu/cp_check.py, bench/cp_bench.py (FT_CP_ARGS) under torchrun on two GPUs
#                          cptrace: bench/cp_trace.py (FT_CPTRACE_ARGS), the ring's kernels with and without transfers
#                          pipes: bench/ncu_pipes.py (tensor-pipe and issue-slot use beside cuDNN; FT_PIPES_ARGS)
#                          variants: bench/gpu_variants.py (FT_VARIANTS_ARGS) after the package is installed
#                          cpu: scripts/cpu_remote.sh run (CPU tests per ISA + CPU benchmark, from binaries
#                          carried in .carry/cpu; runs first, before the build loads the cores)
#   FT_BREAKDOWN_CELLS     hdim:seqlen:causal list for the breakdown step (bench/gpu_profile.py --breakdown)
#   FT_PROFILE_ARGS, FT_PROFILE_KERNELS   the profile step's shape (bench/gpu_profile.py) and ncu's kernel regex
#   FT_BENCH_ARGS=""       extra arguments for bench/gpu_bench.py (e.g. "--hdims 128 --seqlens 1024,8192")
#   CUTLASS_DIR            CuTe headers (default: .carry/cutlass/include if present, else the pip package)
#   FT_COMMIT              the commit the copy was made from, for the decode table (the GPU machine's copy may
#                          carry stale git metadata: give it from here, e.g. FT_COMMIT=2c14bac)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-check-out}
mkdir -p "$OUT"
ARCHS=${FT_ARCHS:-90}
KERNELS=${FT_KERNELS:-all}
BUILD=${FT_BUILD:-build/gpu}
STEPS=${FT_STEPS:-tests parity sanitize bench}
JOBS=$(nproc)
SUMMARY=$OUT/summary.txt
START=$(date +%s)
DEADLINE=${FT_DEADLINE:-0}   # seconds after start by which the benchmark must end (0: no deadline)
# Several runs may share one $OUT in a device call (a build, then the tests, then the benchmark): each appends its
# notes to the summary, and the archive at the end keeps the earlier runs' logs.
SUMMARY_FROM=$(( $(cat "$SUMMARY" 2>/dev/null | wc -l) + 1 ))
note() { echo "$*" | tee -a "$SUMMARY"; }
has_step() { [[ " $STEPS " == *" $1 "* ]]; }

note "== gpu_check $(date -u +%FT%TZ) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
note "archs=$ARCHS kernels=$KERNELS jobs=$JOBS steps='$STEPS'"

if has_step cpu; then
  if [[ -f .carry/cpu/lib.tar.xz ]]; then
    OUT=$OUT bash scripts/cpu_remote.sh run > "$OUT/cpu.log" 2>&1
    note "CPU (scripts/cpu_remote.sh run):"; sed "s/^/  /" "$OUT/cpu.log" | tee -a "$SUMMARY" > /dev/null
  else
    note "CPU: skipped (no .carry/cpu; run 'bash scripts/cpu_remote.sh pack' here and carry .carry)"
  fi
  [[ " $STEPS " == " cpu " ]] && { cat "$SUMMARY"; exit 0; }
fi

# --- dependencies that a bare GPU machine may lack ------------------------------------------------------------
if [[ -z "${CUTLASS_DIR:-}" && -d .carry/cutlass/include ]]; then CUTLASS_DIR=$ROOT/.carry/cutlass/include; fi
CMAKE_EXTRA=()
[[ -n "${CUTLASS_DIR:-}" ]] && CMAKE_EXTRA+=("-DCUTLASS_DIR=$CUTLASS_DIR")
if ! ls /usr/lib/x86_64-linux-gnu/libgtest.a /usr/lib/libgtest.a /usr/local/lib/libgtest.a >/dev/null 2>&1; then
  if [[ -d .carry/googletest ]]; then  # build GoogleTest from carried sources
    cmake -S .carry/googletest -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_INSTALL_PREFIX=/tmp/gtest-install >/dev/null && ninja -C /tmp/gtest-build install >/dev/null \
      && CMAKE_EXTRA+=("-DCMAKE_PREFIX_PATH=/tmp/gtest-install") && note "GoogleTest: built from .carry/googletest"
  fi
fi

# --- build -------------------------------------------------------------------------------------------------
# The C++ build (library, C ABI, GPU tests) is skipped when only the Python package's steps run (e.g. "cp cpbench").
NEEDS_CPP=0
for s in tests parity sanitize bench profile breakdown decode pipes; do has_step $s && NEEDS_CPP=1; done
PY=${FT_PYTHON:-auto}
if [[ $PY == auto ]]; then PY=$([[ -d python && -f pyproject.toml ]] && echo 1 || echo 0); fi
[[ $PY == build ]] && NEEDS_CPP=1
PREBUILT=${FT_PREBUILT:-}
if [[ -n $PREBUILT ]]; then  # binaries built elsewhere (scripts/pack_prebuilt.sh): no build here, no package
  NEEDS_CPP=0 PY=0
  tar -xJf "$PREBUILT/prebuilt.tar.xz" -C "$PREBUILT" || { note "PREBUILT: cannot unpack $PREBUILT"; exit 1; }
  TESTBIN=$ROOT/$PREBUILT/flashtile_gpu_tests
  note "PREBUILT: $(cat "$PREBUILT/built.txt" 2>/dev/null)"
fi
if (( NEEDS_CPP )); then
t0=$(date +%s)
[[ $PY == build ]] && CMAKE_EXTRA+=("-DFLASHTILE_BUILD_PYTHON=ON" "-DPython_EXECUTABLE=$(command -v python3)")
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHTILE_WITH_CUDA=ON \
  -DFLASHTILE_CUDA_ARCHS="$ARCHS" -DFLASHTILE_CUDA_PTX=OFF -DFLASHTILE_CUDA_KERNELS="$KERNELS" \
  -DFLASHTILE_BUILD_APPS=OFF -DFLASHTILE_WERROR=OFF "${CMAKE_EXTRA[@]}" > "$OUT/build.log" 2>&1 \
  || { tail -30 "$OUT/build.log"; note "BUILD: cmake failed"; exit 1; }
TARGETS=(flashtile_capi)
[[ $PY == build ]] && TARGETS+=(_core) && { ninja -C "$BUILD" -t targets all | grep '^_torch_ext:' > /dev/null \
  && TARGETS+=(_torch_ext); }
# grep reads the whole list (grep -q stops at the match; under pipefail ninja's SIGPIPE then failed the test).
if ninja -C "$BUILD" -t targets all 2>/dev/null | grep '^flashtile_gpu_tests:' > /dev/null; then TARGETS+=(flashtile_gpu_tests); fi
ninja -C "$BUILD" -j "$JOBS" "${TARGETS[@]}" >> "$OUT/build.log" 2>&1 \
  || { grep -m20 -B2 -A5 "error" "$OUT/build.log"; note "BUILD: ninja failed"; exit 1; }
TESTBIN=$BUILD/tests/gpu/flashtile_gpu_tests
if [[ ! -x $TESTBIN ]]; then  # tests/CMakeLists.txt without add_subdirectory(gpu): link the GPU tests directly
  TESTBIN=$BUILD/flashtile_gpu_tests
  GTEST_FLAGS=$( [[ -d /tmp/gtest-install ]] && echo "-I/tmp/gtest-install/include -L/tmp/gtest-install/lib" )
  g++ -std=c++20 -O2 -Itests -Isrc -Iinclude -isystem /usr/local/cuda/include $GTEST_FLAGS \
    tests/support.cpp tests/gpu/test_gpu_*.cpp "$BUILD/src/libflashtile.a" -lgtest_main -lgtest \
    -L/usr/local/cuda/lib64 -lcudart_static -fopenmp -lpthread -ldl -lrt -o "$TESTBIN" >> "$OUT/build.log" 2>&1 \
    || { tail -20 "$OUT/build.log"; note "BUILD: GPU test link failed"; exit 1; }
fi
grep -h "spill" "$OUT/build.log" | sed "s/.*function //" | sort -u > "$BUILD/spills.txt"
note "BUILD: ok in $(( $(date +%s) - t0 )) s ($(grep -c 'Building CUDA' "$OUT/build.log") CUDA objects); spilling kernels: $(wc -l < "$BUILD/spills.txt")"; sed "s/^/  spill: /" "$BUILD/spills.txt" | tee -a "$SUMMARY"
fi

if [[ $PY == build ]]; then  # the package's sources with the modules just built: what pip would install
  rm -rf "$BUILD/pkg" && mkdir -p "$BUILD/pkg" && cp -r python/flashtile "$BUILD/pkg/" \
    && cp "$BUILD"/python/_core*.so "$BUILD/pkg/flashtile/" \
    && { cp "$BUILD"/python/_torch_ext.so "$BUILD/pkg/flashtile/" 2>/dev/null || true; }
  export PYTHONPATH=$ROOT/$BUILD/pkg${PYTHONPATH:+:$PYTHONPATH}
  ext=$(cd /tmp && python3 -c 'import flashtile; print(flashtile.torch_extension())' 2>&1 | tail -1)
  note "PYTHON: package staged from the C++ build in $BUILD/pkg (torch extension: $ext)"
  PY=1
elif [[ $PY == 1 ]]; then
  t0=$(date +%s)
  CMAKE_ARGS="-DFLASHTILE_CUDA_ARCHS=$ARCHS -DFLASHTILE_CUDA_PTX=OFF -DFLASHTILE_CUDA_KERNELS=${FT_PY_KERNELS:-$KERNELS} ${CMAKE_EXTRA[*]}" \
    python3 -m pip install -q --no-build-isolation --no-deps -Cbuild.tool-args=-j$JOBS . >> "$OUT/build.log" 2>&1 \
    && note "PYTHON: package installed in $(( $(date +%s) - t0 )) s" || note "PYTHON: pip install failed (see build.log)"
fi

CAPI=$ROOT/$BUILD/src/libflashtile_capi.so
[[ -n $PREBUILT ]] && CAPI=$ROOT/$PREBUILT/libflashtile_capi.so
export FLASHTILE_CAPI=$CAPI PYTHONUNBUFFERED=1

# --- GPU tests --------------------------------------------------------------------------------------------
if has_step tests; then  # the whole suite once per CUDA backend (tests/gpu/device.h: FT_GPU_BACKEND)
  for backend in ${FT_TEST_BACKENDS:-cuda-sm80 cuda-sm90}; do
    t0=$(date +%s)
    FT_GPU_BACKEND=$backend timeout ${FT_TEST_TIMEOUT:-300} "$TESTBIN" --gtest_brief=1 > "$OUT/tests-$backend.log" 2>&1
    rc=$?
    line=$(grep -E '^\[ +(PASSED|FAILED|SKIPPED) +\]' "$OUT/tests-$backend.log" | tr '\n' ' ')
    note "TESTS $backend: rc=$rc $line($(( $(date +%s) - t0 )) s)"
    grep -E '^\[  FAILED  \]' "$OUT/tests-$backend.log" | head -40 | tee -a "$SUMMARY"
  done
fi

if has_step pytest; then  # the Python package's tests (CPU and CUDA tensors) against the installed package
  if [[ $PY == 1 ]]; then
    t0=$(date +%s)
    (cd /tmp && timeout 300 python3 -m pytest -q -p no:cacheprovider "$ROOT/tests/python") > "$OUT/pytest.log" 2>&1
    note "PYTEST: rc=$? $(tail -1 "$OUT/pytest.log") ($(( $(date +%s) - t0 )) s)"
  else
    note "PYTEST: skipped (FT_PYTHON=0)"
  fi
fi

if has_step parity; then
  if python3 -c "import torch" 2>/dev/null; then
    timeout 180 python3 tests/gpu/test_torch_parity.py --lib "$CAPI" > "$OUT/parity.log" 2>&1
    note "PARITY (torch math SDPA, float64): rc=$? $(tail -1 "$OUT/parity.log")"
  else
    note "PARITY: skipped (torch not importable)"
  fi
fi

if has_step sanitize; then
  if command -v compute-sanitizer >/dev/null; then
    t0=$(date +%s)
    if [[ " ${FT_TEST_BACKENDS:-cuda-sm80} " == *" cuda-sm80 "* ]]; then  # cuda-sm80 and the decode kernels
      timeout 240 compute-sanitizer --tool memcheck --error-exitcode 3 "$TESTBIN" --gtest_filter='Small/*:GpuDispatch.*:*GpuSemantics*:Variants/*_d64*:Cases/GpuKvCache.*Grid*:GpuKvCacheRefusal.*:GpuKvCacheGraph.*:GpuKvCacheEdge.*' \
        --gtest_brief=1 > "$OUT/sanitizer.log" 2>&1
      note "MEMCHECK: rc=$? $(grep -m1 'ERROR SUMMARY' "$OUT/sanitizer.log") $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$OUT/sanitizer.log" | tr '\n' ' ')"
      timeout 180 compute-sanitizer --tool racecheck --error-exitcode 3 "$TESTBIN" \
        --gtest_filter='Small/*q17_k65*:Small/*q130_k130*d64*:Cases/GpuKvCache.*Grid0_*:Cases/GpuKvCache.*Grid3_*' \
        --gtest_brief=1 >> "$OUT/sanitizer.log" 2>&1
      note "RACECHECK: rc=$? $(grep 'RACECHECK SUMMARY\|ERROR SUMMARY' "$OUT/sanitizer.log" | tail -1) ($(( $(date +%s) - t0 )) s)"
    fi
    # cuda-sm90: forward, backward, the wgmma decode kernel (the KV-cache cases of more than 16 packed rows), and the
    # refusals and graphs with its dependent launch of the decode kernel behind the index check
    FT_GPU_BACKEND=cuda-sm90 timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 "$TESTBIN" \
      --gtest_filter='Small/*:GpuDispatch.*:Variants/*_d64*:Cases/GpuKvCache.*_sq16_g*:Cases/GpuKvCache.*_sq5_g*:GpuKvCacheDispatch.*:GpuKvCacheEdge.*:GpuKvCacheRefusal.*:GpuKvCacheGraph.*' \
      --gtest_brief=1 > "$OUT/sanitizer-sm90.log" 2>&1
    note "MEMCHECK cuda-sm90: rc=$? $(grep -m1 'ERROR SUMMARY' "$OUT/sanitizer-sm90.log") $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$OUT/sanitizer-sm90.log" | tr '\n' ' ')"
    FT_GPU_BACKEND=cuda-sm90 timeout 180 compute-sanitizer --tool racecheck --error-exitcode 3 "$TESTBIN" \
      --gtest_filter='Small/*q17_k65*:Small/*q130_k130*d64*:Cases/GpuKvCache.*_sq16_g8*' --gtest_brief=1 \
      >> "$OUT/sanitizer-sm90.log" 2>&1
    note "RACECHECK cuda-sm90: rc=$? $(grep 'RACECHECK SUMMARY\|ERROR SUMMARY' "$OUT/sanitizer-sm90.log" | tail -1)"
  else
    note "SANITIZER: compute-sanitizer not found"
  fi
fi

if has_step profile; then  # ncu on one shape: FlashTile's kernels next to torch flash's (FT_PROFILE_ARGS)
  if command -v ncu >/dev/null; then
    t0=$(date +%s)
    PARGS=${FT_PROFILE_ARGS:-"--hdim 128 --seqlen 4096"}
    python3 bench/gpu_profile.py --lib "$CAPI" --time $PARGS > "$OUT/profile.log" 2>&1
    timeout ${FT_PROFILE_TIMEOUT:-300} ncu --clock-control none --set full --import-source no \
      -k "regex:${FT_PROFILE_KERNELS:-fwd_kernel|bwd_kernel|flash_fwd_kernel|flash_bwd_dq_dk_dv}" -f -o /tmp/ft-prof \
      python3 bench/gpu_profile.py --lib "$CAPI" $PARGS >> "$OUT/profile.log" 2>&1
    note "PROFILE: rc=$? ($(( $(date +%s) - t0 )) s); $(grep -c TFLOP "$OUT/profile.log") timed calls"
    grep TFLOP "$OUT/profile.log" | tee -a "$SUMMARY"
    ncu --import /tmp/ft-prof.ncu-rep --page details > "$OUT/ncu_details.txt" 2>&1
    ncu --import /tmp/ft-prof.ncu-rep --page source --csv --print-source sass \
      -k "regex:${FT_PROFILE_KERNELS:-fwd_kernel|bwd_kernel|flash_bwd_dq}" > "$OUT/ncu_sass.csv" 2>&1
    python3 - "$OUT/ncu_details.txt" <<'PY' | tee -a "$SUMMARY"
import re, sys
keys = ("Duration", "Registers Per Thread", "Achieved Occupancy", "Compute (SM) Throughput", "Issue Slots Busy",
        "Local Memory Spilling Requests", "Shared Load Bank Conflicts", "Shared Store Bank Conflicts")
name = None
for line in open(sys.argv[1]):
    if re.match(r"^  \S", line) and "(" in line: name = line.strip()[:90]; print(name)
    for k in keys:
        if line.strip().startswith(k): print("   ", " ".join(line.split()))
PY
  else
    note "PROFILE: ncu not found"
  fi
fi

if has_step breakdown; then  # each call's event-timed interval split into kernel time and the rest
  t0=$(date +%s)
  timeout 300 python3 bench/gpu_profile.py --lib "$CAPI" --breakdown --json "$OUT/breakdown.json" \
    ${FT_BREAKDOWN_CELLS:+--cells "$FT_BREAKDOWN_CELLS"} > "$OUT/breakdown.log" 2>&1
  note "BREAKDOWN: rc=$? ($(( $(date +%s) - t0 )) s)"; cat "$OUT/breakdown.log" | cut -c1-200 | tee -a "$SUMMARY"
fi

if has_step variants; then  # issue 12's cells against FlexAttention and SDPA flash (needs the Python package)
  t0=$(date +%s)
  (cd /tmp && timeout ${FT_VARIANTS_TIMEOUT:-420} python3 "$ROOT/bench/gpu_variants.py" ${FT_VARIANTS_ARGS:-} \
    --json "$OUT/variants.json" --md "$OUT/variants.md") > "$OUT/variants.log" 2>&1
  note "VARIANTS: rc=$? ($(( $(date +%s) - t0 )) s)"
  [[ -f $OUT/variants.md ]] && tail -n +3 "$OUT/variants.md" | tee -a "$SUMMARY"
fi

if has_step decode; then  # issue 14's decode cells: GB/s of K+V read against torch flash, efficient and cuDNN
  t0=$(date +%s)
  timeout ${FT_DECODE_TIMEOUT:-240} python3 bench/gpu_decode.py --lib "$CAPI" --out "$OUT/gpu_decode" ${FT_DECODE_ARGS:-} \
    > "$OUT/decode.log" 2>&1
  note "DECODE: rc=$? ($(( $(date +%s) - t0 )) s)"
  [[ -f $OUT/gpu_decode.md ]] && grep '^| ' "$OUT/gpu_decode.md" | cut -d'|' -f2-10,12-16 | tee -a "$SUMMARY" > /dev/null
fi

# issue 15: context parallelism over NCCL on two GPUs, through the installed package (FT_PYTHON=1 now or in an
# earlier call on the same machine). cp: tests/gpu/cp_check.py (correctness); cpbench: bench/cp_bench.py.
cp_ready() {
  local ngpu; ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
  if (( ngpu < 2 )); then note "CP: skipped ($ngpu GPU)"; return 1; fi
  (cd /tmp && python3 -c "import flashtile.distributed" 2>/dev/null) || { note "CP: skipped (no flashtile package)"; return 1; }
}
if has_step cp && cp_ready; then
  t0=$(date +%s)
  (cd /tmp && timeout ${FT_CP_CHECK_TIMEOUT:-300} torchrun --nproc-per-node 2 "$ROOT/tests/gpu/cp_check.py") \
    > "$OUT/cp_check.log" 2>&1
  note "CP CHECK: rc=$? $(grep -h '^CP CHECK' "$OUT/cp_check.log") ($(( $(date +%s) - t0 )) s)"
  grep -h '^FAIL' "$OUT/cp_check.log" | cut -c1-200 | head -20 | tee -a "$SUMMARY"
fi
if has_step cptrace && cp_ready; then  # the ring's kernels with and without transfers (torch.profiler)
  t0=$(date +%s)
  (cd /tmp && timeout ${FT_CPTRACE_TIMEOUT:-200} torchrun --nproc-per-node 2 "$ROOT/bench/cp_trace.py" \
    ${FT_CPTRACE_ARGS:---tokens 65536} --out "$OUT/cp_trace.md") > "$OUT/cp_trace.log" 2>&1
  note "CP TRACE: rc=$? ($(( $(date +%s) - t0 )) s)"
  [[ -f $OUT/cp_trace.md ]] && grep '^| ' "$OUT/cp_trace.md" | tee -a "$SUMMARY" > /dev/null
fi
if has_step cpbench && cp_ready; then
  t0=$(date +%s)
  (cd /tmp && timeout ${FT_CP_TIMEOUT:-420} torchrun --nproc-per-node 2 "$ROOT/bench/cp_bench.py" \
    ${FT_CP_ARGS:---tokens 32768,65536,131072} --out "$OUT/h200x2-cp") > "$OUT/cp_bench.log" 2>&1
  note "CP BENCH: rc=$? ($(( $(date +%s) - t0 )) s)"
  [[ -f $OUT/h200x2-cp.md ]] && grep '^| ' "$OUT/h200x2-cp.md" | tee -a "$SUMMARY" > /dev/null
fi

if has_step pipes; then  # ncu counters of FlashTile's Hopper kernels beside cuDNN's on one shape
  t0=$(date +%s)
  for c in "" "--causal"; do
    timeout ${FT_PIPES_TIMEOUT:-150} python3 bench/ncu_pipes.py --lib "$CAPI" ${FT_PIPES_ARGS:---hdim 128 --seqlen 8192} $c \
      >> "$OUT/pipes.log" 2>&1
  done
  note "PIPES: rc=$? ($(( $(date +%s) - t0 )) s)"; cut -c1-140 "$OUT/pipes.log" | tee -a "$SUMMARY" > /dev/null
fi

if has_step bench; then
  BT=${FT_BENCH_TIMEOUT:-400}
  if (( DEADLINE > 0 )); then BT=$(( DEADLINE - ($(date +%s) - START) )); (( BT < 30 )) && BT=30; fi
  timeout $BT python3 bench/gpu_bench.py --lib "$CAPI" --json "$OUT/bench.json" --md "$OUT/bench.md" ${FT_BENCH_ARGS:-} \
    > "$OUT/bench.log" 2>&1
  note "BENCH: rc=$? (limit ${BT} s; rc 124 = cut short, the JSON holds the cells measured)"
  if [[ ! -f $OUT/bench.md && -f $OUT/bench.json ]]; then
    python3 -c "import json,sys; sys.path.insert(0,'bench'); import gpu_bench as g; d=json.load(open('$OUT/bench.json')); r=sorted(d['rows'],key=lambda r:(r['hdim'],r['seqlen'],r['causal'])); open('$OUT/bench.md','w').write(g.markdown(d['meta'],r)+'\\n')"
  fi
fi

echo
tail -n +"$SUMMARY_FROM" "$SUMMARY"
if [[ -f $OUT/bench.md ]]; then
  echo
  # the short table: FlashTile TF/s and its ratio to torch's flash backend, per cell
  python3 - "$OUT/bench.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"{'hdim':>4} {'seq':>6} {'c':>1} | {'fwd TF':>6} {'/flash':>6} {'/cudnn':>6} | {'bwd TF':>6} {'/flash':>6} {'/cudnn':>6}")
for r in d["rows"]:
    def g(k): return r.get(k)
    def ratio(a, b): return f"{g(a)/g(b):6.2f}" if g(a) and g(b) else "   n/a"
    print(f"{r['hdim']:4d} {r['seqlen']:6d} {int(r['causal']):1d} | {g('flashtile_fwd_tflops') or 0:6.0f} "
          f"{ratio('flashtile_fwd_tflops','flash_fwd_tflops')} {ratio('flashtile_fwd_tflops','cudnn_fwd_tflops')} | "
          f"{g('flashtile_bwd_tflops') or 0:6.0f} {ratio('flashtile_bwd_tflops','flash_bwd_tflops')} "
          f"{ratio('flashtile_bwd_tflops','cudnn_bwd_tflops')}")
PY
fi

# The device tool brings back at most 8 files from $OUT: all but the summary and the benchmark's table and JSON
# travel as one archive (FT_PACK=0 keeps them loose).
if [[ ${FT_PACK:-1} == 1 ]]; then
  keep=(! -path ./summary.txt ! -path ./bench.json ! -path ./bench.md ! -path ./logs.tar.gz)
  (cd "$OUT" && { [[ ! -f logs.tar.gz ]] || tar -xzf logs.tar.gz; } \
    && find . -type f "${keep[@]}" | tar -czf logs.tar.gz -T - && find . -mindepth 1 "${keep[@]}" -delete)
fi
