// Host-side launcher of the sm90 backward (included by the generated instance files only): [clear the
// deterministic turn counters] -> preprocess (dsum,
// lse_log2, dq_accum cleared; sm80's kernel, with this path's block_m) -> [sink gradient] -> main kernel -> dQ
// conversion. TMA descriptors are built per call on the host, as in the forward. The kernel is bwd_kernel.h's or,
// for the tile table's wide entries, bwd_wide_kernel.h's.
#pragma once

#include "sm80/bwd_aux.h"  // bwd_preprocess_kernel, sink_grad_kernel (generic over the slot layout)
#include "sm90/bwd_kernel.h"
#include "sm90/bwd_wide_kernel.h"
#include "sm90/fwd_launch.h"  // gmem_view
#include "sm90/launch.h"

namespace flashtile::cuda::sm90 {

template <class Element, int kHeadDim, class V>
cudaError_t run_bwd(const BwdParams& p, cudaStream_t stream) {
  constexpr bool kWide = bwd_tile(kHeadDim).wide;
  using Traits = std::conditional_t<kWide, BwdWideTraits<Element, kHeadDim>, BwdTraits<Element, kHeadDim>>;
  const detail::AttnParams& a = p.a;
  if (p.block_m != Traits::kBlockM || p.hdim_pad != kHeadDim) return cudaErrorInvalidValue;
  const auto batch = static_cast<unsigned>(a.batch), heads_q = static_cast<unsigned>(a.heads_q);
  cudaError_t e = cudaSuccess;
  if (a.deterministic && p.ws_slots > 0) {  // the key blocks' turn counters, one per query block
    e = cudaMemsetAsync(p.dq_semaphore, 0, static_cast<size_t>(p.ws_slots / Traits::kBlockM) * sizeof(int), stream);
    if (e != cudaSuccess) return e;
  }
  constexpr int kRowsPerBlock = sm80::kAuxThreads / (kHeadDim / 8 <= 8 ? 8 : kHeadDim / 8 <= 16 ? 16 : 32);
  if (p.seqlen_q_pad > 0 && batch > 0 && heads_q > 0) {
    const dim3 pre_grid(static_cast<unsigned>((p.seqlen_q_pad + kRowsPerBlock - 1) / kRowsPerBlock), heads_q, batch);
    sm80::bwd_preprocess_kernel<Element, kHeadDim><<<pre_grid, sm80::kAuxThreads, 0, stream>>>(p);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  if (p.sink_terms != nullptr && a.dsinks != nullptr && heads_q > 0) {
    sm80::sink_grad_kernel<sm80::kAuxThreads><<<heads_q, sm80::kAuxThreads, 0, stream>>>(p);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  const dim3 grid(static_cast<unsigned>((a.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN),
                  static_cast<unsigned>(a.heads_kv), batch);
  if (grid.x > 0 && grid.y > 0 && grid.z > 0) {
    BwdKernelParams<Traits> kp;
    kp.p = p;
    const bool varlen = a.is_varlen();
    const std::int64_t rows_q = varlen ? a.total_q : a.seqlen_q, rows_k = varlen ? a.total_k : a.seqlen_k;
    auto mQ = gmem_view<Element>(a.q, a.q_stride, a, rows_q, a.hdim, a.heads_q, kp.shape_q);
    auto mdO = gmem_view<Element>(a.dout, a.dout_stride, a, rows_q, a.hdim_v, a.heads_q, kp.shape_do);
    auto mK = gmem_view<Element>(a.k, a.k_stride, a, rows_k, a.hdim, a.heads_kv, kp.shape_k);
    auto mV = gmem_view<Element>(a.v, a.v_stride, a, rows_k, a.hdim_v, a.heads_kv, kp.shape_v);
    using QTile = Shape<Int<Traits::kBlockM>, Int<kHeadDim>>;
    using KTile = Shape<Int<Traits::kBlockN>, Int<kHeadDim>>;
    kp.tma_q = make_tma_copy(SM90_TMA_LOAD{}, mQ, take<0, 2>(typename Traits::SmemLayoutQ{}), QTile{}, _1{});
    kp.tma_do = make_tma_copy(SM90_TMA_LOAD{}, mdO, take<0, 2>(typename Traits::SmemLayoutdO{}), QTile{}, _1{});
    kp.tma_k = make_tma_copy(SM90_TMA_LOAD{}, mK, typename Traits::SmemLayoutKV{}, KTile{}, _1{});
    kp.tma_v = make_tma_copy(SM90_TMA_LOAD{}, mV, typename Traits::SmemLayoutKV{}, KTile{}, _1{});
    auto kernel = [] {
      if constexpr (kWide) return bwd_wide_kernel<Traits, V>;
      else return bwd_kernel<Traits, V>;
    }();
    constexpr int smem = Traits::kSmemBytes;
    if ((e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem)) != cudaSuccess) return e;
    kernel<<<grid, Traits::kThreads, smem, stream>>>(kp);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  if (p.seqlen_q_pad > 0 && batch > 0 && heads_q > 0) {
    const dim3 grid_c(static_cast<unsigned>(p.seqlen_q_pad / Traits::kBlockM), heads_q, batch);
    dq_convert_kernel<Traits><<<grid_c, 256, 0, stream>>>(p);
    e = cudaGetLastError();
  }
  return e;
}

}  // namespace flashtile::cuda::sm90
