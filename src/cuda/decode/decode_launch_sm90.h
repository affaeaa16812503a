// The wgmma decode kernel's launcher (included by the generated sm90_decode_* instance files only, compiled for
// sm_90a): the 64-row tiles; the host sends calls of up to 16 rows to the mma.sync kernel (decode/host.cpp).
#pragma once

#include "decode/decode_launch.h"
#include "decode/kernel_sm90.h"

namespace flashtile::cuda::decode {

template <class Element, int kHeadDim, class V>
cudaError_t run_decode_sm90(const DecodeParams& p, cudaStream_t stream) {
  if (p.rows_per_tile != kRowsPerTileTall) return cudaErrorInvalidValue;
  using Tr = WgTraits<Element, kHeadDim>;
  return launch_grid(decode_wg_kernel<Tr, V>, Tr::kSmemBytes, p, stream, Tr::kCtaThreads);
}

}  // namespace flashtile::cuda::decode
