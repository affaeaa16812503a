// Merging attention results computed over disjoint parts of the keys: the step that split-KV decoding,
// context parallelism and a KV cache kept in pieces need after their partial calls.
//
// For parts i with results (out_i, lse_i) of forward() over key sets K_i (disjoint, their union K):
//   lse = log Σ_i exp(lse_i),    out = Σ_i exp(lse_i − lse) · out_i
// is forward()'s result over K (exactly, up to rounding). A part whose lse is −inf (it saw no key) contributes
// nothing; when every part is −inf the row gets out = 0 and lse = −inf, as forward() gives a row without keys.
// A NaN in any part's lse, or in the out of a part that contributes, reaches the merged row.
#pragma once

#include <span>

#include "flashtile/tensor.h"

namespace flashtile {

// outs[i]: [B, S, H, Dv] (or packed [T, H, Dv]) in float32, float16 or bfloat16, last dimension contiguous;
// lses[i]: [B, H, S] (or [H, T]) float32, any strides; out, lse: the same shapes and dtypes. out and lse may be
// the very tensors of one part (merged in place); any other overlap between outputs and inputs is refused.
// Host (CPU) tensors; the Python package's torch form (flashtile.merge_attention_states) runs on any device.
// Bad arguments throw the typed errors of errors.h naming the argument; a refused call writes nothing.
void merge_attention_states(std::span<const TensorView> outs, std::span<const TensorView> lses, const TensorView& out,
                            const TensorView& lse);

// The two-part form.
void merge_attention_states(const TensorView& out_a, const TensorView& lse_a, const TensorView& out_b,
                            const TensorView& lse_b, const TensorView& out, const TensorView& lse);

}  // namespace flashtile
