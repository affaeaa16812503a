// The can_run checks every CUDA backend shares (cuda-sm80, cuda-sm90): the device, the device pointers,
// dtype, head dims, scale, sizes, the variants no CUDA kernel runs yet, and 16-byte alignment of the 16-bit
// operands. Each backend adds its own (compute capability, its buckets, shared memory).
#pragma once

#include "core/backend.h"
#include "runtime/runtime.h"

namespace flashtile::cuda {

// Appends a reason per failed check. Returns the call's device, or null when there is none to run on (the
// tensors are not on a CUDA device, or it does not exist), after which nothing else was checked.
const Gpu* check_common(const detail::AttnParams& p, const char* backend, detail::Reasons& why);

}  // namespace flashtile::cuda
