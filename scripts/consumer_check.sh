#!/usr/bin/env bash
# Installs a FlashTile build into a temporary prefix (`cmake --install`) and builds tests/consumer against
# it, once per exported target (flashtile::flashtile_static, flashtile::flashtile_shared, flashtile::flashtile),
# and runs each. Also checks the CUDA component: find_package(flashtile COMPONENTS CUDA) must succeed when
# the build has CUDA and fail, with its message, when it has not.
#   bash scripts/consumer_check.sh <build dir>      (scripts/test.sh passes build/ci)
set -euo pipefail  # (pipes into grep read to the end: grep -q would SIGPIPE the writer)
cd "$(dirname "$0")/.."
build=${1:?usage: consumer_check.sh <build dir>}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/flashtile-consumer.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
fail() { echo "consumer_check.sh: FAIL: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install"; }
cfg=$(find "$prefix" -name flashtileConfig.cmake -print -quit)
[ -n "$cfg" ] || fail "cmake --install did not install flashtileConfig.cmake"
libdir=${cfg#"$prefix/"}
libdir=${libdir%/cmake/flashtile/flashtileConfig.cmake}  # lib, lib64, ... (GNUInstallDirs)
for f in include/flashtile/flashtile.h include/flashtile/capi.h "$libdir/libflashtile.a" "$libdir/libflashtile.so" \
         "$libdir/libflashtile_capi.so" "$libdir/cmake/flashtile/flashtileConfig.cmake" \
         "$libdir/cmake/flashtile/flashtileConfigVersion.cmake" "$libdir/cmake/flashtile/flashtileTargets.cmake"; do
  [ -e "$prefix/$f" ] || fail "cmake --install did not install $f"
done
if [ -x "$build/apps/flashtile/flashtile" ]; then
  [ -x "$prefix/bin/flashtile" ] || fail "cmake --install did not install bin/flashtile"
  "$prefix/bin/flashtile" info --isa-paths >/dev/null || fail "the installed CLI does not run"
fi
echo "installed into a temporary prefix: headers, libflashtile.a, libflashtile.so, libflashtile_capi.so, CLI, CMake package"

for target in flashtile_static flashtile_shared flashtile; do
  dir=$tmp/consumer-$target
  cmake -S tests/consumer -B "$dir" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" -DFLASHTILE_TARGET="$target" \
    >"$dir.log" 2>&1 || { cat "$dir.log"; fail "configure against flashtile::$target"; }
  cmake --build "$dir" >>"$dir.log" 2>&1 || { cat "$dir.log"; fail "build against flashtile::$target"; }
  # The shared target must load the installed libflashtile.so; the static ones must not need it.
  if ldd "$dir/consumer" | grep 'libflashtile\.so' >/dev/null; then linked=shared; else linked=static; fi
  want=static; [ "$target" = flashtile_shared ] && want=shared
  [ "$linked" = "$want" ] || fail "flashtile::$target gave a $linked link, expected $want"
  echo "--- flashtile::$target ($linked library)"
  "$dir/consumer" || fail "the consumer built against flashtile::$target"
done

# Whether the build has CUDA, from the installed library itself (not from the package config under test).
with_cuda=OFF
if nm -C --defined-only "$prefix/$libdir/libflashtile.a" 2>/dev/null | grep 'register_cuda_backends' >/dev/null; then
  with_cuda=ON
fi
dir=$tmp/consumer-cuda
if cmake -S tests/consumer -B "$dir" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" -DFLASHTILE_WANT_CUDA=ON >"$dir.log" 2>&1; then
  [ "$with_cuda" = ON ] || { cat "$dir.log"; fail "COMPONENTS CUDA was found in a build without CUDA"; }
  echo "find_package(flashtile COMPONENTS CUDA): found (the build has CUDA)"
else
  [ "$with_cuda" = OFF ] || { cat "$dir.log"; fail "COMPONENTS CUDA not found in a build with CUDA"; }
  tr -s ' \n' '  ' <"$dir.log" | grep "built without its CUDA backend" >/dev/null || { cat "$dir.log"; fail "no clear message for COMPONENTS CUDA"; }
  echo "find_package(flashtile COMPONENTS CUDA): refused with a message (the build has no CUDA)"
fi
echo "consumer_check.sh: PASS"
