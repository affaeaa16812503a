#include "core/validate.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "flashtile/errors.h"
#if FLASHTILE_WITH_CUDA
#include "cuda/pointer_check.h"
#endif

namespace flashtile::detail {
namespace {

constexpr std::int64_t kMaxHeadDim = 256;

// The dims a view holds: its rank, clamped to what TensorView stores (a bad rank is reported, not read past).
int held_dims(const TensorView& t) { return std::clamp(t.rank, 0, static_cast<int>(t.shape.size())); }

std::string dims_str(const std::vector<std::int64_t>& x) {
  std::ostringstream s;
  s << '[';
  for (std::size_t i = 0; i < x.size(); ++i) s << (i ? ", " : "") << x[i];
  s << ']';
  return s.str();
}
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

void check_dims(const Arg& a, const std::vector<std::int64_t>& want) {
  for (std::size_t i = 0; i < want.size(); ++i)
    if (a.t.shape[i] != want[i])
      fail<InvalidArgument>(a.name, ": expected shape ", dims_str(want), " ", a.layout, ", got ", shape_str(a.t));
}

// Strides of a q-like operand: [B, S, H, D] (rank 4) or packed [total, H, D] (rank 3, varlen: batch stride 0).
Strides rows_of(const TensorView& t) {
  return t.rank == 3 ? Strides{0, t.stride[0], t.stride[1]} : Strides{t.stride[0], t.stride[1], t.stride[2]};
}
// Strides of lse: [B, Hq, Sq] (rank 3) or [Hq, total_q] (rank 2, varlen).
Strides lse_of(const TensorView& t) {
  return t.rank == 2 ? Strides{0, t.stride[1], t.stride[0]} : Strides{t.stride[0], t.stride[2], t.stride[1]};
}

bool present(const TensorView& t) { return t.data != nullptr || t.rank != 0; }

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

// The operands hold floating-point elements; int32 is for index tensors only.
void check_float(const Arg& a) {
  if (a.t.dtype == DType::int32)
    fail<DTypeError>(a.name, ": dtype int32 is not a floating-point type; attention operands take float32, ",
                     "float16 or bfloat16");
}

// --- The variants' options, one small check each (window, softcap, ALiBi, sinks, varlen, seqused_k). ---

void check_window(const Options& o, AttnParams& p) {
  for (int side = 0; side < 2; ++side)
    if (o.window_size[static_cast<std::size_t>(side)] < -1)
      fail<InvalidArgument>("window_size: ", side == 0 ? "left" : "right", " = ",
                            o.window_size[static_cast<std::size_t>(side)],
                            " is below -1 (-1 = unbounded, else a number of keys >= 0); got (", o.window_size[0],
                            ", ", o.window_size[1], ")");
  p.window_left = o.window_size[0];
  p.window_right = o.causal ? 0 : o.window_size[1];  // causal is the window (left, 0)
}

void check_softcap(const Options& o, AttnParams& p) {
  if (!std::isfinite(o.softcap) || o.softcap < 0.0f)
    fail<InvalidArgument>("softcap: must be finite and >= 0 (0 = off), got ", o.softcap);
  p.softcap = o.softcap;
}

// A float32 vector option on the operands' device with one of the given shapes.
Span check_vector(const Arg& a, const TensorView& q, std::initializer_list<std::vector<std::int64_t>> shapes) {
  check_dtype(a, DType::float32, "the required float32");
  check_same_device(a, q);
  std::ostringstream accepted;
  for (const auto& want : shapes) accepted << (accepted.tellp() > 0 ? " or " : "") << dims_str(want);
  for (const auto& want : shapes) {
    if (a.t.rank != static_cast<int>(want.size())) continue;
    const Span span = check_layout(a, a.t.rank);
    if (!std::equal(want.begin(), want.end(), a.t.shape.begin())) break;
    return span;
  }
  fail<InvalidArgument>(a.name, ": expected shape ", accepted.str(), " ", a.layout, ", got ", shape_str(a.t));
}

void check_alibi(Checked& c, const Options& o, const TensorView& q) {
  if (!present(o.alibi_slopes)) return;
  AttnParams& p = c.p;
  const Arg a{"alibi_slopes", o.alibi_slopes, "([Hq] or [B, Hq])", false};
  c.inputs.emplace_back(a.name, check_vector(a, q, {{p.heads_q}, {p.batch, p.heads_q}}));
  p.alibi_slopes = static_cast<const float*>(o.alibi_slopes.data);
  p.alibi_batch_stride = o.alibi_slopes.rank == 2 ? o.alibi_slopes.stride[0] : 0;
}

void check_sinks(Checked& c, const Options& o, const TensorView& q) {
  if (!present(o.sinks)) return;
  const Arg a{"sinks", o.sinks, "[Hq]", false};
  c.inputs.emplace_back(a.name, check_vector(a, q, {{c.p.heads_q}}));
  c.p.sinks = static_cast<const float*>(o.sinks.data);
}

// dsinks: the backward's output dL/dsinks, required exactly when sinks is given.
void check_dsinks(Checked& c, const Options& o, const TensorView& q) {
  if (present(o.sinks) != present(o.dsinks))
    fail<InvalidArgument>(present(o.sinks) ? "dsinks: required in backward when sinks is given (the gradient of "
                                             "the sink logits, [Hq] float32)"
                                           : "dsinks: given without sinks");
  if (!present(o.dsinks)) return;
  const Arg a{"dsinks", o.dsinks, "[Hq]", true};
  c.outputs.emplace_back(a.name, check_vector(a, q, {{c.p.heads_q}}));
  check_no_self_overlap(a);
  c.p.dsinks = static_cast<float*>(o.dsinks.data);
}

// An int32 index vector of `n` entries on the operands' device.
Span check_index(const Arg& a, const TensorView& q, std::int64_t n) {
  if (a.t.dtype != DType::int32)
    fail<DTypeError>(a.name, ": dtype ", dtype_name(a.t.dtype), ", expected int32");
  check_same_device(a, q);
  const Span span = check_layout(a, 1);
  check_dims(a, {n});
  return span;
}

// Before validation reads an index tensor's values on the host: a tensor declared cpu that holds CUDA device
// memory is refused, not dereferenced (the CPU backends refuse such operands the same way, host_only()).
void check_host_readable(const char* name, const TensorView& t) {
#if FLASHTILE_WITH_CUDA
  if (is_device_pointer(t.data))
    fail<DeviceError>(name, ": declared device cpu but holds CUDA device memory (its values are read on the host)");
#else
  (void)name;
  (void)t;
#endif
}

std::int32_t entry(const TensorView& t, std::int64_t i) { return static_cast<const std::int32_t*>(t.data)[i * t.stride[0]]; }

// Values of a cu_seqlens array in host memory: 0 first, non-decreasing, the packed length last, and no sequence
// longer than max_seqlen.
void check_cu_values(const char* name, const TensorView& cu, std::int64_t total, const char* total_name,
                     const char* max_name, std::int64_t max_len) {
  const std::int64_t n = cu.shape[0];
  if (entry(cu, 0) != 0) fail<InvalidArgument>(name, ": must start at 0, got ", name, "[0] = ", entry(cu, 0));
  for (std::int64_t b = 1; b < n; ++b)
    if (entry(cu, b) < entry(cu, b - 1))
      fail<InvalidArgument>(name, ": must be non-decreasing, got ", name, "[", b, "] = ", entry(cu, b), " < ", name,
                            "[", b - 1, "] = ", entry(cu, b - 1));
  if (entry(cu, n - 1) != total)
    fail<InvalidArgument>(name, ": must end at the packed length ", total_name, " = ", total, ", got ", name, "[",
                          n - 1, "] = ", entry(cu, n - 1));
  for (std::int64_t b = 1; b < n; ++b) {
    const std::int64_t len = std::int64_t{entry(cu, b)} - entry(cu, b - 1);
    if (len > max_len)
      fail<InvalidArgument>(max_name, ": ", max_len, " is smaller than sequence ", b - 1, "'s length ", len, " (",
                            name, ")");
  }
}

// cu_seqlens_q / cu_seqlens_k (both or neither) and seqused_k. Values are read only for host tensors: CUDA
// tensors' values live in device memory (the CUDA backend decides what it checks there).
void check_varlen(Checked& c, const Options& o, const TensorView& q) {
  AttnParams& p = c.p;
  if (c.varlen) {
    if (present(o.cu_seqlens_q) != present(o.cu_seqlens_k))
      fail<InvalidArgument>(present(o.cu_seqlens_q) ? "cu_seqlens_k: required with cu_seqlens_q"
                                                    : "cu_seqlens_q: required with cu_seqlens_k");
    const TensorView& cq = o.cu_seqlens_q;
    if (cq.rank == 1 && cq.shape[0] < 1)
      fail<InvalidArgument>("cu_seqlens_q: expected [B + 1] with B >= 0, got ", shape_str(cq));
    c.inputs.emplace_back("cu_seqlens_q", check_index({"cu_seqlens_q", cq, "[B + 1]", false}, q,
                                                      cq.rank == 1 ? std::max<std::int64_t>(cq.shape[0], 1) : 1));
    p.batch = cq.shape[0] - 1;
    c.inputs.emplace_back("cu_seqlens_k", check_index({"cu_seqlens_k", o.cu_seqlens_k, "[B + 1]", false}, q, p.batch + 1));
    for (auto [name, value] : {std::pair{"max_seqlen_q", o.max_seqlen_q}, std::pair{"max_seqlen_k", o.max_seqlen_k}})
      if (value < 0) fail<InvalidArgument>(name, ": must be >= 0, got ", value);
    p.seqlen_q = o.max_seqlen_q;
    p.seqlen_k = o.max_seqlen_k;
    p.cu_seqlens_q = static_cast<const std::int32_t*>(cq.data);
    p.cu_seqlens_k = static_cast<const std::int32_t*>(o.cu_seqlens_k.data);
    if (q.device == Device::cpu) {
      check_host_readable("cu_seqlens_q", cq);
      check_host_readable("cu_seqlens_k", o.cu_seqlens_k);
      check_cu_values("cu_seqlens_q", cq, p.total_q, "total_q", "max_seqlen_q", p.seqlen_q);
      check_cu_values("cu_seqlens_k", o.cu_seqlens_k, p.total_k, "total_k", "max_seqlen_k", p.seqlen_k);
    }
  }
  if (!present(o.seqused_k)) return;
  c.inputs.emplace_back("seqused_k", check_index({"seqused_k", o.seqused_k, "[B]", false}, q, p.batch));
  p.seqused_k = static_cast<const std::int32_t*>(o.seqused_k.data);
  if (q.device != Device::cpu) return;
  check_host_readable("seqused_k", o.seqused_k);
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int64_t keys = c.varlen ? std::int64_t{entry(o.cu_seqlens_k, b + 1)} - entry(o.cu_seqlens_k, b)
                                       : p.seqlen_k;
    if (entry(o.seqused_k, b) < 0 || entry(o.seqused_k, b) > keys)
      fail<InvalidArgument>("seqused_k: seqused_k[", b, "] = ", entry(o.seqused_k, b), " is outside [0, ", keys,
                            "] (the keys of sequence ", b, ")");
  }
}

// q, k, v (+ dout) sizes, dtypes, devices, and the options.
Checked check_inputs(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView* dout,
                     const Options& o) {
  Checked c;
  c.varlen = present(o.cu_seqlens_q) || present(o.cu_seqlens_k);
  const int rank = c.rank();
  const Arg aq{"q", q, c.q_layout(false), false}, ak{"k", k, c.k_layout(false), false},
      av{"v", v, c.k_layout(true), false};
  check_float(aq);
  c.inputs.emplace_back("q", check_layout(aq, rank));
  c.inputs.emplace_back("k", check_layout(ak, rank));
  c.inputs.emplace_back("v", check_layout(av, rank));
  AttnParams& p = c.p;
  // Dims of a q-like operand: [B, S, H, D] or [total, H, D].
  const std::size_t ds = c.varlen ? 0 : 1, dh = ds + 1, dd = ds + 2;
  p.batch = c.varlen ? 0 : q.shape[0];
  p.seqlen_q = q.shape[ds];
  p.heads_q = q.shape[dh];
  p.hdim = q.shape[dd];
  p.seqlen_k = k.shape[ds];
  p.heads_kv = k.shape[dh];
  p.hdim_v = v.shape[dd];
  p.total_q = c.varlen ? q.shape[0] : p.batch * p.seqlen_q;
  p.total_k = c.varlen ? k.shape[0] : p.batch * p.seqlen_k;
  if (p.hdim < 1 || p.hdim > kMaxHeadDim)
    fail<InvalidArgument>("q: head dim D = ", p.hdim, " is out of range [1, ", kMaxHeadDim, "] (shape ",
                          shape_str(q), ")");
  if ((!c.varlen && k.shape[0] != p.batch) || k.shape[dd] != p.hdim)
    fail<InvalidArgument>("k: expected ", c.k_layout(false), c.varlen ? "" : " with B = ", c.varlen ? "" : std::to_string(p.batch),
                          " and D = ", p.hdim, " from q ", shape_str(q), ", got ", shape_str(k));
  if (p.hdim_v < 1 || p.hdim_v > kMaxHeadDim)
    fail<InvalidArgument>("v: head dim Dv = ", p.hdim_v, " is out of range [1, ", kMaxHeadDim, "] (shape ",
                          shape_str(v), ")");
  check_dims(av, c.k_like(p.hdim_v));
  if (p.heads_kv == 0 ? p.heads_q != 0 : p.heads_q % p.heads_kv != 0)
    fail<InvalidArgument>("k: query heads Hq = ", p.heads_q, " must be a multiple of key/value heads Hkv = ",
                          p.heads_kv);
  check_dtype(ak, q.dtype, "q's dtype");
  check_dtype(av, q.dtype, "q's dtype");
  check_same_device(ak, q);
  check_same_device(av, q);
  check_varlen(c, o, q);  // sets batch and the maxima in varlen mode
  if (dout != nullptr) {
    const Arg ad{"dout", *dout, c.q_layout(true), false};
    c.inputs.emplace_back("dout", check_layout(ad, rank));
    check_dims(ad, c.q_like(p.hdim_v));
    check_dtype(ad, q.dtype, "q's dtype");
    check_same_device(ad, q);
    p.dout = dout->data;
    p.dout_stride = rows_of(*dout);
  }
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.q_stride = rows_of(q);
  p.k_stride = rows_of(k);
  p.v_stride = rows_of(v);
  p.dtype = q.dtype;
  p.device = q.device;
  p.device_index = q.device_index;
  const float scale = o.softmax_scale ? *o.softmax_scale : 1.0f / std::sqrt(static_cast<float>(p.hdim));
  if (!std::isfinite(scale))
    fail<InvalidArgument>("softmax_scale: must be finite, got ", scale);
  if (o.num_threads < 0) fail<InvalidArgument>("num_threads: must be >= 0, got ", o.num_threads);
  p.softmax_scale = scale;
  p.causal = o.causal;
  check_window(o, p);
  check_softcap(o, p);
  check_alibi(c, o, q);
  check_sinks(c, o, q);
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

void check_output(Checked& c, const Arg& a, int rank, const std::vector<std::int64_t>& dims, DType dtype,
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
  check_output(c, {"out", out, c.q_layout(true), true}, c.rank(), c.q_like(p.hdim_v), q.dtype, "q's dtype", q);
  check_output(c, {"lse", lse, c.lse_layout(), true}, c.rank() - 1, c.lse_dims(), DType::float32,
               "the required float32", q);
  check_no_aliasing(c);
  p.out = out.data;
  p.lse = static_cast<float*>(lse.data);
  p.out_stride = rows_of(out);
  p.lse_stride = lse_of(lse);
  return p;
}

AttnParams validate_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                             const TensorView& dout, const TensorView& lse, const TensorView& dq,
                             const TensorView& dk, const TensorView& dv, const Options& options) {
  Checked c = check_inputs(q, k, v, &dout, options);
  AttnParams& p = c.p;
  // out and lse are inputs of the backward pass.
  const Arg ao{"out", out, c.q_layout(true), false}, al{"lse", lse, c.lse_layout(), false};
  c.inputs.emplace_back("out", check_layout(ao, c.rank()));
  check_dims(ao, c.q_like(p.hdim_v));
  check_dtype(ao, q.dtype, "q's dtype");
  check_same_device(ao, q);
  c.inputs.emplace_back("lse", check_layout(al, c.rank() - 1));
  check_dims(al, c.lse_dims());
  check_dtype(al, DType::float32, "the required float32");
  check_same_device(al, q);
  check_output(c, {"dq", dq, c.q_layout(false), true}, c.rank(), c.q_like(p.hdim), q.dtype, "q's dtype", q);
  check_output(c, {"dk", dk, c.k_layout(false), true}, c.rank(), c.k_like(p.hdim), q.dtype, "q's dtype", q);
  check_output(c, {"dv", dv, c.k_layout(true), true}, c.rank(), c.k_like(p.hdim_v), q.dtype, "q's dtype", q);
  check_dsinks(c, options, q);
  check_no_aliasing(c);
  p.backward = true;
  p.out = out.data;
  p.lse = static_cast<float*>(lse.data);
  p.out_stride = rows_of(out);
  p.lse_stride = lse_of(lse);
  p.dq = dq.data;
  p.dk = dk.data;
  p.dv = dv.data;
  p.dq_stride = rows_of(dq);
  p.dk_stride = rows_of(dk);
  p.dv_stride = rows_of(dv);
  return p;
}

}  // namespace flashtile::detail
