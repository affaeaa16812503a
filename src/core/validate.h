// Argument validation, in one place. Turns the public views into AttnParams or throws a typed error
// whose message names the argument and the values it got.
#pragma once

#include "core/params.h"
#include "flashtile/kvcache.h"
#include "flashtile/options.h"
#include "flashtile/tensor.h"

namespace flashtile::detail {

AttnParams validate_forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                            const TensorView& lse, const Options& options);

AttnParams validate_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                             const TensorView& dout, const TensorView& lse, const TensorView& dq,
                             const TensorView& dk, const TensorView& dv, const Options& options);

// forward_kvcache's arguments (kvcache.h); host index tensors' values are checked too.
AttnParams validate_kvcache(const TensorView& q, const KVCache& cache, const TensorView& out, const TensorView& lse,
                            const Options& options);

// Inputs only (the reference oracle has no output tensors): q, k, v and optionally dout.
AttnParams validate_inputs(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView* dout,
                           const Options& options);

}  // namespace flashtile::detail
