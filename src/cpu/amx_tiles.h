// bf16 tile products on AMX, for the bf16 forward (flash_forward_amx.cpp):
//   C[m][n] (+)= Σ_p A2(i, p) · B2(p, n)   with the pair layouts of bf16_pairs.h (A row-major bf16, B pairs
//   interleaved), float32 accumulation, m a multiple of 16 and n of 32, the sum over steps of 16 pairs (32 bf16).
// One tdpbf16ps multiplies a 16 x 32 bf16 tile by a 32 x 16 one into 16 x 16 floats: 16384 FLOP per
// instruction, against 64 for vdpbf16ps and 32 for a float32 FMA on 16 lanes.
//
// FT_AMX selects the implementation:
//   1: the AMX-TILE / AMX-BF16 instructions on the eight 16-row x 64-byte tile registers. The tile
//      configuration is per thread (configure() / release() around a thread's tile work), and Linux hands
//      out the tile state only after the process asks for it (isa.cpp, arch_prctl).
//   2: an emulation in plain C++ with the same register file and semantics (except that AMX treats bf16
//      subnormal inputs as zero), so that the test suite runs the AMX kernel's layouts, padding and masking on
//      CPUs without AMX (FLASHTILE_CPU_ISA=avx2-amxemu; never chosen automatically).
// The intrinsics take tile numbers as literal tokens, so the register map is fixed in block32 below.
#pragma once

#include "cpu/isa_namespace.h"

#include <cstdint>
#include <cstring>

#if FT_AMX == 1
#include <immintrin.h>
#define FT_TILE_LOAD(t, base, stride) _tile_loadd(t, base, stride)
#define FT_TILE_STORE(t, base, stride) _tile_stored(t, base, stride)
#define FT_TILE_ZERO(t) _tile_zero(t)
#define FT_TILE_DOT(c, a, b) _tile_dpbf16ps(c, a, b)
#elif FT_AMX == 2
#define FT_TILE_LOAD(t, base, stride) emu::load(t, base, stride)
#define FT_TILE_STORE(t, base, stride) emu::store(t, base, stride)
#define FT_TILE_ZERO(t) emu::zero(t)
#define FT_TILE_DOT(c, a, b) emu::dot(c, a, b)
#else
#error "amx_tiles.h needs FT_AMX = 1 (AMX) or 2 (emulation)"
#endif

namespace flashtile::cpu::amx {
FT_ISA_BEGIN

constexpr int kRows = 16;      // rows per tile register
constexpr int kRowBytes = 64;  // bytes per tile row: 16 floats or 16 bf16 pairs

#if FT_AMX == 1
// The ldtilecfg operand (palette 1): every register 16 rows x 64 bytes.
struct alignas(64) Palette {
  std::uint8_t palette_id = 1, start_row = 0, reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};
constexpr Palette every_tile_16x64() {
  Palette cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = kRowBytes;
    cfg.rows[t] = kRows;
  }
  return cfg;
}
// The palette is a constant in memory, not a local: GCC's _tile_loadconfig declares only the operand's first 8 bytes
// as read ("m" (*(const void**)p)), so the stores of a local palette's colsb and rows are dead to the compiler. With
// a restructured forward loop (2026-12-03, not kept) GCC 12 deleted them: ldtilecfg loaded palette 1 with every tile
// 0 x 0, and the first tilezero raised SIGILL. The kernels of this tree kept the stores only by the optimiser's choice.
inline void configure() {
  static constexpr Palette kPalette = every_tile_16x64();
  _tile_loadconfig(&kPalette);
}
inline void release() { _tile_release(); }
#else
namespace emu {
struct Registers {
  alignas(64) std::uint8_t t[8][kRows][kRowBytes];
};
inline Registers& regs() {
  static thread_local Registers r;
  return r;
}
inline void load(int t, const void* base, long stride) {
  for (int r = 0; r < kRows; ++r) std::memcpy(regs().t[t][r], static_cast<const char*>(base) + r * stride, kRowBytes);
}
inline void store(int t, void* base, long stride) {
  for (int r = 0; r < kRows; ++r) std::memcpy(static_cast<char*>(base) + r * stride, regs().t[t][r], kRowBytes);
}
inline void zero(int t) { std::memset(regs().t[t], 0, sizeof regs().t[t]); }
inline float bf16_at(const std::uint8_t* row, int i) {
  std::uint16_t bits;
  std::memcpy(&bits, row + 2 * i, 2);
  const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// C[m][n] += Σ_k A[m][2k]·B[k][2n] + A[m][2k+1]·B[k][2n+1], k < 16, in the instruction's order.
inline void dot(int c, int a, int b) {
  for (int m = 0; m < kRows; ++m) {
    float acc[16];
    std::memcpy(acc, regs().t[c][m], sizeof acc);
    for (int k = 0; k < 16; ++k)
      for (int n = 0; n < 16; ++n)
        acc[n] += bf16_at(regs().t[a][m], 2 * k) * bf16_at(regs().t[b][k], 2 * n) +
                  bf16_at(regs().t[a][m], 2 * k + 1) * bf16_at(regs().t[b][k], 2 * n + 1);
    std::memcpy(regs().t[c][m], acc, sizeof acc);
  }
}
}  // namespace emu
inline void configure() {}
inline void release() {}
#endif

// C[16·R][32] (+)= A[16·R][32·steps] · B2 over `steps` steps of 16 pairs, R = 2 row blocks (or 1, a last 16 rows);
// lda, ldb, ldc in elements (ldb between pair rows). Registers: 0-3 C (row block i, column block j in 2i + j), 4-5 A
// row blocks, 6-7 B column blocks.
template <int R>
inline void block(int steps, const std::uint16_t* a, int lda, const std::uint16_t* b, int ldb, float* c, int ldc,
                  bool accumulate) {
  static_assert(R == 1 || R == 2);
  const long sa = 2L * lda, sb = 2L * ldb, sc = 4L * ldc;
  float* c1 = c + 16L * ldc;
  if (accumulate) {
    FT_TILE_LOAD(0, c, sc);
    FT_TILE_LOAD(1, c + 16, sc);
    if constexpr (R == 2) {
      FT_TILE_LOAD(2, c1, sc);
      FT_TILE_LOAD(3, c1 + 16, sc);
    }
  } else {
    FT_TILE_ZERO(0);
    FT_TILE_ZERO(1);
    if constexpr (R == 2) {
      FT_TILE_ZERO(2);
      FT_TILE_ZERO(3);
    }
  }
  for (int s = 0; s < steps; ++s) {
    const std::uint16_t* as = a + 32 * s;
    const std::uint16_t* bs = b + 16L * s * ldb;
    FT_TILE_LOAD(4, as, sa);
    if constexpr (R == 2) FT_TILE_LOAD(5, as + 16L * lda, sa);
    FT_TILE_LOAD(6, bs, sb);
    FT_TILE_LOAD(7, bs + 32, sb);
    FT_TILE_DOT(0, 4, 6);
    FT_TILE_DOT(1, 4, 7);
    if constexpr (R == 2) {
      FT_TILE_DOT(2, 5, 6);
      FT_TILE_DOT(3, 5, 7);
    }
  }
  FT_TILE_STORE(0, c, sc);
  FT_TILE_STORE(1, c + 16, sc);
  if constexpr (R == 2) {
    FT_TILE_STORE(2, c1, sc);
    FT_TILE_STORE(3, c1 + 16, sc);
  }
}

// C[m][n] (+)= A2 · B2 over `steps` steps of 16 pairs; m a multiple of 16, n of 32.
inline void gemm(int m, int n, int steps, const std::uint16_t* a, int lda, const std::uint16_t* b, int ldb, float* c,
                 int ldc, bool accumulate) {
  for (int i0 = 0; i0 < m; i0 += 32)
    for (int j0 = 0; j0 < n; j0 += 32) {
      const std::uint16_t* ai = a + static_cast<long>(i0) * lda;
      float* ci = c + static_cast<long>(i0) * ldc + j0;
      if (m - i0 >= 32) {
        block<2>(steps, ai, lda, b + 2 * j0, ldb, ci, ldc, accumulate);
      } else {
        block<1>(steps, ai, lda, b + 2 * j0, ldb, ci, ldc, accumulate);
      }
    }
}

FT_ISA_END
}  // namespace flashtile::cpu::amx
