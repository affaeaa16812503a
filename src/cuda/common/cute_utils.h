// Small CuTe helpers shared by the sm80 kernels: accumulator layout views, register-fed GEMM loops,
// predicated global<->shared copies and the few instructions CuTe does not wrap (ex2.approx).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/numeric_types.h>

namespace flashtile::cuda {

using namespace cute;

// 2^x on the special-function unit (ex2.approx.ftz); ex2(-inf) = +0.
CUTE_DEVICE float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 1/x on the special-function unit (rcp.approx.ftz, about 1 ulp); rcp(+inf) = +0. An IEEE reciprocal
// (__frcp_rn) is a multi-instruction sequence with a slow path.
CUTE_DEVICE float rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The m16n8 accumulator (4, MMA_M, MMA_N) viewed as (rows, cols) = ((2, MMA_M), (2, MMA_N)): each
// thread holds two rows (lane/4 and lane/4 + 8) and two adjacent columns per 8-column atom.
template <class L>
CUTE_HOST_DEVICE constexpr auto acc_rowcol(L const& l) {
  static_assert(decltype(rank(l))::value == 3);
  static_assert(decltype(size<0>(l))::value == 4);
  auto d = logical_divide(l, Shape<_2>{});  // ((2, 2), MMA_M, MMA_N)
  return make_layout(make_layout(get<0, 1>(d), get<1>(d)), make_layout(get<0, 0>(d), get<2>(d)));
}

// The same accumulator as the A operand of the next m16n8k16 MMA: ((4, 2), MMA_M, MMA_N / 2). Two adjacent
// 8-column accumulator atoms hold exactly the 16-wide k slice the A fragment wants (P stays in registers).
template <class L>
CUTE_HOST_DEVICE constexpr auto acc_as_a(L const& l) {
  static_assert(decltype(size<0>(l))::value == 4);
  static_assert(decltype(size<2>(l))::value % 2 == 0);
  auto d = logical_divide(l, Shape<Underscore, Underscore, _2>{});  // (4, MMA_M, (2, MMA_N / 2))
  return make_layout(make_layout(get<0>(d), get<2, 0>(d)), get<1>(d), get<2, 1>(d));
}

// fp32 register tensor -> a register tensor of To with the same layout (paired conversions).
template <class To, class Engine, class Layout>
CUTE_DEVICE auto convert_to(Tensor<Engine, Layout> const& t) {
  constexpr int N = decltype(size(t))::value;
  static_assert(N % 2 == 0);
  Tensor out = make_tensor<To>(t.layout());
  cutlass::NumericArrayConverter<To, float, 2> conv;
  CUTE_UNROLL
  for (int i = 0; i < N; i += 2) {
    cutlass::Array<float, 2> in;
    in[0] = t(i);
    in[1] = t(i + 1);
    cutlass::Array<To, 2> o = conv(in);
    out(i) = o[0];
    out(i + 1) = o[1];
  }
  return out;
}

// acc += A * B with both operands read from shared memory slice by slice along k (next slice loaded
// while the current one multiplies).
template <class Acc, class RA, class RB, class SA, class SB, class Mma, class CopyA, class CopyB>
CUTE_DEVICE void gemm_ss(Acc& acc, RA& tCrA, RB& tCrB, SA const& tCsA, SB const& tCsB, Mma const& mma,
                         CopyA const& copy_a, CopyB const& copy_b, int tidx) {
  auto thr_a = copy_a.get_thread_slice(tidx);
  auto thr_b = copy_b.get_thread_slice(tidx);
  Tensor tCrA_v = thr_a.retile_D(tCrA);
  Tensor tCrB_v = thr_b.retile_D(tCrB);
  static_assert(decltype(size<2>(tCrA))::value == decltype(size<2>(tCrB))::value);
  copy(copy_a, tCsA(_, _, _0{}), tCrA_v(_, _, _0{}));
  copy(copy_b, tCsB(_, _, _0{}), tCrB_v(_, _, _0{}));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(tCrA); ++k) {
    if (k < size<2>(tCrA) - 1) {
      copy(copy_a, tCsA(_, _, k + 1), tCrA_v(_, _, k + 1));
      copy(copy_b, tCsB(_, _, k + 1), tCrB_v(_, _, k + 1));
    }
    cute::gemm(mma, tCrA(_, _, k), tCrB(_, _, k), acc);
  }
}

// acc += A * B with A already in registers (P in the forward pass).
template <class Acc, class RA, class RB, class SB, class Mma, class CopyB>
CUTE_DEVICE void gemm_rs(Acc& acc, RA const& tCrA, RB& tCrB, SB const& tCsB, Mma const& mma, CopyB const& copy_b,
                         int tidx) {
  auto thr_b = copy_b.get_thread_slice(tidx);
  Tensor tCrB_v = thr_b.retile_D(tCrB);
  static_assert(decltype(size<2>(tCrA))::value == decltype(size<2>(tCrB))::value);
  copy(copy_b, tCsB(_, _, _0{}), tCrB_v(_, _, _0{}));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(tCrA); ++k) {
    if (k < size<2>(tCrA) - 1) copy(copy_b, tCsB(_, _, k + 1), tCrB_v(_, _, k + 1));
    cute::gemm(mma, tCrA(_, _, k), tCrB(_, _, k), acc);
  }
}

// Global -> shared copy of a (CPY, CPY_M, CPY_K) partition. Rows at or beyond max_row and 8-element column
// chunks at or beyond max_col are never read; their shared-memory slots are zero-filled instead, so the
// padded head dims and the tail of the last block contribute exact zeros.
// When all of this thread's chunks are in bounds (every tile but a sequence's last one, and hdim equal to
// the bucket), the copies go out unpredicated: the zero-fill path costs a shared store and a predicate per
// chunk.
template <class TiledCopy, class Src, class Dst, class Coord>
CUTE_DEVICE void load_tile(TiledCopy const& tc, Src const& src, Dst&& dst, Coord const& coord, int max_row,
                           int max_col) {
  constexpr int kM = decltype(size<1>(src))::value, kK = decltype(size<2>(src))::value;
  if (get<0>(coord(0, kM - 1, 0)) < max_row && get<1>(coord(0, 0, kK - 1)) < max_col) {
    CUTE_UNROLL
    for (int m = 0; m < kM; ++m) {
      CUTE_UNROLL
      for (int k = 0; k < kK; ++k) copy(tc, src(_, m, k), dst(_, m, k));
    }
    return;
  }
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m) {
    const bool row_ok = get<0>(coord(0, m, 0)) < max_row;
    CUTE_UNROLL
    for (int k = 0; k < size<2>(src); ++k) {
      if (row_ok && get<1>(coord(0, m, k)) < max_col) {
        copy(tc, src(_, m, k), dst(_, m, k));
      } else {
        clear(dst(_, m, k));
      }
    }
  }
}

// Shared -> global copy of a partition; only in-bounds rows and column chunks are written.
template <class TiledCopy, class Src, class Dst, class Coord>
CUTE_DEVICE void store_tile(TiledCopy const& tc, Src const& src, Dst&& dst, Coord const& coord, int max_row,
                            int max_col) {
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m) {
    if (get<0>(coord(0, m, 0)) < max_row) {
      CUTE_UNROLL
      for (int k = 0; k < size<2>(src); ++k) {
        if (get<1>(coord(0, m, k)) < max_col) copy(tc, src(_, m, k), dst(_, m, k));
      }
    }
  }
}

// Reductions over the four lanes that share an accumulator row (lanes differing in bits 0 and 1).
CUTE_DEVICE float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
}
CUTE_DEVICE float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x + __shfl_xor_sync(0xffffffffu, x, 1);
}

template <class T>
using MmaAtomFor = std::conditional_t<std::is_same_v<T, cutlass::half_t>, MMA_Atom<SM80_16x8x16_F32F16F16F32_TN>,
                                      MMA_Atom<SM80_16x8x16_F32BF16BF16F32_TN>>;

}  // namespace flashtile::cuda
