// The runtime -> template switch, in one place: (dtype, head-dim bucket, variant) -> the explicit
// instantiation in src/cuda/instances/ (cuda-sm80 and cuda-sm90). Host code includes this header only; the
// switch itself is compiled by nvcc (kernel_switch.cu) against the list of instances this build compiled.
#pragma once

#include <cuda_runtime_api.h>

#include "common/params.h"
#include "decode/params.h"

namespace flashtile::cuda {

enum class Elem { fp16, bf16 };
// The kernels' element type of a 16-bit call.
inline Elem elem_of(DType t) { return t == DType::float16 ? Elem::fp16 : Elem::bf16; }
inline const char* elem_name(Elem e) { return e == Elem::fp16 ? "fp16" : "bf16"; }

// The kernel variant a call needs (common/mask.h): plain (no mask policy, no hook), masked (causal or window),
// hooks (softcap or ALiBi, with or without a mask).
enum class Kind { plain, masked, hooks };
Kind kind_of(const detail::AttnParams& p);
const char* kind_name(Kind k);

// Whether FLASHTILE_CUDA_KERNELS built the kernels of this dtype and bucket (every variant, both directions).
bool kernel_built(Elem dtype, int hdim_bucket);
// The list of built (dtype, bucket) pairs, e.g. "bf16:128 fp16:64", for messages.
const char* built_kernels();

cudaError_t launch_fwd(Elem dtype, int hdim_bucket, Kind kind, const FwdParams& p, cudaStream_t stream);
cudaError_t launch_bwd(Elem dtype, int hdim_bucket, Kind kind, const BwdParams& p, cudaStream_t stream);

// The cuda-sm90 kernels (built when FLASHTILE_CUDA_SM90 is on): the same questions for sm90's buckets.
bool sm90_kernel_built(Elem dtype, int hdim_bucket);
const char* sm90_built_kernels();
cudaError_t launch_fwd_sm90(Elem dtype, int hdim_bucket, Kind kind, const FwdParams& p, cudaStream_t stream);
bool sm90_bwd_kernel_built(Elem dtype, int hdim_bucket);
cudaError_t launch_bwd_sm90(Elem dtype, int hdim_bucket, Kind kind, const BwdParams& p, cudaStream_t stream);

// The KV-cache path (src/cuda/decode/): whether this build has the mma.sync (decode_) or wgmma (sm90_decode_)
// kernels of (dtype, bucket), and the call's decode on the one `mma` names, which also merges the splits
// (decode::run_check runs before it).
bool decode_built(Elem dtype, int hdim_bucket);
const char* decode_built_kernels();
bool sm90_decode_built(Elem dtype, int hdim_bucket);
const char* sm90_decode_built_kernels();
cudaError_t launch_kvcache(Elem dtype, int hdim_bucket, Kind kind, decode::DecodeMma mma,
                           const decode::DecodeParams& p, cudaStream_t stream);

}  // namespace flashtile::cuda
