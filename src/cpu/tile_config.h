// CPU tile sizes, one table. Chosen so that a step's working set (Q tile, Kᵀ tile, V tile, S/P tile,
// output accumulator; all float32) stays in a 512 KiB-per-core L2 and the rows of S (block_k floats)
// are a whole number of 16-float AVX-512 / 8-float AVX2 vectors.
#pragma once

#include <cstdint>

namespace flashtile::cpu {

struct TileConfig {
  int block_q;  // query rows per tile
  int block_k;  // key rows per tile
  int group_q = 1;  // query tiles that share each pass over a key tile (the float32 forward; flash_forward.cpp)
};

// Working-set bytes of one forward step for head dims d, dv (a group's Q rows and output rows).
constexpr std::int64_t forward_working_set(TileConfig t, std::int64_t d, std::int64_t dv) {
  const std::int64_t group_rows = std::int64_t{t.group_q} * t.block_q;
  return 4 * (group_rows * d + d * t.block_k + t.block_k * dv + t.block_q * t.block_k + group_rows * dv);
}

// Measured on the 2-vCPU AMD EPYC (AVX2) dev machine, one thread, B=1 H=8 S=2048 float32 forward:
//  D <= 64 : 64 x 64  — 45 GFLOP/s; 64 x 128 gave 38, 96 x 64 gave 43.
//  D <= 128: 64 x 64  — 59 GFLOP/s, 144 KiB working set; 96 x 64 gave 47.
//  D <= 256: 32 x 64  — 160 KiB at D = 256; 64-row query tiles (288 KiB) crowd L2 next to the other thread
//            (not measured yet).
// Those figures predate the register-blocked products (microkernel.h). Re-measured with them on 2026-12-05, the
// avx2 set on the AVX-512 EPYC (Zen 5 class; the AVX2 machine was not available), 2 threads, one process, two A/B
// runs of bench/cpu_ab.py against 64 x 64, S = 2048-8192, full and causal: D <= 64 64 x 128 1.02-1.04x (the
// per-row costs of the softmax and the output rescale spread over twice the keys); D = 128 64 x 128 0.98-1.02x,
// groups of 4 query tiles 0.96-0.99x, both with 64 x 128 0.98-1.00x.
constexpr TileConfig tile_config(std::int64_t hdim) {
  if (hdim <= 64) return {64, 128};
  if (hdim <= 128) return {64, 64};
  return {32, 64};
}

// Forward tiles of the AVX-512 float32 kernels (the float32 products on 6 x 4 register blocks, microkernel.h; also
// float16 and bf16 inputs run there on converted tiles). Measured on the 2-core AMX Xeon VM, 2 threads, B=1 H=8
// float32 forward, S = 2048 / 4096, full and causal, A/B in one process (bench/cpu_ab.py) against 64 x 64:
//  D <= 64 : 64 x 128 — 1.08-1.12x, and 1.00-1.10x in a second run at S = 2048 / 8192 (96 x 64: 1.00-1.02x).
//  D <= 128: 64 x 64 as tile_config — 64 x 128 measured 0.93-0.98x, 96 x 64 0.97-1.01x.
// Groups of 4 query tiles per pass over a key tile (2026-12-03, same machine and method, S = 2048 / 8192, D = 64 /
// 128, full and causal; against groups of 1, all without prefetch): groups of 2 0.99-1.05x, of 4 1.00-1.07x, the
// gain growing with S (the head's K/V cache, 2-8 MiB per thread, read from L3 a quarter as often). One 256-row
// tile instead ran 0.93-0.97x at S = 2048 causal: its diagonal tiles computed 4x the masked entries. With the
// groups, 64 x 128 tiles at D = 128 ran 0.97-1.00x (S = 2048-8192).
constexpr TileConfig avx512_tile_config(std::int64_t hdim) {
  if (hdim <= 64) return {64, 128, 4};
  if (hdim <= 128) return {64, 64, 4};
  return tile_config(hdim);
}

// Forward tiles of the AMX bf16 kernel (flash_forward_amx.cpp), whose products run at up to ~1000 GFLOP/s
// per core (bench/fma_peak.cpp, Sapphire Rapids-class Xeon), so the per-row softmax work sets the pace and a
// wider key tile spreads each row's fixed cost (max, sums, output-row rescale) over more keys. Blocks are
// 32 x 32, so both sizes are multiples of 32. Measured there, 2 threads, B=1 H=8 S=4096 bf16 forward, time
// per call in three runs against 64 x 64 (the host's timings vary by ±20 % between runs):
//  D <= 64 : 64 x 256 — full 436 vs 389 GFLOP/s, 0.092 vs 0.109 s, 0.100 vs 0.086 s; causal 422 vs 265
//            GFLOP/s, 0.048 vs 0.048 s, 0.042 vs 0.065 s.
//  D <= 128: 64 x 128 — full 456 vs 434 GFLOP/s, 0.146 vs 0.231 s, 0.117 vs 0.179 s; causal 512 vs 501
//            GFLOP/s, 0.062 vs 0.092 s, 0.082 vs 0.087 s (128 x 128 was close: 0.146, 0.120 s full).
//  D <= 256: as tile_config (not measured).
// Re-measured on the 2-core Xeon of 2026-12-02 (AMX peak 3.8 TFLOP/s per core there), B=1 H=8 D=128 bf16,
// 2 threads, one process, against 64 x 128 (GFLOP/s): S=2048 full 873 vs 834, causal 775 vs 728; S=4096 full
// 842 vs 825, causal 860 vs 804; S=512 causal 580 vs 511 (64 x 512: 963, 825, 827, 871, 526). So D <= 128
// takes 64 x 256 too.
// Groups of 4 query tiles per pass over a key tile (2026-12-03, 2-core AMX Xeon VM, 2 threads, one process,
// S = 2048 / 8192, D = 64 / 128, full and causal, against groups of 1): 1.01-1.21x, the most at S = 8192 (the
// head's bf16 K/V, 4 MiB per thread at D = 128, read from L3 a quarter as often); groups of 2: 0.96-1.14x.
// Re-measured 2026-12-05 on the 2-core AMX Xeon VM (CLI bench, B=1 H=8 D=128 bf16, S = 2048 / 8192, full and causal,
// builds interleaved over two rounds), GFLOP/s against 64 x 256 x 4: 64 x 128 x 4 0.92-1.00x, 32 x 256 x 8
// 0.87-1.05x, 128 x 256 x 2 0.97-1.09x, all within the rounds' spread; kept. (What bounds the products:
// bench/results/cpu.md, the AMX products' ceilings.)
constexpr TileConfig amx_tile_config(std::int64_t hdim) {
  if (hdim <= 128) return {64, 256, 4};
  return tile_config(hdim);
}

// Backward tiles. A wider key tile halves how often each query tile's Q and dO are converted and how
// often the dQ accumulator is read and written, per key tile. Measured as above, 2 threads, S = 2048:
//  D <= 128: 64 x 128 — 88 GFLOP/s (1.08–1.14x standard attention); 64 x 64 gave 66 (0.82x). On the 2-core
//            AMX Xeon (2026-12-03, float32, S = 2048 / 8192, D = 64 / 128, one process) 64 x 256 ran 0.95-1.07x.
//  D <= 256: 32 x 64  — as forward (not measured yet).
constexpr TileConfig backward_tile_config(std::int64_t hdim) {
  if (hdim <= 128) return {64, 128};
  return {32, 64};
}

static_assert(forward_working_set(tile_config(64), 64, 64) <= 256 * 1024);
static_assert(forward_working_set(tile_config(128), 128, 128) <= 256 * 1024);
// AVX-512 CPUs have L2s of 1-2 MiB per core (Zen 4, Sapphire Rapids).
static_assert(forward_working_set(avx512_tile_config(64), 64, 64) <= 512 * 1024 &&
              forward_working_set(avx512_tile_config(128), 128, 128) <= 512 * 1024 &&
              avx512_tile_config(64).block_k % 16 == 0);
static_assert(forward_working_set(tile_config(256), 256, 256) <= 256 * 1024);
static_assert(tile_config(64).block_k % 16 == 0 && tile_config(256).block_k % 16 == 0);
static_assert(forward_working_set(amx_tile_config(128), 128, 128) <= 1024 * 1024);  // float32 bound; bf16 is less
static_assert(amx_tile_config(64).block_q % 32 == 0 && amx_tile_config(64).block_k % 32 == 0 &&
              amx_tile_config(128).block_q % 32 == 0 && amx_tile_config(128).block_k % 32 == 0 &&
              amx_tile_config(256).block_q % 32 == 0 && amx_tile_config(256).block_k % 32 == 0);

}  // namespace flashtile::cpu
