// The shared argument checks (validate_args.h).
#include "core/validate_args.h"

#include <algorithm>
#include <array>
#include <cmath>

#if FLASHTILE_WITH_CUDA
#include "cuda/pointer_check.h"
#endif

namespace flashtile::detail::args {
namespace {


// The dims a view holds: its rank, clamped to what TensorView stores (a bad rank is reported, not read past).
int held_dims(const TensorView& t) { return std::clamp(t.rank, 0, static_cast<int>(t.shape.size())); }

std::string dims_of(const std::array<std::int64_t, 4>& x, int n) {
  std::ostringstream s;
  s << '[';
  for (int i = 0; i < n; ++i) s << (i ? ", " : "") << x[static_cast<std::size_t>(i)];
  s << ']';
  return s.str();
}
}  // namespace

std::string dims_str(const std::vector<std::int64_t>& x) {
  std::ostringstream s;
  s << '[';
  for (std::size_t i = 0; i < x.size(); ++i) s << (i ? ", " : "") << x[i];
  s << ']';
  return s.str();
}
std::string shape_str(const TensorView& t) { return dims_of(t.shape, held_dims(t)); }
std::string stride_str(const TensorView& t) { return dims_of(t.stride, held_dims(t)); }




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




// The operands hold floating-point elements; int32 is for index tensors only.
void check_float(const Arg& a) {
  if (a.t.dtype == DType::int32)
    fail<DTypeError>(a.name, ": dtype int32 is not a floating-point type; attention operands take float32, ",
                     "float16 or bfloat16");
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

// The variants' options, one small check each.
namespace {

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

}  // namespace

void check_options(Checked& c, const Options& o, const TensorView& q) {
  AttnParams& p = c.p;
  const float scale = o.softmax_scale ? *o.softmax_scale : 1.0f / std::sqrt(static_cast<float>(p.hdim));
  if (!std::isfinite(scale))
    fail<InvalidArgument>("softmax_scale: must be finite, got ", scale);
  if (o.num_threads < 0) fail<InvalidArgument>("num_threads: must be >= 0, got ", o.num_threads);
  if (o.sm_margin < 0) fail<InvalidArgument>("sm_margin: must be >= 0, got ", o.sm_margin);
  p.softmax_scale = scale;
  p.causal = o.causal;
  check_window(o, p);
  check_softcap(o, p);
  check_alibi(c, o, q);
  check_sinks(c, o, q);
  p.deterministic = o.deterministic;
  p.num_threads = o.num_threads;
  p.sm_margin = o.sm_margin;
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
}

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

}  // namespace flashtile::detail::args
