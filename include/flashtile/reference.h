// The float64 oracle: materialises S and P with plain loops. Slow and quadratic in memory on purpose;
// every backend is tested against it. Inputs may have any dtype and strides the API accepts.
#pragma once

#include <cstdint>
#include <vector>

#include "flashtile/options.h"
#include "flashtile/tensor.h"

namespace flashtile::reference {

// Layouts below are the batched ones; in a varlen call (Options::cu_seqlens_q given) B reads 1 and the rows are
// the packed rows: out [rows.size(), Hq, Dv], lse [Hq, rows.size()], dq [total_q, Hq, D], dk [total_k, Hkv, D].
struct ForwardResult {
  std::vector<std::int64_t> rows;  // query rows computed (all rows unless sampled)
  std::vector<double> out;         // [B, rows.size(), Hq, Dv], contiguous
  std::vector<double> lse;         // [B, Hq, rows.size()], contiguous; -inf for rows with no visible key (no sink)
};

struct BackwardResult {
  std::vector<double> dq;      // [B, Sq, Hq, D]
  std::vector<double> dk;      // [B, Sk, Hkv, D]; 0 for keys a sequence does not use (seqused_k)
  std::vector<double> dv;      // [B, Sk, Hkv, Dv]
  std::vector<double> dsinks;  // [Hq] with Options::sinks, else empty
};

// All query rows.
ForwardResult forward(const TensorView& q, const TensorView& k, const TensorView& v, const Options& options = {});

// Only the given query rows (for long sequences: cost O(rows · Sk) per head); packed row indices in varlen.
ForwardResult forward_rows(const TensorView& q, const TensorView& k, const TensorView& v,
                           const std::vector<std::int64_t>& rows, const Options& options = {});

// Exact gradients; the forward is recomputed in float64 internally.
BackwardResult backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dout,
                        const Options& options = {});

}  // namespace flashtile::reference
