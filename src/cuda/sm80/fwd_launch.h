// Host-side launcher of the forward kernel (included by the generated instance files only).
#pragma once

#include "sm80/fwd_kernel.h"
#include "sm80/launch.h"

namespace flashtile::cuda::sm80 {

template <class Element, int kHeadDim, class V>
cudaError_t run_fwd(const FwdParams& p, cudaStream_t stream) {
  using Traits = FwdTraits<Element, kHeadDim>;
  auto kernel = fwd_kernel<Traits, V>;
  constexpr int smem = Traits::kSmemBytes;
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
  }
  // seqlen_q is max_seqlen_q in a varlen call: CTAs beyond a shorter sequence exit at once.
  const dim3 grid(static_cast<unsigned>((p.a.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM),
                  static_cast<unsigned>(p.a.heads_q), static_cast<unsigned>(p.a.batch));
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return cudaSuccess;
  kernel<<<grid, Traits::kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace flashtile::cuda::sm80
