// CPU tile sizes, one table. Chosen so that a step's working set (Q tile, Kᵀ tile, V tile, S/P tile,
// output accumulator; all float32) stays in a 512 KiB-per-core L2 and the rows of S (block_k floats)
// are a whole number of 16-float AVX-512 / 8-float AVX2 vectors.
#pragma once

#include <cstdint>

namespace flashtile::cpu {

struct TileConfig {
  int block_q;  // query rows per tile
  int block_k;  // key rows per tile
};

// Working-set bytes of one forward step for head dims d, dv.
constexpr std::int64_t forward_working_set(TileConfig t, std::int64_t d, std::int64_t dv) {
  return 4 * (t.block_q * d + d * t.block_k + t.block_k * dv + t.block_q * t.block_k + t.block_q * dv);
}

// Measured on the 2-vCPU AMD EPYC (AVX2) dev machine, one thread, B=1 H=8 S=2048 float32 forward:
//  D <= 64 : 64 x 64  — 45 GFLOP/s; 64 x 128 gave 38, 96 x 64 gave 43.
//  D <= 128: 64 x 64  — 59 GFLOP/s, 144 KiB working set; 96 x 64 gave 47.
//  D <= 256: 32 x 64  — 160 KiB at D = 256; 64-row query tiles (288 KiB) crowd L2 next to the other thread
//            (not measured yet).
constexpr TileConfig tile_config(std::int64_t hdim) {
  if (hdim <= 64) return {64, 64};
  if (hdim <= 128) return {64, 64};
  return {32, 64};
}

// Backward tiles. A wider key tile halves how often each query tile's Q and dO are converted and how
// often the dQ accumulator is read and written, per key tile. Measured as above, 2 threads, S = 2048:
//  D <= 128: 64 x 128 — 88 GFLOP/s (1.08–1.14x standard attention); 64 x 64 gave 66 (0.82x).
//  D <= 256: 32 x 64  — as forward (not measured yet).
constexpr TileConfig backward_tile_config(std::int64_t hdim) {
  if (hdim <= 128) return {64, 128};
  return {32, 64};
}

static_assert(forward_working_set(tile_config(64), 64, 64) <= 256 * 1024);
static_assert(forward_working_set(tile_config(128), 128, 128) <= 256 * 1024);
static_assert(forward_working_set(tile_config(256), 256, 256) <= 256 * 1024);
static_assert(tile_config(64).block_k % 16 == 0 && tile_config(256).block_k % 16 == 0);

}  // namespace flashtile::cpu
