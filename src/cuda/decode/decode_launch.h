// The decode kernel's launcher (included by the generated instance files only): the 16-row or the 64-row tile,
// as the host's plan chose (p.rows_per_tile).
#pragma once

#include <algorithm>
#include <cstdint>

#include "decode/dependent_launch.h"
#include "decode/kernel.h"
#include "decode/launch.h"

namespace flashtile::cuda::decode {

template <class Tr, class V>
cudaError_t launch_decode(const DecodeParams& p, cudaStream_t stream) {
  auto kernel = decode_kernel<Tr, V>;
  constexpr int smem = Tr::kSmemBytes;
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
  }
  // At least one CTA per sequence, with or without query rows or KV heads: the kernel appends and may publish the
  // check's verdict (p.row_tiles >= 1 from the host).
  const dim3 grid(static_cast<unsigned>(p.row_tiles * p.splits), static_cast<unsigned>(std::max<std::int64_t>(p.a.heads_kv, 1)),
                  static_cast<unsigned>(p.a.batch));
  if (grid.z == 0) return cudaSuccess;
  return launch_dependent(kernel, grid, kThreads, smem, stream, p);
}

template <class Element, int kHeadDim, class V>
cudaError_t run_decode(const DecodeParams& p, cudaStream_t stream) {
  if (p.rows_per_tile == kRowsPerTileTall) return launch_decode<Traits<Element, kHeadDim, 4>, V>(p, stream);
  return launch_decode<Traits<Element, kHeadDim, 1>, V>(p, stream);
}

}  // namespace flashtile::cuda::decode
