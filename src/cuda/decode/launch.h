// Host-side launchers of the decode path (no CuTe: kernel_switch.cu and the generated instances include it).
#pragma once

#include <cuda_runtime_api.h>

#include "decode/params.h"

namespace flashtile::cuda {
template <bool kMasked, bool kHooks>
struct Variant;
}  // namespace flashtile::cuda

namespace flashtile::cuda::decode {

// Resets the status and the split counts and runs the device-side index check: one CTA in one launch while the
// checks fit it (it also publishes the verdict; params.h check_in_one_cta), else a memset and a grid-wide kernel (the
// decode kernel then publishes).
cudaError_t run_check(const DecodeParams& p, cudaStream_t stream);  // aux.cu
// The decode kernel (decode/kernel.h); explicit instantiations in src/cuda/instances/decode_*.cu.
template <class Element, int kHeadDim, class V>
cudaError_t run_decode(const DecodeParams& p, cudaStream_t stream);
// The wgmma decode kernel of the 64-row tiles (decode/kernel_sm90.h); instantiations in sm90_decode_*.cu (sm_90a).
template <class Element, int kHeadDim, class V>
cudaError_t run_decode_sm90(const DecodeParams& p, cudaStream_t stream);

}  // namespace flashtile::cuda::decode
