// Forward kernel of the sm80 path: one CTA per (query block, query head, sequence); warps split the query
// rows. The key tiles the block visits are [first, last) (core/mask.h key_tiles: a window or causal mask skips
// the others, never computing them); the mainloop walks them from last - 1 down to first, so the tiles that
// need element masking (the sequence's key tail and the diagonal) come first and the left window edge's last.
//
// Pipeline (K and V have one shared buffer each):
//   wait K_j | issue V_j | S = Q K_j^T | hook, mask | wait V_j | issue K_{j-1} | softmax | O += P V_j
// so a copy is in flight during both GEMMs. P goes from the S accumulator straight into the A operand
// registers of P V (no shared-memory round trip).
//
// Varlen: the grid covers max_seqlen_q; a CTA whose block lies beyond its sequence exits at once. Every
// pointer moves to the sequence's first row (sequence() of core/params.h), lse too ([Hq, total_q]).
#pragma once

#include "common/mask.h"
#include "common/softmax.h"
#include "sm80/epilogue.h"
#include "sm80/traits.h"

namespace flashtile::cuda::sm80 {

template <class Traits, class V>
__global__ void __launch_bounds__(Traits::kThreads) fwd_kernel(const __grid_constant__ FwdParams p) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kD = Traits::kHeadDim;
  constexpr bool kMasked = V::kMasked, kHooks = V::kHooks;
  extern __shared__ __align__(128) char smem_raw[];
  Element* smem_q = reinterpret_cast<Element*>(smem_raw);
  Element* smem_k = smem_q + Traits::kSmemQ;
  Element* smem_v = smem_k + Traits::kSmemKV;
  const detail::AttnParams& a = p.a;

  const int tidx = threadIdx.x;
  // Longest first: with a causal mask the last query blocks see the most keys, so they start first.
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int b = blockIdx.z, h = blockIdx.y;
  const int hk = h / p.group;
  const int m0 = m_block * kBlockM;
  const detail::SeqInfo seq = detail::sequence(a, b);
  const int sq = static_cast<int>(seq.seqlen_q), sk = static_cast<int>(seq.seqlen_k);
  if (m0 >= sq) return;  // varlen: this sequence is shorter than max_seqlen_q

  const Element* q_bh = static_cast<const Element*>(a.q) + b * a.q_stride.batch + seq.q_row0 * a.q_stride.row +
                        h * a.q_stride.head;
  const Element* k_bh = static_cast<const Element*>(a.k) + b * a.k_stride.batch + seq.k_row0 * a.k_stride.row +
                        hk * a.k_stride.head;
  const Element* v_bh = static_cast<const Element*>(a.v) + b * a.v_stride.batch + seq.k_row0 * a.v_stride.row +
                        hk * a.v_stride.head;
  Element* o_bh = static_cast<Element*>(a.out) + b * a.out_stride.batch + seq.q_row0 * a.out_stride.row +
                  h * a.out_stride.head;
  float* lse_bh = a.lse + b * a.lse_stride.batch + seq.q_row0 * a.lse_stride.row + h * a.lse_stride.head;
  const float sink = detail::sink_logit(a, h);

  const detail::MaskPolicy pol = detail::MaskPolicy::make(a, seq);
  int n_first = 0, n_last = (sk + kBlockN - 1) / kBlockN;
  int full_begin = 0, full_end = 0;  // key tiles every row of the block sees whole (core/mask.h)
  if constexpr (kMasked) {
    const detail::Range t = pol.key_tiles(m0, min(kBlockM, sq - m0), kBlockN);
    n_first = static_cast<int>(t.begin);
    n_last = static_cast<int>(t.end);
    const detail::Range f = pol.full_key_tiles(m0, min(kBlockM, sq - m0), kBlockN);
    full_begin = static_cast<int>(f.begin);
    full_end = static_cast<int>(f.end);
  }
  if (n_first >= n_last) {
    write_empty_rows<Element, kBlockM, Traits::kThreads>(p, o_bh, lse_bh, m0, sq, sink, tidx);
    return;
  }

  // Global tiles; the head dim extends to the bucket and is predicated against the real hdim.
  Tensor mQ = make_tensor(make_gmem_ptr(q_bh), make_shape(sq, Int<kD>{}), make_stride(a.q_stride.row, _1{}));
  Tensor mK = make_tensor(make_gmem_ptr(k_bh), make_shape(sk, Int<kD>{}), make_stride(a.k_stride.row, _1{}));
  Tensor mV = make_tensor(make_gmem_ptr(v_bh), make_shape(sk, Int<kD>{}), make_stride(a.v_stride.row, _1{}));
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

  const int hdim = static_cast<int>(a.hdim), hdim_v = static_cast<int>(a.hdim_v);
  // Prologue: Q and the last visible K block.
  int n_block = n_last - 1;
  load_tile(gmem_copy, tQgQ, tQsQ, tQcQ, sq - m0, hdim);
  load_tile(gmem_copy, tKgK(_, _, _, n_block), tKsK, tKVcKV, sk - n_block * kBlockN, hdim);
  cp_async_fence();

  // The hook kernels scale the scores themselves (score unit 1, multiplier log2 e).
  const float mult = kHooks ? 1.4426950408889634f : p.scale_log2;
  const float score_scale = kHooks ? 1.f : a.softmax_scale;
  TileHook hook;
  if constexpr (kHooks) hook = TileHook::make(detail::ScoreHook::make(a, seq, b, h));
  constexpr int kRows = decltype(size<0>(acc_rowcol(acc_o.layout())))::value;
  OnlineSoftmax<kRows> softmax(sink, score_scale);
  // Element masking: this thread's rows' key ranges, asked from the policy once (ptxas, sm_80 bf16 hdim 128: the
  // masked kernel's spill stores went from 360 to 344 bytes against asking per masked tile).
  RowKeys<kRows> row_keys;
  row_keys.template init<kMasked>(pol, sk, tScS_rc, m0);
  Tensor acc_o_rc = make_tensor(acc_o.data(), acc_rowcol(acc_o.layout()));

  // Forced inline: called from up to four places, nvcc otherwise outlines it with a 2 KB stack frame.
  auto step = [&](auto first, auto masked) __attribute__((always_inline)) {
    constexpr bool kFirst = decltype(first)::value, kMaskStep = decltype(masked)::value;
    const int n0 = n_block * kBlockN;
    Tensor acc_s = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
    clear(acc_s);
    cp_async_wait<0>();
    __syncthreads();  // K_j landed; every warp finished P V_{j+1}, so sV is free
    load_tile(gmem_copy, tVgV(_, _, _, n_block), tVsV, tKVcKV, sk - n0, hdim_v);
    cp_async_fence();
    gemm_ss(acc_s, tSrQ, tSrK, tSsQ, tSsK, tiled_mma, copy_q, copy_k, tidx);
    Tensor s_rc = make_tensor(acc_s.data(), acc_rowcol(acc_s.layout()));
    // One general hook (AnyHook): a mainloop per hook kind (with_hook_kind)
    // raised ptxas's spills on sm_90 from 244 / 440 to 348 / 1148 bytes (stores / loads), a per-tile branch to
    // 612 / 1016.
    if constexpr (kHooks) apply_hook<AnyHook>(s_rc, tScS_rc, m0, n0, hook);
    if constexpr (kMaskStep) row_keys.apply(s_rc, tScS_rc, n0, -INFINITY);
    cp_async_wait<0>();
    __syncthreads();  // V_j landed; every warp finished Q K_j^T, so sK is free
    if (n_block > n_first) {
      load_tile(gmem_copy, tKgK(_, _, _, n_block - 1), tKsK, tKVcKV, sk - n0 + kBlockN, hdim);
      cp_async_fence();
    }
    softmax.template update<kFirst>(s_rc, acc_o_rc, mult);
    Tensor rP = convert_to<Element>(acc_s);
    Tensor tOrP = make_tensor(rP.data(), acc_as_a(rP.layout()));
    gemm_rs(acc_o, tOrP, tOrVt, tOsVt, tiled_mma, copy_v, tidx);
  };

  // The tiles that need masking come first in this descending order (the key tail, the diagonal) and, with a
  // left window edge, last: the loop splits in three so the unmasked steps carry no masking code at all (a
  // runtime branch was if-converted by the compiler into ~100 predicated-off instructions per step, measured
  // with ncu). The first step always masks (once per CTA; a tile that needs none is left unchanged by it).
  // Plain kernels mask only the key tail: their middle loop runs to the first tile.
  auto needs_mask = [&](int nb) {
    if constexpr (kMasked) return nb < full_begin || nb >= full_end;  // past Sk: never full
    return nb * kBlockN + kBlockN > sk;
  };
  step(cute::true_type{}, cute::true_type{});
  for (--n_block; n_block >= n_first && needs_mask(n_block); --n_block) step(cute::false_type{}, cute::true_type{});
  for (; n_block >= n_first && (!kMasked || !needs_mask(n_block)); --n_block)
    step(cute::false_type{}, cute::false_type{});
  if constexpr (kMasked)
    for (; n_block >= n_first; --n_block) step(cute::false_type{}, cute::true_type{});

  // Epilogue: normalise, write LSE from the lanes that own each row, then O through shared memory (sQ's
  // buffer: the last read of sQ happened before the final barrier of the mainloop).
  float lse[kRows];
  softmax.finalize(acc_o_rc, score_scale, lse);
  if (tidx % 4 == 0) {
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      const int row = m0 + get<0>(tScS_rc(mi, 0));
      if (row < sq) lse_bh[row * a.lse_stride.row] = lse[mi];
    }
  }
  Tensor mO = make_tensor(make_gmem_ptr(o_bh), make_shape(sq, Int<kD>{}), make_stride(a.out_stride.row, _1{}));
  Tensor gO = local_tile(mO, Shape<Int<kBlockM>, Int<kD>>{}, make_coord(m_block, 0));
  store_acc_tile<Element, Traits::kThreads, typename Traits::SmemLayoutQ, typename Traits::GmemCopyOut>(
      acc_o, tiled_mma, smem_q, gO, sq - m0, hdim_v, tidx);
}

}  // namespace flashtile::cuda::sm80
