// Host-side launcher of the backward pass (included by the generated instance files only):
// clear the deterministic counters -> preprocess (also zeroes dq_accum) -> [sink gradient] -> main kernel ->
// dQ conversion.
#pragma once

#include "sm80/bwd_aux.h"
#include "sm80/launch.h"

namespace flashtile::cuda::sm80 {

template <class Traits, class V>
cudaError_t run_bwd_with(const BwdParams& p, cudaStream_t stream) {
  using Element = typename Traits::Element;
  constexpr int kHeadDim = Traits::kHeadDim;
  if (p.block_m != Traits::kBlockM || p.hdim_pad != kHeadDim) return cudaErrorInvalidValue;  // host plan mismatch
  const auto batch = static_cast<unsigned>(p.a.batch), heads_q = static_cast<unsigned>(p.a.heads_q);
  cudaError_t e = cudaSuccess;
  if (p.a.deterministic && p.ws_slots > 0) {
    e = cudaMemsetAsync(p.dq_semaphore, 0, static_cast<size_t>(p.ws_slots / Traits::kBlockM) * sizeof(int), stream);
    if (e != cudaSuccess) return e;
  }
  // Also zeroes dq_accum (run_bwd's contract: the caller's workspace needs no clearing).
  constexpr int kRowsPerBlock = kAuxThreads / (kHeadDim / 8 <= 8 ? 8 : kHeadDim / 8 <= 16 ? 16 : 32);
  if (p.seqlen_q_pad > 0 && batch > 0 && heads_q > 0) {
    const dim3 pre_grid(static_cast<unsigned>((p.seqlen_q_pad + kRowsPerBlock - 1) / kRowsPerBlock), heads_q, batch);
    bwd_preprocess_kernel<Element, kHeadDim><<<pre_grid, kAuxThreads, 0, stream>>>(p);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  // dsinks: every head gets its value (0 when no row exists).
  if (p.sink_terms != nullptr && p.a.dsinks != nullptr && heads_q > 0) {
    sink_grad_kernel<kAuxThreads><<<heads_q, kAuxThreads, 0, stream>>>(p);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }

  auto kernel = bwd_kernel<Traits, V>;
  constexpr int smem = Traits::kSmemBytes;
  if (smem > 48 * 1024) {
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
  }
  // seqlen_k is max_seqlen_k in a varlen call: CTAs beyond a shorter sequence exit at once.
  const dim3 grid(static_cast<unsigned>((p.a.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN),
                  static_cast<unsigned>(p.a.heads_kv), batch);
  if (grid.x > 0 && grid.y > 0 && grid.z > 0) {  // no key blocks: dQ = 0 from the cleared accumulator
    kernel<<<grid, Traits::kThreads, smem, stream>>>(p);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }

  if (p.seqlen_q_pad > 0 && batch > 0 && heads_q > 0) {
    auto convert = dq_convert_kernel<Traits>;
    constexpr int smem_c = Traits::kSmemQ * int(sizeof(Element));
    if (smem_c > 48 * 1024) {
      e = cudaFuncSetAttribute(convert, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_c);
      if (e != cudaSuccess) return e;
    }
    const dim3 grid_c(static_cast<unsigned>(p.seqlen_q_pad / Traits::kBlockM), heads_q, batch);
    convert<<<grid_c, Traits::kThreads, smem_c, stream>>>(p);
    e = cudaGetLastError();
  }
  return e;
}

// p.large_smem (set by the host from the device's opt-in limit) picks kBwdTilesLarge's entry where one exists.
template <class Element, int kHeadDim, class V>
cudaError_t run_bwd(const BwdParams& p, cudaStream_t stream) {
  if constexpr (has_large_bwd_tile(kHeadDim)) {
    if (p.large_smem) return run_bwd_with<BwdTraits<Element, kHeadDim, true>, V>(p, stream);
  }
  return run_bwd_with<BwdTraits<Element, kHeadDim>, V>(p, stream);
}

}  // namespace flashtile::cuda::sm80
