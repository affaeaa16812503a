// Backward kernel of the sm80 path: one CTA per (key block, KV head, sequence). It loads K_j and V_j once and
// loops over the query blocks [first, last) that see its keys (core/mask.h query_tiles: a window or causal
// mask skips the others) of every query head in its GQA group (so dK and dV, summed over the group,
// stay in registers and need no atomics), recomputing P from Q, K and the forward's LSE:
//   S = Q K^T, dP = dO V^T                  (warps split query rows x keys)
//   P = exp(scale S - LSE), dS = P (dP - D)  (registers, then 16-bit into shared memory)
//   dV += P^T dO                             (warps split keys x head dim; operands via ldmatrix.trans)
//   dQ_i += dS K                             (fp32 reductions into dq_accum, in the thread-major order of
//                                             dq_accum_offset(); ordered by a per-block counter in
//                                             deterministic mode)
//   dK += dS^T Q                             (after dQ, so dQ's reductions drain under this GEMM)
// Q and dO are double-buffered when the tile table says so: block i+1 loads while block i computes.
// Hook kernels (common/mask.h) compute P from the hooked score and multiply dS by the hook's derivative;
// their element masking zeroes P and dS after the fact (the hook of a masked raw score is not -inf).
// Varlen: the grid covers max_seqlen_k; a CTA beyond its sequence's key rows exits, one beyond its used keys
// (seqused_k) writes dK = dV = 0.
#pragma once

#include "common/mask.h"
#include "sm80/epilogue.h"
#include "sm80/traits.h"

namespace flashtile::cuda::sm80 {

// Deterministic mode: the key blocks add into one query block's dq_accum strictly in key-block order (turn 0
// is the first key block that visits the query block).
CUTE_DEVICE void wait_turn(const int* counter, int turn) {
  if (threadIdx.x == 0) {
    int seen;
    do {
      asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
    } while (seen != turn);
  }
  __syncthreads();
}
CUTE_DEVICE void pass_turn(int* counter) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd(counter, 1);
}

// dq_accum keeps each (b, h, query block) tile of kBlockM x hdim floats in thread-major order, not row-major:
// element i of thread t's dQ accumulator (the TiledMmadQ partition) lives at offset
// (i / 4) * 4 * kThreads + 4 * t + i % 4. So one warp's reduction of four accumulator elements covers 512
// contiguous bytes (the row-major order would touch 8 rows per instruction: 2x the L2 sectors, measured at
// 72 % of L2 throughput). Every key block uses the same partition, so the sums land consistently, and
// dq_convert_kernel reads them back through the same partition.
template <int kThreads>
CUTE_DEVICE int dq_accum_offset(int i, int tidx) {
  return (i / 4) * 4 * kThreads + 4 * tidx + i % 4;
}

// dst[0..3] += v[0..3]: one 16-byte reduction on sm_90, four 4-byte ones before. Inline PTX because neither
// CuTe nor CUDA has a vector reduction without a result: atomicAdd(float4*) compiled to ATOMG, whose returned
// registers stay locked until the atomic completes (measured: 6 % of the hdim 256 kernel's stall samples).
CUTE_DEVICE void red_add4(float* dst, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "f"(a), "f"(b), "f"(c),
               "f"(d)
               : "memory");
#else
  atomicAdd(dst, a);
  atomicAdd(dst + 1, b);
  atomicAdd(dst + 2, c);
  atomicAdd(dst + 3, d);
#endif
}

template <class Traits, class V>
__global__ void __launch_bounds__(Traits::kThreads) bwd_kernel(const __grid_constant__ BwdParams p) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kD = Traits::kHeadDim;
  constexpr int kStages = Traits::kStagesQ;
  constexpr bool kMasked = V::kMasked, kHooks = V::kHooks;
  extern __shared__ __align__(128) char smem_raw[];
  Element* smem_k = reinterpret_cast<Element*>(smem_raw);
  Element* smem_v = smem_k + Traits::kSmemKV;
  Element* smem_q = smem_v + Traits::kSmemKV;          // kStages buffers
  Element* smem_do = smem_q + kStages * Traits::kSmemQ;  // kStages buffers
  Element* smem_p = smem_do + kStages * Traits::kSmemQ;
  Element* smem_ds = smem_p + Traits::kSmemPdS;
  const detail::AttnParams& a = p.a;

  const int tidx = threadIdx.x;
  const int n_block = blockIdx.x;
  const int b = blockIdx.z, hk = blockIdx.y;
  const int n0 = n_block * kBlockN;
  const detail::SeqInfo seq = detail::sequence(a, b);
  const int sq = static_cast<int>(seq.seqlen_q), sk = static_cast<int>(seq.seqlen_k);
  // Key rows this CTA owns in dK / dV: the sequence's rows (beyond seqused_k too: their gradient is 0). Asked
  // again in the epilogue rather than kept in a register through the mainloop.
  auto key_rows = [&]() {
    return a.cu_seqlens_k != nullptr ? a.cu_seqlens_k[b + 1] - a.cu_seqlens_k[b] : static_cast<int>(a.seqlen_k);
  };
  if (n0 >= key_rows()) return;
  const int q_row0 = static_cast<int>(seq.q_row0);  // < 2^31 (can_run)
  const detail::MaskPolicy pol = detail::MaskPolicy::make(a, seq);
  int m_first = 0, m_last = 0;
  detail::Range full_m{};  // query blocks whose every row sees all of this CTA's keys (core/mask.h)
  if (n0 < sk) {
    m_last = (sq + kBlockM - 1) / kBlockM;
    if constexpr (kMasked) {
      const detail::Range t = pol.query_tiles(n0, min(kBlockN, sk - n0), kBlockM);
      m_first = static_cast<int>(t.begin);
      m_last = static_cast<int>(t.end);
      full_m = pol.full_query_tiles(n0, min(kBlockN, sk - n0), kBlockM);
    }
  }
  const int m_blocks = m_last > m_first ? m_last - m_first : 0;
  const int iters = p.group * m_blocks;
  const int hdim = static_cast<int>(a.hdim), hdim_v = static_cast<int>(a.hdim_v);
  const bool tail_tile = n0 + kBlockN > sk;  // the tile holds the sequence's key tail: always masked

  const Element* k_bh = static_cast<const Element*>(a.k) + b * a.k_stride.batch + seq.k_row0 * a.k_stride.row +
                        hk * a.k_stride.head;
  const Element* v_bh = static_cast<const Element*>(a.v) + b * a.v_stride.batch + seq.k_row0 * a.v_stride.row +
                        hk * a.v_stride.head;
  Tensor mK = make_tensor(make_gmem_ptr(k_bh), make_shape(sk, Int<kD>{}), make_stride(a.k_stride.row, _1{}));
  Tensor mV = make_tensor(make_gmem_ptr(v_bh), make_shape(sk, Int<kD>{}), make_stride(a.v_stride.row, _1{}));
  Tensor gK = local_tile(mK, Shape<Int<kBlockN>, Int<kD>>{}, make_coord(n_block, 0));
  Tensor gV = local_tile(mV, Shape<Int<kBlockN>, Int<kD>>{}, make_coord(n_block, 0));

  Tensor sK = make_tensor(make_smem_ptr(smem_k), typename Traits::SmemLayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(smem_v), typename Traits::SmemLayoutKV{});
  Tensor sKt = make_tensor(make_smem_ptr(smem_k), typename Traits::SmemLayoutKt{});
  Tensor sKtNoSwizzle = make_tensor(make_smem_ptr(smem_k), typename Traits::SmemLayoutKtNoSwizzle{});
  Tensor sP = make_tensor(make_smem_ptr(smem_p), typename Traits::SmemLayoutPdS{});
  Tensor sPt = make_tensor(make_smem_ptr(smem_p), typename Traits::SmemLayoutPdSt{});
  Tensor sPtNoSwizzle = make_tensor(make_smem_ptr(smem_p), typename Traits::SmemLayoutPdStNoSwizzle{});
  Tensor sdS = make_tensor(make_smem_ptr(smem_ds), typename Traits::SmemLayoutPdS{});
  Tensor sdSt = make_tensor(make_smem_ptr(smem_ds), typename Traits::SmemLayoutPdSt{});
  Tensor sdStNoSwizzle = make_tensor(make_smem_ptr(smem_ds), typename Traits::SmemLayoutPdStNoSwizzle{});
  auto sQ_at = [&](int s) { return make_tensor(make_smem_ptr(smem_q + s * Traits::kSmemQ), typename Traits::SmemLayoutQ{}); };
  auto sdO_at = [&](int s) { return make_tensor(make_smem_ptr(smem_do + s * Traits::kSmemQ), typename Traits::SmemLayoutQ{}); };
  auto sQt_at = [&](int s) { return make_tensor(make_smem_ptr(smem_q + s * Traits::kSmemQ), typename Traits::SmemLayoutQt{}); };
  auto sdOt_at = [&](int s) { return make_tensor(make_smem_ptr(smem_do + s * Traits::kSmemQ), typename Traits::SmemLayoutQt{}); };

  typename Traits::GmemCopyIn gmem_copy;
  auto gthr = gmem_copy.get_thread_slice(tidx);
  Tensor tKVc = gthr.partition_S(make_identity_tensor(make_shape(size<0>(sK), size<1>(sK))));
  Tensor tQc = gthr.partition_S(make_identity_tensor(make_shape(Int<kBlockM>{}, Int<kD>{})));

  typename Traits::TiledMmadKV mma_dkv;
  auto thr_dkv = mma_dkv.get_thread_slice(tidx);
  Tensor acc_dk = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kD>>{});
  Tensor acc_dv = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kD>>{});
  clear(acc_dk);
  clear(acc_dv);

  if (iters > 0) {
    load_tile(gmem_copy, gthr.partition_S(gK), gthr.partition_D(sK), tKVc, sk - n0, hdim);
    load_tile(gmem_copy, gthr.partition_S(gV), gthr.partition_D(sV), tKVc, sk - n0, hdim_v);
    cp_async_fence();
  }

  // Iterations walk the group's heads (outer) and the query blocks from m_first (inner); the next
  // (head, block) is carried along instead of divided out of the iteration number.
  auto advance = [&](int& h, int& mb) {
    if (++mb == m_last) {
      mb = m_first;
      ++h;
    }
  };
  auto load_q_do = [&](int h, int mb, int stage) {
    const Element* q_bh = static_cast<const Element*>(a.q) + b * a.q_stride.batch +
                          static_cast<std::int64_t>(q_row0) * a.q_stride.row + h * a.q_stride.head;
    const Element* do_bh = static_cast<const Element*>(a.dout) + b * a.dout_stride.batch +
                           static_cast<std::int64_t>(q_row0) * a.dout_stride.row + h * a.dout_stride.head;
    Tensor mQ = make_tensor(make_gmem_ptr(q_bh), make_shape(sq, Int<kD>{}), make_stride(a.q_stride.row, _1{}));
    Tensor mdO = make_tensor(make_gmem_ptr(do_bh), make_shape(sq, Int<kD>{}), make_stride(a.dout_stride.row, _1{}));
    Tensor gQ = local_tile(mQ, Shape<Int<kBlockM>, Int<kD>>{}, make_coord(mb, 0));
    Tensor gdO = local_tile(mdO, Shape<Int<kBlockM>, Int<kD>>{}, make_coord(mb, 0));
    const int rows = sq - mb * kBlockM;
    load_tile(gmem_copy, gthr.partition_S(gQ), gthr.partition_D(sQ_at(stage)), tQc, rows, hdim);
    load_tile(gmem_copy, gthr.partition_S(gdO), gthr.partition_D(sdO_at(stage)), tQc, rows, hdim_v);
  };
  int h = hk * p.group, mb = m_first;  // this iteration's query head and block
  const std::int64_t ws_seq = ws_row0(p, b, 0);  // workspace slot of this sequence's row 0 in head 0
  if (iters > 0) {
    load_q_do(h, mb, 0);
    cp_async_fence();
  }

  typename Traits::TiledMmaSdP mma_sdp;
  auto thr_sdp = mma_sdp.get_thread_slice(tidx);
  typename Traits::TiledMmadQ mma_dq;
  auto thr_dq = mma_dq.get_thread_slice(tidx);

  Tensor tSrQ = thr_sdp.partition_fragment_A(sQ_at(0));
  Tensor tSrK = thr_sdp.partition_fragment_B(sK);
  Tensor tdPrdO = thr_sdp.partition_fragment_A(sdO_at(0));
  Tensor tdPrV = thr_sdp.partition_fragment_B(sV);
  Tensor tdVrPt = thr_dkv.partition_fragment_A(sPtNoSwizzle);
  Tensor tdVrdO = thr_dkv.partition_fragment_B(make_tensor(make_smem_ptr(smem_do), typename Traits::SmemLayoutQtNoSwizzle{}));
  Tensor tdKrdSt = thr_dkv.partition_fragment_A(sdStNoSwizzle);
  Tensor tdKrQt = thr_dkv.partition_fragment_B(make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQtNoSwizzle{}));
  Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);
  Tensor tdQrKt = thr_dq.partition_fragment_B(sKtNoSwizzle);

  auto copy_sdp_a = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, mma_sdp);
  auto copy_sdp_b = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, mma_sdp);
  auto copy_dkv_a = make_tiled_copy_A(typename Traits::SmemCopyAtomT{}, mma_dkv);
  auto copy_dkv_b = make_tiled_copy_B(typename Traits::SmemCopyAtomT{}, mma_dkv);
  auto copy_dq_a = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, mma_dq);
  auto copy_dq_b = make_tiled_copy_B(typename Traits::SmemCopyAtomT{}, mma_dq);
  Tensor tSsK = copy_sdp_b.get_thread_slice(tidx).partition_S(sK);
  Tensor tdPsV = copy_sdp_b.get_thread_slice(tidx).partition_S(sV);
  Tensor tdVsPt = copy_dkv_a.get_thread_slice(tidx).partition_S(sPt);
  Tensor tdKsdSt = copy_dkv_a.get_thread_slice(tidx).partition_S(sdSt);
  Tensor tdQsdS = copy_dq_a.get_thread_slice(tidx).partition_S(sdS);
  Tensor tdQsKt = copy_dq_b.get_thread_slice(tidx).partition_S(sKt);
  // Q and dO operand views of stage 0; another stage is the same view moved by kSmemQ elements (a pointer
  // bump, so the swizzled addresses are computed once, outside the loop).
  Tensor tSsQ = copy_sdp_a.get_thread_slice(tidx).partition_S(sQ_at(0));
  Tensor tdPsdO = copy_sdp_a.get_thread_slice(tidx).partition_S(sdO_at(0));
  Tensor tdVsdOt = copy_dkv_b.get_thread_slice(tidx).partition_S(sdOt_at(0));
  Tensor tdKsQt = copy_dkv_b.get_thread_slice(tidx).partition_S(sQt_at(0));
  auto at_stage = [](auto const& t, int stage) { return make_tensor(t.data() + stage * Traits::kSmemQ, t.layout()); };

  auto copy_pds = make_tiled_copy_C(typename Traits::SmemCopyAtomStore{}, mma_sdp);
  auto thr_pds = copy_pds.get_thread_slice(tidx);
  Tensor tPsP = thr_pds.partition_D(sP);
  Tensor tPsdS = thr_pds.partition_D(sdS);

  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
  Tensor tScS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));
  constexpr int kRows = decltype(size<0>(tScS_rc))::value;

  for (int it = 0; it < iters; ++it) {
    const int stage = kStages == 2 ? it % 2 : 0;
    const int m0 = mb * kBlockM;
    int h_next = h, mb_next = mb;
    advance(h_next, mb_next);
    if (kStages == 2 && it + 1 < iters) {
      load_q_do(h_next, mb_next, (it + 1) % 2);  // that buffer was released by the barrier ending iteration it - 1
      cp_async_fence();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    const std::int64_t row_base = ws_seq + h * p.ws_head + m0;  // workspace slot of row m0 (ws_row0)
    float lse2[kRows], dsum[kRows];
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      const int r = get<0>(tScS_rc(mi, 0));  // < kBlockM, and m0 + kBlockM <= seqlen_q_pad
      lse2[mi] = p.lse_log2[row_base + r];
      dsum[mi] = p.dsum[row_base + r];
    }
    __syncthreads();  // this iteration's Q and dO are visible to every warp

    Tensor acc_s = partition_fragment_C(mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});
    Tensor acc_dp = partition_fragment_C(mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});
    clear(acc_s);
    clear(acc_dp);
    gemm_ss(acc_s, tSrQ, tSrK, at_stage(tSsQ, stage), tSsK, mma_sdp,
            copy_sdp_a, copy_sdp_b, tidx);
    gemm_ss(acc_dp, tdPrdO, tdPrV, at_stage(tdPsdO, stage), tdPsV, mma_sdp,
            copy_sdp_a, copy_sdp_b, tidx);
    Tensor s_rc = make_tensor(acc_s.data(), acc_rowcol(acc_s.layout()));
    Tensor dp_rc = make_tensor(acc_dp.data(), acc_rowcol(acc_dp.layout()));
    // Element masking where the tile holds the key tail or the policy says partial (uniform per CTA).
    const bool mask_this = tail_tile || (kMasked && (mb < full_m.begin || mb >= full_m.end));
    if constexpr (!kHooks) {
      if (mask_this) mask_tile<kMasked>(s_rc, tScS_rc, m0, n0, pol, sk, -INFINITY);
      CUTE_UNROLL
      for (int mi = 0; mi < kRows; ++mi) {
        CUTE_UNROLL
        for (int ni = 0; ni < size<1>(s_rc); ++ni) {
          const float pr = ex2(s_rc(mi, ni) * p.scale_log2 - lse2[mi]);
          s_rc(mi, ni) = pr;
          dp_rc(mi, ni) = pr * (dp_rc(mi, ni) - dsum[mi]);
        }
      }
    } else {
      const TileHook hook = TileHook::make(detail::ScoreHook::make(a, seq, b, h));
      with_hook_kind(hook, [&](auto cap, auto alibi) {
        for_each_dist(tScS_rc, m0, n0, hook.shift, [&](int mi, int ni, float dist) {
          float dscore;
          const float s = hook.template apply<HookKind<decltype(cap)::value, decltype(alibi)::value>>(
              s_rc(mi, ni), dist, dscore);
          const float pr = ex2(s * 1.4426950408889634f - lse2[mi]);
          s_rc(mi, ni) = pr;
          dp_rc(mi, ni) = pr * (dp_rc(mi, ni) - dsum[mi]) * dscore;
        });
      });
      if (mask_this) {
        mask_tile<kMasked>(s_rc, tScS_rc, m0, n0, pol, sk, 0.f);
        mask_tile<kMasked>(dp_rc, tScS_rc, m0, n0, pol, sk, 0.f);
      }
    }
    {
      Tensor rP = convert_to<Element>(acc_s);
      Tensor rdS = convert_to<Element>(acc_dp);
      copy(copy_pds, thr_pds.retile_S(rP), tPsP);
      copy(copy_pds, thr_pds.retile_S(rdS), tPsdS);
    }
    __syncthreads();  // P and dS are in shared memory

    gemm_ss(acc_dv, tdVrPt, tdVrdO, tdVsPt, at_stage(tdVsdOt, stage), mma_dkv,
            copy_dkv_a, copy_dkv_b, tidx);
    // dQ before dK: its reductions to global memory drain while the dK GEMM runs (issued last, their
    // latency showed up as long-scoreboard and barrier stalls at the top of the next iteration).
    Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kD>>{});
    clear(acc_dq);
    gemm_ss(acc_dq, tdQrdS, tdQrKt, tdQsdS, tdQsKt, mma_dq, copy_dq_a, copy_dq_b, tidx);

    float* dq_blk = p.dq_accum + row_base * p.hdim_pad;
    int* counter = nullptr;
    if (a.deterministic) {
      counter = p.dq_semaphore + row_base / kBlockM;
      int turn = n_block;
      if constexpr (kMasked) turn -= static_cast<int>(pol.key_tiles(m0, min(kBlockM, sq - m0), kBlockN).begin);
      wait_turn(counter, turn);
    }
    static_assert(decltype(size(acc_dq))::value % 4 == 0);
    CUTE_UNROLL
    for (int i = 0; i < size(acc_dq); i += 4)
      red_add4(dq_blk + dq_accum_offset<Traits::kThreads>(i, tidx), acc_dq(i), acc_dq(i + 1), acc_dq(i + 2),
               acc_dq(i + 3));
    if (a.deterministic) pass_turn(counter);
    gemm_ss(acc_dk, tdKrdSt, tdKrQt, tdKsdSt, at_stage(tdKsQt, stage), mma_dkv,
            copy_dkv_a, copy_dkv_b, tidx);
    __syncthreads();  // P, dS and this stage's Q/dO may be overwritten from here on
    if (kStages == 1 && it + 1 < iters) {
      load_q_do(h_next, mb_next, 0);
      cp_async_fence();
    }
    h = h_next;
    mb = mb_next;
  }

  // Epilogue: dK carries the softmax scale (dS was unscaled); K and V's buffers take the 16-bit tiles.
  CUTE_UNROLL
  // Rows from sk to k_rows (keys beyond seqused_k) hold exact zeros: their K and V rows were never loaded
  // and their scores were masked.
  for (int i = 0; i < size(acc_dk); ++i) acc_dk(i) *= a.softmax_scale;
  const int k_rows = key_rows();
  const std::int64_t k_row0 = detail::sequence(a, b).k_row0;
  Element* dk_bh = static_cast<Element*>(a.dk) + b * a.dk_stride.batch + k_row0 * a.dk_stride.row +
                   hk * a.dk_stride.head;
  Element* dv_bh = static_cast<Element*>(a.dv) + b * a.dv_stride.batch + k_row0 * a.dv_stride.row +
                   hk * a.dv_stride.head;
  Tensor mdK = make_tensor(make_gmem_ptr(dk_bh), make_shape(k_rows, Int<kD>{}), make_stride(a.dk_stride.row, _1{}));
  Tensor mdV = make_tensor(make_gmem_ptr(dv_bh), make_shape(k_rows, Int<kD>{}), make_stride(a.dv_stride.row, _1{}));
  Tensor gdK = local_tile(mdK, Shape<Int<kBlockN>, Int<kD>>{}, make_coord(n_block, 0));
  Tensor gdV = local_tile(mdV, Shape<Int<kBlockN>, Int<kD>>{}, make_coord(n_block, 0));
  store_acc_tile<Element, Traits::kThreads, typename Traits::SmemLayoutKV, typename Traits::GmemCopyOut>(
      acc_dk, mma_dkv, smem_k, gdK, k_rows - n0, hdim, tidx);
  store_acc_tile<Element, Traits::kThreads, typename Traits::SmemLayoutKV, typename Traits::GmemCopyOut>(
      acc_dv, mma_dkv, smem_v, gdV, k_rows - n0, hdim_v, tidx);
}

}  // namespace flashtile::cuda::sm80
