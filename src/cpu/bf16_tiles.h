// The bf16 tile products of the kernel sets that have them, behind one interface (FT_BF16_TILES is defined where they
// exist): C[m][n] (+)= A2 · B2 over `steps` steps of 16 pairs, m and n multiples of 32, in the layouts of
// bf16_pairs.h (A row-major bf16, B as pairs along the summed dimension), which amx_tiles.h shares:
//   FT_AMX sets:        tdpbf16ps on AMX tiles (1) or its emulation (2), amx_tiles.h;
//   FT_BF16_PAIRS sets: vdpbf16ps (1) or its emulation on FMAs (2), bf16_pairs.h's register blocks.
// begin / end bracket a thread's tile work (AMX's tile configuration; nothing for the pairs). The bf16 backward
// (flash_backward.cpp key_tile_bf16) runs its five products on it.
#pragma once

#include "cpu/isa_namespace.h"

#include <cstdint>

#if defined(FT_AMX)
#include "cpu/amx_tiles.h"
#define FT_BF16_TILES 1
#elif defined(FT_BF16_PAIRS)
#include "cpu/bf16_pairs.h"
#define FT_BF16_TILES 1
#endif

#ifdef FT_BF16_TILES
namespace flashtile::cpu::tiles {
FT_ISA_BEGIN

// The row granularity of a decode head's rows in gemm's m (flash_decode.cpp block_rows_bf16): one tile's 16 rows
// (amx::gemm's block<1> takes a last 16), as the pairs' register block, which takes any m, and the softmax's row
// groups. It was 32, AMX's 2 x 2 block, which ran a head of 16 rows (Sq = 4 at GQA 4) on 32.
constexpr int kRowStep = 16;

#if defined(FT_AMX)
inline void begin() { amx::configure(); }
inline void end() { amx::release(); }
inline void gemm(int m, int n, int steps, const std::uint16_t* a, int lda, const std::uint16_t* b, int ldb, float* c,
                 int ldc, bool accumulate) {
  amx::gemm(m, n, steps, a, lda, b, ldb, c, ldc, accumulate);
}
#else
inline void begin() {}
inline void end() {}
inline void gemm(int m, int n, int steps, const std::uint16_t* a, int lda, const std::uint16_t* b, int ldb, float* c,
                 int ldc, bool accumulate) {
  bf16::gemm(m, n, 16 * steps, a, lda, b, ldb, c, ldc, accumulate);
}
#endif

FT_ISA_END
}  // namespace flashtile::cpu::tiles
#endif
