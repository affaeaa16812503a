// Host-side launcher of the backward pass (included by the generated instance files only):
// clear dq_accum (and the deterministic counters) -> preprocess -> main kernel -> dQ conversion.
#pragma once

#include "sm80/bwd_aux.h"
#include "sm80/launch.h"

namespace flashtile::cuda::sm80 {

template <class Element, int kHeadDim, class Mask>
cudaError_t run_bwd(const BwdParams& p, cudaStream_t stream) {
  using Traits = BwdTraits<Element, kHeadDim>;
  const long long rows = static_cast<long long>(p.batch) * p.heads_q * p.seqlen_q_pad;
  cudaError_t e = cudaMemsetAsync(p.dq_accum, 0, static_cast<size_t>(rows) * p.hdim_pad * sizeof(float), stream);
  if (e != cudaSuccess) return e;
  if (p.deterministic) {
    e = cudaMemsetAsync(p.dq_semaphore, 0, static_cast<size_t>(rows / Traits::kBlockM) * sizeof(int), stream);
    if (e != cudaSuccess) return e;
  }
  const unsigned pre_blocks = static_cast<unsigned>((rows * 32 + kAuxThreads - 1) / kAuxThreads);
  bwd_preprocess_kernel<Element><<<pre_blocks, kAuxThreads, 0, stream>>>(p);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;

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

}  // namespace flashtile::cuda::sm80
