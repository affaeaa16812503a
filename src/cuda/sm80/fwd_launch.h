// Host-side launcher of the forward kernel (included by the generated instance files only).
#pragma once

#include "sm80/fwd_kernel.h"
#include "sm80/launch.h"

namespace flashtile::cuda::sm80 {

template <class Element, int kHeadDim, class Mask>
cudaError_t run_fwd(const FwdParams& p, cudaStream_t stream) {
  using Traits = FwdTraits<Element, kHeadDim>;
  auto kernel = fwd_kernel<Traits, Mask>;
  constexpr int smem = Traits::kSmemBytes;
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
  }
  const dim3 grid((p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM, p.heads_q, p.batch);
  kernel<<<grid, Traits::kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace flashtile::cuda::sm80
