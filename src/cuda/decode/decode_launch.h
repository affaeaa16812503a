// The decode kernels' launchers (included by the generated instance files only): the mma.sync kernel with the
// 16-row or the 64-row tile, as the host's plan chose (p.rows_per_tile); decode_launch_sm90.h adds the wgmma one.
#pragma once

#include <algorithm>
#include <cstdint>

#include "decode/dependent_launch.h"
#include "decode/kernel.h"
#include "decode/launch.h"

namespace flashtile::cuda::decode {

// The grid every decode kernel runs on: x = row tiles x splits, y = KV heads, z = sequences.
template <class Kernel>
cudaError_t launch_grid(Kernel kernel, int smem, const DecodeParams& p, cudaStream_t stream, int threads = kThreads) {
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
  }
  // At least one CTA per sequence, with or without query rows or KV heads: the kernel appends and may publish the
  // check's verdict (p.row_tiles >= 1 from the host).
  const dim3 grid(static_cast<unsigned>(p.row_tiles * p.splits), static_cast<unsigned>(std::max<std::int64_t>(p.a.heads_kv, 1)),
                  static_cast<unsigned>(p.a.batch));
  if (grid.z == 0) return cudaSuccess;
  return launch_dependent(kernel, grid, threads, smem, stream, p);
}

template <class Element, int kHeadDim, class V>
cudaError_t run_decode(const DecodeParams& p, cudaStream_t stream) {
  if (p.rows_per_tile == kRowsPerTileTall) {
    using Tr = Traits<Element, kHeadDim, 4>;
    return launch_grid(decode_kernel<Tr, V>, Tr::kSmemBytes, p, stream);
  }
  using Tr = Traits<Element, kHeadDim, 1>;
  return launch_grid(decode_kernel<Tr, V>, Tr::kSmemBytes, p, stream);
}

}  // namespace flashtile::cuda::decode
