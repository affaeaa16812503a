// Programmatic dependent launch (compute capability 9.0) for the decode path's two kernels: the index check lets
// the decode kernel start launching while it runs, and the decode kernel waits for the check's completion (and the
// visibility of its writes) before it reads anything the check wrote. A decode step is short, so the launch latency
// this hides is a noticeable part of it. CUDA sources only (the launch is the runtime's C++ template).
#pragma once

#include <cuda_runtime.h>

#include "decode/params.h"

namespace flashtile::cuda::decode {

// Device side; both are no-ops without a programmatic dependency and compile to nothing for sm_80.
__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(p), programmatically dependent on the stream's previous kernel when
// p.dependent_launch (set by the host on compute capability >= 9.0).
template <class Kernel>
cudaError_t launch_dependent(Kernel kernel, dim3 grid, dim3 block, int smem, cudaStream_t stream,
                             const DecodeParams& p) {
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = static_cast<std::size_t>(smem);
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = p.dependent_launch ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, p);
}

}  // namespace flashtile::cuda::decode
