#!/usr/bin/env bash
# Seed sweep: runs the CPU test binary once per (ISA path, seed) and records, per path, the runs, the
# failed runs, and every failing test with the line that replays it. Finds tests whose pass depends on
# the random data (issue 11, item 3).
#
#   scripts/seed_sweep.sh TEST_BINARY SEEDS FIRST_SEED JOBS [OUT_DIR]
#   scripts/seed_sweep.sh --summary OUT_DIR        (re-summarises a sweep, e.g. one stopped early)
#
# Seeds FIRST_SEED .. FIRST_SEED + SEEDS - 1 on every ISA path the binary reports as runnable on this CPU
# (the IsaPaths.Listed test prints them; FLASHTILE_SWEEP_PATHS="a b" restricts the list). Runs go
# JOBS at a time (xargs -P), each on one thread (OMP_NUM_THREADS=1). Each finished run appends
# "path seed rc" to OUT_DIR/runs.txt and keeps its log in OUT_DIR/logs/ only if it failed; the
# summary (OUT_DIR/summary.md, also printed) counts finished runs only, so a sweep stopped early
# reports exactly what ran. Exit status: 0 when every finished run passed.
set -euo pipefail

summarise() {
  local out=$1
  local runs=$out/runs.txt
  [ -f "$runs" ] || { echo "seed_sweep: no $runs" >&2; return 2; }
  {
    echo "| path | runs | failed runs | seeds |"
    echo "|---|---|---|---|"
    for path in $(cat "$out/paths.txt"); do
      local n f lo hi
      n=$(awk -v p="$path" '$1 == p' "$runs" | wc -l)
      f=$(awk -v p="$path" '$1 == p && $3 != 0' "$runs" | wc -l)
      lo=$(awk -v p="$path" '$1 == p {print $2}' "$runs" | sort -n | head -1)
      hi=$(awk -v p="$path" '$1 == p {print $2}' "$runs" | sort -n | tail -1)
      echo "| $path | $n | $f | ${lo:-none}..${hi:-none} |"
    done
    echo
    local bin
    bin=$(cat "$out/binary.txt")
    local any=0
    while read -r path seed rc; do
      [ "$rc" = 0 ] && continue
      any=1
      local log=$out/logs/$path.$seed.log
      local tests
      tests=$(grep -E '^\[  FAILED  \] [A-Za-z]' "$log" 2>/dev/null |
                sed -E 's/^\[  FAILED  \] //; s/, where GetParam.*//; s/ \([0-9]+ ms\)$//' | sort -u || true)
      if [ -z "$tests" ]; then
        echo "- $path seed $seed: exit status $rc, no failed test named (crash?); log $log"
        echo "  replay: \`FLASHTILE_CPU_ISA=$path FLASHTILE_TEST_SEED=$seed OMP_NUM_THREADS=1 $bin\`"
        continue
      fi
      for t in $tests; do
        echo "- $path seed $seed: $t"
        echo "  replay: \`FLASHTILE_CPU_ISA=$path FLASHTILE_TEST_SEED=$seed OMP_NUM_THREADS=1 $bin --gtest_filter='$t'\`"
      done
    done < "$runs"
    [ "$any" = 1 ] || echo "No failures."
  } | tee "$out/summary.md"
  awk '$3 != 0 {exit 1}' "$runs"  # the status: 0 when every finished run passed
}

if [ "${1:-}" = "--summary" ]; then
  summarise "${2:?usage: seed_sweep.sh --summary OUT_DIR}"
  exit
fi

# One run, called by xargs: path seed.
if [ "${1:-}" = "--one" ]; then
  bin=$2 out=$3 path=$4 seed=$5
  log=$out/logs/$path.$seed.log
  rc=0
  OMP_NUM_THREADS=1 FLASHTILE_CPU_ISA=$path FLASHTILE_TEST_SEED=$seed "$bin" --gtest_brief=1 >"$log" 2>&1 || rc=$?
  [ "$rc" = 0 ] && rm -f "$log"
  echo "$path $seed $rc" >>"$out/runs.txt"
  exit 0
fi

if [ $# -lt 4 ]; then
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
bin=$(realpath "$1")
seeds=$2 first=$3 jobs=$4
out=${5:-seed_sweep.$(date -u +%Y%m%dT%H%M%S)}
[ -x "$bin" ] || { echo "seed_sweep: $bin is not an executable" >&2; exit 2; }
[[ "$seeds" =~ ^[0-9]+$ && "$first" =~ ^[0-9]+$ && "$jobs" =~ ^[0-9]+$ ]] ||
  { echo "seed_sweep: SEEDS, FIRST_SEED and JOBS must be non-negative integers" >&2; exit 2; }

paths=${FLASHTILE_SWEEP_PATHS:-$("$bin" --gtest_filter=IsaPaths.Listed |
                                 sed -n 's/^\[flashtile\] cpu isa paths runnable here: //p')}
[ -n "$paths" ] || { echo "seed_sweep: the binary reported no runnable ISA path" >&2; exit 2; }
mkdir -p "$out/logs"
: >"$out/runs.txt"
echo "$paths" >"$out/paths.txt"
echo "$bin" >"$out/binary.txt"
echo "seed sweep: $seeds seeds from $first on paths: $paths; $jobs at a time; output in $out" >&2
for ((i = 0; i < seeds; ++i)); do
  for path in $paths; do echo "$path $((first + i))"; done
done | xargs -P "$jobs" -n 2 "$0" --one "$bin" "$out"
summarise "$out"
