// Host-side launcher of the backward pass (included by the generated instance files only):
// clear the deterministic counters -> preprocess (also zeroes dq_accum) -> main kernel -> dQ conversion.
#pragma once

#include "sm80/bwd_aux.h"
#include "sm80/launch.h"

namespace flashtile::cuda::sm80 {

template <class Traits, class Mask>
cudaError_t run_bwd_with(const BwdParams& p, cudaStream_t stream) {
  using Element = typename Traits::Element;
  constexpr int kHeadDim = Traits::kHeadDim;
  const long long rows = static_cast<long long>(p.batch) * p.heads_q * p.seqlen_q_pad;
  cudaError_t e = cudaSuccess;
  if (p.deterministic) {
    e = cudaMemsetAsync(p.dq_semaphore, 0, static_cast<size_t>(rows / Traits::kBlockM) * sizeof(int), stream);
    if (e != cudaSuccess) return e;
  }
  // Also zeroes dq_accum (run_bwd's contract: the caller's workspace needs no clearing).
  constexpr int kRowsPerBlock = kAuxThreads / (kHeadDim / 8 <= 8 ? 8 : kHeadDim / 8 <= 16 ? 16 : 32);
  if (rows > 0) {
    const unsigned pre_blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
    bwd_preprocess_kernel<Element, kHeadDim><<<pre_blocks, kAuxThreads, 0, stream>>>(p);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }

  auto kernel = bwd_kernel<Traits, Mask>;
  constexpr int smem = Traits::kSmemBytes;
  if (smem > 48 * 1024) {
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
  }
  const dim3 grid((p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN, p.heads_kv, p.batch);
  if (grid.x > 0) {  // seqlen_k == 0: no key blocks, dQ = 0 from the cleared accumulator
    kernel<<<grid, Traits::kThreads, smem, stream>>>(p);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }

  if (p.seqlen_q > 0) {
    auto convert = dq_convert_kernel<Traits>;
    constexpr int smem_c = Traits::kSmemQ * int(sizeof(Element));
    if (smem_c > 48 * 1024) {
      e = cudaFuncSetAttribute(convert, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_c);
      if (e != cudaSuccess) return e;
    }
    const dim3 grid_c(p.seqlen_q_pad / Traits::kBlockM, p.heads_q, p.batch);
    convert<<<grid_c, Traits::kThreads, smem_c, stream>>>(p);
    e = cudaGetLastError();
  }
  return e;
}

// p.large_smem (set by the host from the device's opt-in limit) picks kBwdTilesLarge's entry where one exists.
template <class Element, int kHeadDim, class Mask>
cudaError_t run_bwd(const BwdParams& p, cudaStream_t stream) {
  if constexpr (has_large_bwd_tile(kHeadDim)) {
    if (p.large_smem) return run_bwd_with<BwdTraits<Element, kHeadDim, true>, Mask>(p, stream);
  }
  return run_bwd_with<BwdTraits<Element, kHeadDim>, Mask>(p, stream);
}

}  // namespace flashtile::cuda::sm80
