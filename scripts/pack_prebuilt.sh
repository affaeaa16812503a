#!/usr/bin/env bash
# Packs a CUDA build made here (the GPU tests and the C ABI library) for the GPU machine, whose own build of every
# kernel takes longer than one device call (scripts/gpu_check.sh with FT_PREBUILT=.carry/prebuilt runs them):
#   bash scripts/pack_prebuilt.sh BUILD_DIR   -> .carry/prebuilt/{prebuilt.tar.xz,built.txt}
# BUILD_DIR is configured as gpu_check.sh configures its own (FLASHTILE_WITH_CUDA=ON, FLASHTILE_CUDA_ARCHS=90).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:?usage: pack_prebuilt.sh BUILD_DIR}
BUILD=$(cd "$BUILD" && pwd)  # absolute: tar's second -C is taken relative to its first
DEST=.carry/prebuilt
rm -rf "$DEST" && mkdir -p "$DEST"
tar -cJf "$DEST/prebuilt.tar.xz" -C "$BUILD/tests/gpu" flashtile_gpu_tests -C "$BUILD/src" libflashtile_capi.so
echo "built on $(hostname) $(date -u +%FT%TZ) from $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo '+local changes'), kernels=$(sed -n 's/^FLASHTILE_CUDA_KERNELS:STRING=//p' "$BUILD/CMakeCache.txt")" > "$DEST/built.txt"
ls -la "$DEST"
