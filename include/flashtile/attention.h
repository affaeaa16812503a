// The FlashTile entry points.
//
// Layouts (any strides on the first dims, last dim contiguous):
//   q [B, Sq, Hq, D]   k [B, Sk, Hkv, D]   v [B, Sk, Hkv, Dv]   out [B, Sq, Hq, Dv]   lse [B, Hq, Sq] float32
// Hq % Hkv == 0 (GQA / MQA), 1 <= D, Dv <= 256. Outputs are caller-allocated and fully written.
#pragma once

#include <cstddef>

#include "flashtile/dispatch.h"
#include "flashtile/errors.h"
#include "flashtile/options.h"
#include "flashtile/tensor.h"

namespace flashtile {

// out = softmax(scale · q kᵀ [masked]) v, and lse = log Σ exp(scale · q kᵀ) per query row.
DispatchReport forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                       const TensorView& lse, const Options& options = {});

// Gradients of forward's out with respect to q, k, v given dout; recomputes the scores from q, k and lse.
// dk and dv sum over the query heads that share a KV head.
DispatchReport backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                        const TensorView& dout, const TensorView& lse, const TensorView& dq,
                        const TensorView& dk, const TensorView& dv, const Options& options = {});

// Which kernel forward / backward would run for these arguments, and why the others are refused.
// Validates the arguments like the real call (invalid arguments throw); touches no data. When nothing
// would run (or strict mode would refuse), the report's `ran.backend` is empty instead of throwing.
DispatchReport explain_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& lse, const Options& options = {});
DispatchReport explain_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& out, const TensorView& dout, const TensorView& lse,
                                const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                const Options& options = {});

// Bytes of scratch memory the backward that these arguments select needs (0 for CPU backends); pass that much
// as Options::workspace to make the backward allocate nothing. Validates like backward() (bad arguments throw).
std::size_t backward_workspace_bytes(const TensorView& q, const TensorView& k, const TensorView& v,
                                     const TensorView& out, const TensorView& dout, const TensorView& lse,
                                     const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                     const Options& options = {});

// The report of the last forward/backward call made on this thread.
const DispatchReport& last_dispatch();

// Names of every backend compiled into this build, in auto-dispatch priority order.
std::vector<std::string> backend_names();

// CPU kernel paths ("scalar", "avx2", "avx512") this build has and this CPU can execute, and the one
// cpu-flash uses now (the best, or FLASHTILE_CPU_ISA's choice).
std::vector<std::string> cpu_isa_paths();
std::string cpu_isa_selected();

}  // namespace flashtile
