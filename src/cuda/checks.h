// What the CUDA backends (cuda-sm80, cuda-sm90) share on the host: the can_run checks (the device, the device
// pointers, dtype, head dims, scale, sizes, the variants no CUDA kernel runs yet, 16-byte alignment of the 16-bit
// operands; each backend adds its own: compute capability, its buckets, shared memory) and the kernels' params.
#pragma once

#include "core/backend.h"
#include "common/params.h"
#include "runtime/runtime.h"

namespace flashtile::cuda {

// Appends a reason per failed check. Returns the call's device, or null when there is none to run on (the
// tensors are not on a CUDA device, or it does not exist), after which nothing else was checked.
const Gpu* check_common(const detail::AttnParams& p, const char* backend, detail::Reasons& why);

// The kernels' parameters from the call's: AttnParams whole, plus the folded constants. The one normalisation:
// causal is window right = 0 (with any left), which validation already writes; repeated here so that the masked
// kernels never depend on it.
void fill_params(const detail::AttnParams& p, FwdParams& f);

}  // namespace flashtile::cuda
