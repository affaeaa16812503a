#!/usr/bin/env bash
# CPU checks on another x86-64 machine (the GPU machine's host CPU has AVX-512 and avx512_bf16, this
# development VM has AVX2 only), from binaries built here and carried there: the GPU machine has no OpenBLAS
# and reaches no package registry.
#
#   here:  bash scripts/cpu_remote.sh pack          # build/cpu -> .carry/cpu (binaries + OpenBLAS runtime)
#   there: bash scripts/cpu_remote.sh run           # tests on every runnable ISA path, then the benchmark
#
# `run` forces each kernel set the CPU executes (FLASHTILE_CPU_ISA) through the whole CPU test suite, then runs
# bench/cpu_matrix.py once per count in FT_CPU_CORES (default "2"), that many threads pinned to as many CPUs on
# different physical cores (FT_CPU_BENCH_ARGS, default "--bf16"; FT_CPU_BENCH=0 skips it; FT_CPU_TESTS=0 skips
# the tests; the suite runs as dispatched and under FLASHTILE_CPU_FORWARD=tiles and =decode, FT_CPU_FORWARDS picks;
# FT_CPU_SMALLSQ=1 adds bench/cpu_small_sq.py, FT_CPU_SMALLSQ_ARGS its arguments; FT_CPU_SCALING=1 adds
# bench/cpu_scaling.py for each count in FT_CPU_CORES, FT_CPU_SCALING_ARGS its arguments). Logs and the table go to
# $OUT/cpu. The benchmark times FlashTile beside torch's SDPA in one Python process (the GPU machine's own torch,
# FT_CPU_PYTHON, default python3), through the C ABI library that `pack` links here (libflashtile_capi_cpu.so).
# What a device call must carry: .carry/cpu (about 6 MiB: binaries, the C ABI library, OpenBLAS compressed).
set -uo pipefail
cd "$(dirname "$0")/.."
CARRY=.carry/cpu

pack() {
  cmake --build build/cpu -j"$(nproc)" --target flashtile_cli flashtile_tests flashtile_fma_peak || exit 1
  rm -rf "$CARRY" && mkdir -p "$CARRY/apps/flashtile" "$CARRY/tests" "$CARRY/bench" "$CARRY/lib"
  cp build/cpu/apps/flashtile/flashtile "$CARRY/apps/flashtile/"
  cp build/cpu/tests/flashtile_tests "$CARRY/tests/"
  cp build/cpu/bench/flashtile_fma_peak "$CARRY/bench/"
  # The C ABI library for the benchmark's in-process timing next to torch (linked from build/cpu's static library
  # by bench/cpu_matrix.py, the one place that knows how).
  local capi
  capi=$(python3 -c "import sys; sys.path.insert(0, 'bench'); import cpu_matrix; print(cpu_matrix.find_capi('build/cpu'))") \
    || exit 1
  cp "$capi" "$CARRY/libflashtile_capi_cpu.so"
  # The CLI's runtime libraries that a bare Ubuntu image lacks (OpenBLAS and its Fortran runtime), compressed.
  ldd build/cpu/apps/flashtile/flashtile | awk '/openblas|gfortran|quadmath/ {print $3}' |
    xargs -I{} cp -L {} "$CARRY/lib/"
  tar -C "$CARRY" -cJf "$CARRY/lib.tar.xz" lib && rm -rf "$CARRY/lib"
  du -sh "$CARRY"
}

# n CPUs on different physical cores (the first CPU of each core, in CPU order), comma-separated.
distinct_cores() {
  lscpu -p=CPU,CORE | awk -F, -v n="$1" '!/^#/ && !seen[$2]++ && k < n {printf "%s%s", (k++ ? "," : ""), $1}'
}

run() {
  local out=${OUT:-$PWD/cpu-remote-out}/cpu
  mkdir -p "$out" "$CARRY/lib"
  tar -C "$CARRY" -xJf "$CARRY/lib.tar.xz"  # (lib/ is git-ignored; pack removes it so the carry stays small)
  export LD_LIBRARY_PATH=$PWD/$CARRY/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  local summary=$out/summary.txt
  { lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|L1d|L2|L3"; grep -o -w 'avx512[a-z0-9_]*\|amx[a-z0-9_]*' /proc/cpuinfo | sort -u | tr '\n' ' '; echo; } > "$summary"
  local isas
  isas=$("$CARRY/apps/flashtile/flashtile" info 2>&1 | tee "$out/info.txt" | sed -n "s/.*isa paths runnable here: //p")
  echo "runnable: ${isas:-?}" >> "$summary"
  grep "BLAS" "$out/info.txt" >> "$summary"
  [[ ${FT_CPU_TESTS:-1} == 1 ]] || isas=""
  for isa in ${FT_CPU_ISAS:-$isas}; do
    for fwd in ${FT_CPU_FORWARDS:-auto tiles decode}; do  # as scripts/test.sh: each forward kernel on every case
      local t0=$(date +%s) log="$out/tests-$isa-$fwd.log"
      FLASHTILE_CPU_ISA=$isa FLASHTILE_CPU_FORWARD=${fwd#auto} timeout 300 "$CARRY/tests/flashtile_tests" \
        --gtest_brief=1 --gtest_filter="${FT_CPU_FILTER:-*}" > "$log" 2>&1
      echo "TESTS $isa $fwd: rc=$? $(grep -E '^\[ +(PASSED|FAILED|SKIPPED) +\]' "$log" | tr '\n' ' ')($(( $(date +%s) - t0 )) s)" >> "$summary"
      grep -E '^\[  FAILED  \]' "$log" | head -20 >> "$summary"
    done
  done
  if [[ ${FT_CPU_BENCH:-1} == 1 ]]; then
    rm -rf build/cpu-remote && mkdir -p build/cpu-remote && cp -r "$CARRY/apps" "$CARRY/bench" build/cpu-remote/
    for n in ${FT_CPU_CORES:-2}; do  # one run per core count, as many threads, pinned to that many physical cores
      local cpus t0=$(date +%s)
      cpus=$(distinct_cores "$n")
      timeout "${FT_CPU_BENCH_TIMEOUT:-400}" taskset -c "$cpus" "${FT_CPU_PYTHON:-python3}" bench/cpu_matrix.py \
        --build build/cpu-remote --capi "$PWD/$CARRY/libflashtile_capi_cpu.so" --out "$out" \
        --name "cpu_xeon_torch_${n}c" --threads "$n" ${FT_CPU_BENCH_ARGS:---bf16} > "$out/bench-${n}c.log" 2>&1
      echo "BENCH ${n} cores: rc=$? on CPUs $cpus ($(( $(date +%s) - t0 )) s)" >> "$summary"
    done
  fi
  if [[ ${FT_CPU_SMALLSQ:-0} == 1 ]]; then  # bench/cpu_small_sq.py, pinned to FT_CPU_CORES' first count
    local cores=${FT_CPU_CORES:-2} cpus t0=$(date +%s)
    local n=${cores%% *}
    n=${n:-2}
    cpus=$(distinct_cores "$n")
    OMP_NUM_THREADS=$n timeout "${FT_CPU_BENCH_TIMEOUT:-400}" taskset -c "$cpus" "${FT_CPU_PYTHON:-python3}" \
      bench/cpu_small_sq.py --lib "$PWD/$CARRY/libflashtile_capi_cpu.so" ${FT_CPU_SMALLSQ_ARGS:-} \
      --out "$out/cpu_small_sq_${n}c" > "$out/small-sq-${n}c.log" 2>&1
    echo "SMALL-SQ ${n} cores: rc=$? on CPUs $cpus ($(( $(date +%s) - t0 )) s)" >> "$summary"
  fi
  if [[ ${FT_CPU_SCALING:-0} == 1 ]]; then  # bench/cpu_scaling.py: one core alone, loaded, and T cores together
    local t0=$(date +%s) n
    for n in ${FT_CPU_CORES:-8}; do
      timeout "${FT_CPU_BENCH_TIMEOUT:-400}" "${FT_CPU_PYTHON:-python3}" bench/cpu_scaling.py \
        --capi "$PWD/$CARRY/libflashtile_capi_cpu.so" --cores "$n" ${FT_CPU_SCALING_ARGS:-} \
        --json "$out/cpu_scaling_${n}c.json" > "$out/scaling-${n}c.log" 2>&1
      echo "SCALING ${n} cores: rc=$? ($(( $(date +%s) - t0 )) s)" >> "$summary"
      sed -n '/^GFLOP/,$p' "$out/scaling-${n}c.log" >> "$summary"
    done
  fi
  cat "$summary"
}

case "${1:-}" in
  pack) pack ;;
  run) run ;;
  *) echo "usage: $0 pack|run" >&2; exit 2 ;;
esac
