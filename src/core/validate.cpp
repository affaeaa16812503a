#include "core/validate.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "flashtile/errors.h"

namespace flashtile::detail {
namespace {

constexpr std::int64_t kMaxHeadDim = 256;

// The dims a view holds: its rank, clamped to what TensorView stores (a bad rank is reported, not read past).
int held_dims(const TensorView& t) { return std::clamp(t.rank, 0, static_cast<int>(t.shape.size())); }

std::string dims_str(const std::array<std::int64_t, 4>& x, int n) {
  std::ostringstream s;
  s << '[';
  for (int i = 0; i < n; ++i) s << (i ? ", " : "") << x[static_cast<std::size_t>(i)];
  s << ']';
  return s.str();
}
std::string shape_str(const TensorView& t) { return dims_str(t.shape, held_dims(t)); }
std::string stride_str(const TensorView& t) { return dims_str(t.stride, held_dims(t)); }

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

// Rank, sign of sizes and strides, contiguous last dim, 64-bit offsets, null data.
Span check_layout(const Arg& a, int rank) {
  const TensorView& t = a.t;
  if (t.rank != rank)
    fail<InvalidArgument>(a.name, ": expected ", rank, " dimensions ", a.layout, ", got ", t.rank, " (shape ",
                          shape_str(t), ")");
  for (int i = 0; i < rank; ++i) {
    const auto d = static_cast<std::size_t>(i);
    if (t.shape[d] < 0) fail<InvalidArgument>(a.name, ": negative size in shape ", shape_str(t));
    if (t.stride[d] < 0)
      fail<InvalidArgument>(a.name, ": negative strides are not supported, got strides ", stride_str(t));
  }
  const auto last = static_cast<std::size_t>(rank - 1);
  bool has_zero = false;
  for (int i = 0; i < rank; ++i) has_zero = has_zero || t.shape[static_cast<std::size_t>(i)] == 0;
  // A tensor without elements has no layout to speak of (numpy exports them with zero strides).
  if (!has_zero && t.shape[last] > 1 && t.stride[last] != 1)
    fail<InvalidArgument>(a.name, ": the last dimension must be contiguous (stride 1), got strides ",
                          stride_str(t), " for shape ", shape_str(t));
  // Largest element offset and element count, with overflow checks.
  std::int64_t max_off = 0, count = 1;
  bool empty = false;
  for (int i = 0; i < rank; ++i) {
    const auto d = static_cast<std::size_t>(i);
    if (t.shape[d] == 0) empty = true;
    std::int64_t term = 0;
    if (t.shape[d] > 0 && (__builtin_mul_overflow(t.shape[d] - 1, t.stride[d], &term) ||
                           __builtin_add_overflow(max_off, term, &max_off) ||
                           __builtin_mul_overflow(count, t.shape[d], &count)))
      fail<InvalidArgument>(a.name, ": shape ", shape_str(t), " with strides ", stride_str(t),
                            " overflows 64-bit element offsets");
  }
  std::int64_t max_byte = 0, end_off = 0;
  if (__builtin_add_overflow(max_off, 1, &end_off) ||
      __builtin_mul_overflow(end_off, static_cast<std::int64_t>(dtype_size(t.dtype)), &max_byte))
    fail<InvalidArgument>(a.name, ": shape ", shape_str(t), " with strides ", stride_str(t),
                          " overflows 64-bit byte offsets");
  if (empty) return {};
  if (t.data == nullptr) fail<InvalidArgument>(a.name, ": data pointer is null for shape ", shape_str(t));
  const auto lo = reinterpret_cast<std::uintptr_t>(t.data);
  // The kernels load whole elements (and vectors of them): an element must start at a multiple of its size.
  if (lo % dtype_size(t.dtype) != 0)
    fail<InvalidArgument>(a.name, ": data pointer ", t.data, " is not aligned to its ", dtype_size(t.dtype),
                          "-byte elements (", dtype_name(t.dtype), ")");
  std::uintptr_t hi = 0;
  if (__builtin_add_overflow(lo, static_cast<std::uintptr_t>(max_byte), &hi))
    fail<InvalidArgument>(a.name, ": shape ", shape_str(t), " at address ", t.data, " wraps the address space");
  return {lo, hi};
}

// An output whose elements alias each other would lose writes: sort dims by stride and require each
// stride to step over everything inside it.
void check_no_self_overlap(const Arg& a) {
  const TensorView& t = a.t;
  if (t.numel() == 0) return;
  std::vector<std::pair<std::int64_t, std::int64_t>> dims;  // (stride, size) of dims with size > 1
  for (int i = 0; i < t.rank; ++i) {
    const auto d = static_cast<std::size_t>(i);
    if (t.shape[d] > 1) dims.emplace_back(t.stride[d], t.shape[d]);
  }
  std::sort(dims.begin(), dims.end());
  std::int64_t extent = 1;  // elements spanned by the dims already visited
  for (const auto& [stride, size] : dims) {
    if (stride < extent)
      fail<InvalidArgument>(a.name, ": output strides ", stride_str(t), " for shape ", shape_str(t),
                            " make elements overlap; outputs need one element per index");
    extent = stride * (size - 1) + extent;
  }
}

void check_dtype(const Arg& a, DType want, const char* because) {
  if (a.t.dtype != want)
    fail<DTypeError>(a.name, ": dtype ", dtype_name(a.t.dtype), " does not match ", because, " (",
                     dtype_name(want), ")");
}

void check_same_device(const Arg& a, const TensorView& q) {
  if (a.t.device != q.device || a.t.device_index != q.device_index)
    fail<DeviceError>(a.name, ": on ", device_name(a.t.device), ":", a.t.device_index, " but q is on ",
                      device_name(q.device), ":", q.device_index, "; all tensors must be on one device");
}

void check_dims(const Arg& a, std::initializer_list<std::int64_t> want) {
  std::size_t i = 0;
  for (std::int64_t w : want) {
    if (a.t.shape[i] != w) {
      std::ostringstream s;
      s << '[';
      std::size_t j = 0;
      for (std::int64_t x : want) s << (j++ ? ", " : "") << x;
      s << ']';
      fail<InvalidArgument>(a.name, ": expected shape ", s.str(), " ", a.layout, ", got ", shape_str(a.t));
    }
    ++i;
  }
}

Strides bshd(const TensorView& t) { return {t.stride[0], t.stride[1], t.stride[2]}; }
Strides bhs(const TensorView& t) { return {t.stride[0], t.stride[2], t.stride[1]}; }

struct Checked {
  AttnParams p;
  std::vector<std::pair<const char*, Span>> inputs, outputs;
};

// q, k, v (+ dout) sizes, dtypes, devices, and the options.
Checked check_inputs(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView* dout,
                     const Options& o) {
  Checked c;
  const Arg aq{"q", q, "[B, Sq, Hq, D]", false}, ak{"k", k, "[B, Sk, Hkv, D]", false},
      av{"v", v, "[B, Sk, Hkv, Dv]", false};
  c.inputs.emplace_back("q", check_layout(aq, 4));
  c.inputs.emplace_back("k", check_layout(ak, 4));
  c.inputs.emplace_back("v", check_layout(av, 4));
  AttnParams& p = c.p;
  p.batch = q.shape[0];
  p.seqlen_q = q.shape[1];
  p.heads_q = q.shape[2];
  p.hdim = q.shape[3];
  p.seqlen_k = k.shape[1];
  p.heads_kv = k.shape[2];
  p.hdim_v = v.shape[3];
  if (p.hdim < 1 || p.hdim > kMaxHeadDim)
    fail<InvalidArgument>("q: head dim D = ", p.hdim, " is out of range [1, ", kMaxHeadDim, "] (shape ",
                          shape_str(q), ")");
  if (k.shape[0] != p.batch || k.shape[3] != p.hdim)
    fail<InvalidArgument>("k: expected [B, Sk, Hkv, D] with B = ", p.batch, " and D = ", p.hdim,
                          " from q ", shape_str(q), ", got ", shape_str(k));
  if (p.hdim_v < 1 || p.hdim_v > kMaxHeadDim)
    fail<InvalidArgument>("v: head dim Dv = ", p.hdim_v, " is out of range [1, ", kMaxHeadDim, "] (shape ",
                          shape_str(v), ")");
  check_dims(av, {p.batch, p.seqlen_k, p.heads_kv, p.hdim_v});
  if (p.heads_kv == 0 ? p.heads_q != 0 : p.heads_q % p.heads_kv != 0)
    fail<InvalidArgument>("k: query heads Hq = ", p.heads_q, " must be a multiple of key/value heads Hkv = ",
                          p.heads_kv);
  check_dtype(ak, q.dtype, "q's dtype");
  check_dtype(av, q.dtype, "q's dtype");
  check_same_device(ak, q);
  check_same_device(av, q);
  if (dout != nullptr) {
    const Arg ad{"dout", *dout, "[B, Sq, Hq, Dv]", false};
    c.inputs.emplace_back("dout", check_layout(ad, 4));
    check_dims(ad, {p.batch, p.seqlen_q, p.heads_q, p.hdim_v});
    check_dtype(ad, q.dtype, "q's dtype");
    check_same_device(ad, q);
    p.dout = dout->data;
    p.dout_stride = bshd(*dout);
  }
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.q_stride = bshd(q);
  p.k_stride = bshd(k);
  p.v_stride = bshd(v);
  p.dtype = q.dtype;
  p.device = q.device;
  p.device_index = q.device_index;
  const float scale = o.softmax_scale ? *o.softmax_scale : 1.0f / std::sqrt(static_cast<float>(p.hdim));
  if (!std::isfinite(scale))
    fail<InvalidArgument>("softmax_scale: must be finite, got ", scale);
  if (o.num_threads < 0) fail<InvalidArgument>("num_threads: must be >= 0, got ", o.num_threads);
  p.softmax_scale = scale;
  p.causal = o.causal;
  p.deterministic = o.deterministic;
  p.num_threads = o.num_threads;
  p.cuda_stream = o.cuda_stream;
  if (o.workspace_bytes > 0 && o.workspace == nullptr)
    fail<InvalidArgument>("workspace: null pointer with workspace_bytes = ", o.workspace_bytes);
  if (reinterpret_cast<std::uintptr_t>(o.workspace) % 256 != 0)
    fail<InvalidArgument>("workspace: ", o.workspace, " is not 256-byte aligned");
  p.workspace = o.workspace_bytes > 0 ? o.workspace : nullptr;
  p.workspace_bytes = p.workspace != nullptr ? o.workspace_bytes : 0;
  p.workspace_alloc = o.workspace_alloc;
  p.workspace_alloc_context = o.workspace_alloc_context;
  p.device_pointers_checked = o.device_pointers_checked;
  return c;
}

void check_output(Checked& c, const Arg& a, int rank, std::initializer_list<std::int64_t> dims, DType dtype,
                  const char* dtype_because, const TensorView& q) {
  c.outputs.emplace_back(a.name, check_layout(a, rank));
  check_dims(a, dims);
  check_dtype(a, dtype, dtype_because);
  check_same_device(a, q);
  check_no_self_overlap(a);
}

// Outputs must not share bytes with any input or with each other, or writes would be lost.
void check_no_aliasing(const Checked& c) {
  auto overlap = [](Span x, Span y) { return x.lo < x.hi && y.lo < y.hi && x.lo < y.hi && y.lo < x.hi; };
  for (std::size_t i = 0; i < c.outputs.size(); ++i) {
    for (const auto& [name, span] : c.inputs)
      if (overlap(c.outputs[i].second, span))
        fail<InvalidArgument>(c.outputs[i].first, ": output memory overlaps input ", name);
    for (std::size_t j = i + 1; j < c.outputs.size(); ++j)
      if (overlap(c.outputs[i].second, c.outputs[j].second))
        fail<InvalidArgument>(c.outputs[i].first, ": output memory overlaps output ", c.outputs[j].first);
  }
}

}  // namespace

AttnParams validate_inputs(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView* dout,
                           const Options& options) {
  return check_inputs(q, k, v, dout, options).p;
}

AttnParams validate_forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                            const TensorView& lse, const Options& options) {
  Checked c = check_inputs(q, k, v, nullptr, options);
  AttnParams& p = c.p;
  check_output(c, {"out", out, "[B, Sq, Hq, Dv]", true}, 4, {p.batch, p.seqlen_q, p.heads_q, p.hdim_v}, q.dtype,
               "q's dtype", q);
  check_output(c, {"lse", lse, "[B, Hq, Sq]", true}, 3, {p.batch, p.heads_q, p.seqlen_q}, DType::float32,
               "the required float32", q);
  check_no_aliasing(c);
  p.out = out.data;
  p.lse = static_cast<float*>(lse.data);
  p.out_stride = bshd(out);
  p.lse_stride = bhs(lse);
  return p;
}

AttnParams validate_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                             const TensorView& dout, const TensorView& lse, const TensorView& dq,
                             const TensorView& dk, const TensorView& dv, const Options& options) {
  Checked c = check_inputs(q, k, v, &dout, options);
  AttnParams& p = c.p;
  // out and lse are inputs of the backward pass.
  const Arg ao{"out", out, "[B, Sq, Hq, Dv]", false}, al{"lse", lse, "[B, Hq, Sq]", false};
  c.inputs.emplace_back("out", check_layout(ao, 4));
  check_dims(ao, {p.batch, p.seqlen_q, p.heads_q, p.hdim_v});
  check_dtype(ao, q.dtype, "q's dtype");
  check_same_device(ao, q);
  c.inputs.emplace_back("lse", check_layout(al, 3));
  check_dims(al, {p.batch, p.heads_q, p.seqlen_q});
  check_dtype(al, DType::float32, "the required float32");
  check_same_device(al, q);
  check_output(c, {"dq", dq, "[B, Sq, Hq, D]", true}, 4, {p.batch, p.seqlen_q, p.heads_q, p.hdim}, q.dtype,
               "q's dtype", q);
  check_output(c, {"dk", dk, "[B, Sk, Hkv, D]", true}, 4, {p.batch, p.seqlen_k, p.heads_kv, p.hdim}, q.dtype,
               "q's dtype", q);
  check_output(c, {"dv", dv, "[B, Sk, Hkv, Dv]", true}, 4, {p.batch, p.seqlen_k, p.heads_kv, p.hdim_v},
               q.dtype, "q's dtype", q);
  check_no_aliasing(c);
  p.backward = true;
  p.out = out.data;
  p.lse = static_cast<float*>(lse.data);
  p.out_stride = bshd(out);
  p.lse_stride = bhs(lse);
  p.dq = dq.data;
  p.dk = dk.data;
  p.dv = dv.data;
  p.dq_stride = bshd(dq);
  p.dk_stride = bshd(dk);
  p.dv_stride = bshd(dv);
  return p;
}

}  // namespace flashtile::detail
