// Forward kernel of the sm80 path: one CTA per (query block, query head, batch); warps split the query
// rows. Mainloop over key blocks from the last visible one down to 0, so the blocks that need masking
// (the sequence tail and, causal, the diagonal) come first and tiles above the diagonal are never visited.
//
// Pipeline (K and V have one shared buffer each):
//   wait K_j | issue V_j | S = Q K_j^T | mask | wait V_j | issue K_{j-1} | softmax | O += P V_j
// so a copy is in flight during both GEMMs. P goes from the S accumulator straight into the A operand
// registers of P V (no shared-memory round trip).
#pragma once

#include "common/mask.h"
#include "common/softmax.h"
#include "sm80/epilogue.h"
#include "sm80/traits.h"

namespace flashtile::cuda::sm80 {

template <class Traits, class Mask>
__global__ void __launch_bounds__(Traits::kThreads) fwd_kernel(const __grid_constant__ FwdParams p) {
  using Element = typename Traits::Element;
  using M = MaskOps<Mask>;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kD = Traits::kHeadDim;
  extern __shared__ __align__(128) char smem_raw[];
  Element* smem_q = reinterpret_cast<Element*>(smem_raw);
  Element* smem_k = smem_q + Traits::kSmemQ;
  Element* smem_v = smem_k + Traits::kSmemKV;

  const int tidx = threadIdx.x;
  // Longest first: with a causal mask the last query blocks see the most keys, so they start first.
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int b = blockIdx.z, h = blockIdx.y, hk = h / p.group;
  const int m0 = m_block * kBlockM;

  const Element* q_bh = static_cast<const Element*>(p.q) + b * p.q_stride.batch + h * p.q_stride.head;
  const Element* k_bh = static_cast<const Element*>(p.k) + b * p.k_stride.batch + hk * p.k_stride.head;
  const Element* v_bh = static_cast<const Element*>(p.v) + b * p.v_stride.batch + hk * p.v_stride.head;
  Element* o_bh = static_cast<Element*>(p.out) + b * p.out_stride.batch + h * p.out_stride.head;
  float* lse_bh = p.lse + b * p.lse_batch + h * p.lse_head;

  const int n_block_max = M::n_block_max(m0, kBlockM, kBlockN, p.seqlen_q, p.seqlen_k);
  if (n_block_max <= 0) {
    write_empty_rows<Element, kBlockM, Traits::kThreads>(p, o_bh, lse_bh, m0, tidx);
    return;
  }

  // Global tiles; the head dim extends to the bucket and is predicated against the real hdim.
  Tensor mQ = make_tensor(make_gmem_ptr(q_bh), make_shape(p.seqlen_q, Int<kD>{}), make_stride(p.q_stride.row, _1{}));
  Tensor mK = make_tensor(make_gmem_ptr(k_bh), make_shape(p.seqlen_k, Int<kD>{}), make_stride(p.k_stride.row, _1{}));
  Tensor mV = make_tensor(make_gmem_ptr(v_bh), make_shape(p.seqlen_k, Int<kD>{}), make_stride(p.v_stride.row, _1{}));
  Tensor gQ = local_tile(mQ, Shape<Int<kBlockM>, Int<kD>>{}, make_coord(m_block, 0));
  Tensor gK = local_tile(mK, Shape<Int<kBlockN>, Int<kD>>{}, make_coord(_, 0));  // (N, D, n_blocks)
  Tensor gV = local_tile(mV, Shape<Int<kBlockN>, Int<kD>>{}, make_coord(_, 0));

  Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(smem_k), typename Traits::SmemLayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(smem_v), typename Traits::SmemLayoutKV{});
  Tensor sVt = make_tensor(make_smem_ptr(smem_v), typename Traits::SmemLayoutVt{});
  Tensor sVtNoSwizzle = make_tensor(make_smem_ptr(smem_v), typename Traits::SmemLayoutVtNoSwizzle{});

  typename Traits::GmemCopyIn gmem_copy;
  auto gthr = gmem_copy.get_thread_slice(tidx);
  Tensor tQgQ = gthr.partition_S(gQ);
  Tensor tQsQ = gthr.partition_D(sQ);
  Tensor tKgK = gthr.partition_S(gK);  // (CPY, CPY_N, CPY_D, n_blocks)
  Tensor tKsK = gthr.partition_D(sK);
  Tensor tVgV = gthr.partition_S(gV);
  Tensor tVsV = gthr.partition_D(sV);
  Tensor tQcQ = gthr.partition_S(make_identity_tensor(make_shape(size<0>(sQ), size<1>(sQ))));
  Tensor tKVcKV = gthr.partition_S(make_identity_tensor(make_shape(size<0>(sK), size<1>(sK))));

  typename Traits::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(tidx);
  Tensor tSrQ = thr_mma.partition_fragment_A(sQ);
  Tensor tSrK = thr_mma.partition_fragment_B(sK);
  Tensor tOrVt = thr_mma.partition_fragment_B(sVtNoSwizzle);
  Tensor acc_o = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kD>>{});
  clear(acc_o);

  auto copy_q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto copy_k = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto copy_v = make_tiled_copy_B(typename Traits::SmemCopyAtomT{}, tiled_mma);
  Tensor tSsQ = copy_q.get_thread_slice(tidx).partition_S(sQ);
  Tensor tSsK = copy_k.get_thread_slice(tidx).partition_S(sK);
  Tensor tOsVt = copy_v.get_thread_slice(tidx).partition_S(sVt);

  // Coordinates of this thread's score elements, for masking.
  Tensor tScS = thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
  Tensor tScS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));

  // Prologue: Q and the last visible K block.
  int n_block = n_block_max - 1;
  load_tile(gmem_copy, tQgQ, tQsQ, tQcQ, p.seqlen_q - m0, p.hdim);
  load_tile(gmem_copy, tKgK(_, _, _, n_block), tKsK, tKVcKV, p.seqlen_k - n_block * kBlockN, p.hdim);
  cp_async_fence();

  constexpr int kRows = decltype(size<0>(acc_rowcol(acc_o.layout())))::value;
  OnlineSoftmax<kRows> softmax;
  Tensor acc_o_rc = make_tensor(acc_o.data(), acc_rowcol(acc_o.layout()));

  // Forced inline: called from three places, nvcc otherwise outlines it with a 2 KB stack frame.
  auto step = [&](auto first, auto masked) __attribute__((always_inline)) {
    constexpr bool kFirst = decltype(first)::value, kMasked = decltype(masked)::value;
    const int n0 = n_block * kBlockN;
    Tensor acc_s = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
    clear(acc_s);
    cp_async_wait<0>();
    __syncthreads();  // K_j landed; every warp finished P V_{j+1}, so sV is free
    load_tile(gmem_copy, tVgV(_, _, _, n_block), tVsV, tKVcKV, p.seqlen_k - n0, p.hdim_v);
    cp_async_fence();
    gemm_ss(acc_s, tSrQ, tSrK, tSsQ, tSsK, tiled_mma, copy_q, copy_k, tidx);
    Tensor s_rc = make_tensor(acc_s.data(), acc_rowcol(acc_s.layout()));
    if constexpr (kMasked) M::apply(s_rc, tScS_rc, m0, n0, p.seqlen_q, p.seqlen_k);
    cp_async_wait<0>();
    __syncthreads();  // V_j landed; every warp finished Q K_j^T, so sK is free
    if (n_block > 0) {
      load_tile(gmem_copy, tKgK(_, _, _, n_block - 1), tKsK, tKVcKV, p.seqlen_k - n0 + kBlockN, p.hdim);
      cp_async_fence();
    }
    softmax.template update<kFirst>(s_rc, acc_o_rc, p.scale_log2);
    Tensor rP = convert_to<Element>(acc_s);
    Tensor tOrP = make_tensor(rP.data(), acc_as_a(rP.layout()));
    gemm_rs(acc_o, tOrP, tOrVt, tOsVt, tiled_mma, copy_v, tidx);
  };

  // The tiles that need masking come first in this descending order, so the loop splits in two and the
  // unmasked steps carry no masking code at all (a runtime branch was if-converted by the compiler into
  // ~100 predicated-off instructions per step, measured with ncu).
  // The first step always masks (once per CTA; a tile that needs none is left unchanged by it).
  auto needs_mask = [&](int nb) { return M::tile_needs_mask(m0, nb * kBlockN, kBlockN, p.seqlen_q, p.seqlen_k); };
  step(cute::true_type{}, cute::true_type{});
  for (--n_block; n_block >= 0 && needs_mask(n_block); --n_block) step(cute::false_type{}, cute::true_type{});
  for (; n_block >= 0; --n_block) step(cute::false_type{}, cute::false_type{});

  // Epilogue: normalise, write LSE from the lanes that own each row, then O through shared memory (sQ's
  // buffer: the last read of sQ happened before the final barrier of the mainloop).
  float lse[kRows];
  softmax.finalize(acc_o_rc, p.scale, lse);
  if (tidx % 4 == 0) {
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      const int row = m0 + get<0>(tScS_rc(mi, 0));
      if (row < p.seqlen_q) lse_bh[row * p.lse_row] = lse[mi];
    }
  }
  Tensor mO = make_tensor(make_gmem_ptr(o_bh), make_shape(p.seqlen_q, Int<kD>{}), make_stride(p.out_stride.row, _1{}));
  Tensor gO = local_tile(mO, Shape<Int<kBlockM>, Int<kD>>{}, make_coord(m_block, 0));
  store_acc_tile<Element, Traits::kThreads, typename Traits::SmemLayoutQ, typename Traits::GmemCopyOut>(
      acc_o, tiled_mma, smem_q, gO, p.seqlen_q - m0, p.hdim_v, tidx);
}

}  // namespace flashtile::cuda::sm80
