// The argument checks that validate.cpp (forward, backward) and validate_kvcache.cpp (forward_kvcache) share:
// each takes a named view and throws the typed error of errors.h that names the argument and the value.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/params.h"
#include "flashtile/errors.h"
#include "flashtile/options.h"
#include "flashtile/tensor.h"

namespace flashtile::detail::args {

using detail::kMaxHeadDim;  // core/params.h

template <class E, class... Args>
[[noreturn]] void fail(const Args&... args) {
  std::ostringstream s;
  (s << ... << args);
  throw E(s.str());
}

// A named tensor argument and the layout it must have.
struct Arg {
  const char* name;
  const TensorView& t;
  const char* layout;  // "[B, Sq, Hq, D]"
  bool output;
};

// Byte span [lo, hi) that a view can touch; empty when it has no elements.
struct Span {
  std::uintptr_t lo = 0, hi = 0;
};

// Strides of a q-like operand: [B, S, H, D] (rank 4) or packed [total, H, D] (rank 3, varlen: batch stride 0).
inline Strides rows_of(const TensorView& t) {
  return t.rank == 3 ? Strides{0, t.stride[0], t.stride[1]} : Strides{t.stride[0], t.stride[1], t.stride[2]};
}

// Strides of lse: [B, Hq, Sq] (rank 3) or [Hq, total_q] (rank 2, varlen).
inline Strides lse_of(const TensorView& t) {
  return t.rank == 2 ? Strides{0, t.stride[1], t.stride[0]} : Strides{t.stride[0], t.stride[2], t.stride[1]};
}

inline bool present(const TensorView& t) { return t.data != nullptr || t.rank != 0; }

struct Checked {
  AttnParams p;
  bool varlen = false;
  std::vector<std::pair<const char*, Span>> inputs, outputs;
  // The expected shape of a q-like / k-like operand with last dim `dim`, and of lse, in this call's mode.
  std::vector<std::int64_t> q_like(std::int64_t dim) const {
    return varlen ? std::vector<std::int64_t>{p.total_q, p.heads_q, dim}
                  : std::vector<std::int64_t>{p.batch, p.seqlen_q, p.heads_q, dim};
  }
  std::vector<std::int64_t> k_like(std::int64_t dim) const {
    return varlen ? std::vector<std::int64_t>{p.total_k, p.heads_kv, dim}
                  : std::vector<std::int64_t>{p.batch, p.seqlen_k, p.heads_kv, dim};
  }
  std::vector<std::int64_t> lse_dims() const {
    return varlen ? std::vector<std::int64_t>{p.heads_q, p.total_q}
                  : std::vector<std::int64_t>{p.batch, p.heads_q, p.seqlen_q};
  }
  int rank() const { return varlen ? 3 : 4; }
  const char* q_layout(bool dv) const {
    return varlen ? (dv ? "[total_q, Hq, Dv]" : "[total_q, Hq, D]") : (dv ? "[B, Sq, Hq, Dv]" : "[B, Sq, Hq, D]");
  }
  const char* k_layout(bool dv) const {
    return varlen ? (dv ? "[total_k, Hkv, Dv]" : "[total_k, Hkv, D]") : (dv ? "[B, Sk, Hkv, Dv]" : "[B, Sk, Hkv, D]");
  }
  const char* lse_layout() const { return varlen ? "[Hq, total_q]" : "[B, Hq, Sq]"; }
};

std::string dims_str(const std::vector<std::int64_t>& x);
std::string shape_str(const TensorView& t);
std::string stride_str(const TensorView& t);

// Rank, sign of sizes and strides, contiguous last dim, 64-bit offsets, null data, element alignment; the bytes
// the view can touch.
Span check_layout(const Arg& a, int rank);
// An output whose elements alias each other would lose writes.
void check_no_self_overlap(const Arg& a);
void check_dtype(const Arg& a, DType want, const char* because);
void check_same_device(const Arg& a, const TensorView& q);
void check_dims(const Arg& a, const std::vector<std::int64_t>& want);
// The operands hold floating-point elements; int32 is for index tensors only.
void check_float(const Arg& a);
// An int32 index vector of `n` entries on the operands' device.
Span check_index(const Arg& a, const TensorView& q, std::int64_t n);
// Before validation reads an index tensor's values on the host: refuses CUDA memory declared cpu.
void check_host_readable(const char* name, const TensorView& t);
// Entry i of an int32 vector in host memory.
std::int32_t entry(const TensorView& t, std::int64_t i);
// The options every call takes (scale, causal/window, softcap, ALiBi, sinks, threads, stream, workspace); p's
// shapes (batch, heads, hdim) must be set.
void check_options(Checked& c, const Options& o, const TensorView& q);
void check_dsinks(Checked& c, const Options& o, const TensorView& q);
void check_output(Checked& c, const Arg& a, int rank, const std::vector<std::int64_t>& dims, DType dtype,
                  const char* dtype_because, const TensorView& q);
// Outputs must not share bytes with any input or with each other, or writes would be lost.
void check_no_aliasing(const Checked& c);

}  // namespace flashtile::detail::args
