// flashtile._torch_ext: the op flashtile_ext::attention for eager torch calls, with its autograd node in C++.
//
// Why it exists: on a tiny call the Python autograd.Function path costs ~75 us more per forward+backward than
// torch's own SDPA, in the autograd engine calling a Python node and in reading nine tensors through their Python
// attributes (bench/results/overhead.md). Here the tensors are at::Tensors, the node is a C++
// torch::autograd::Function, and outputs and the backward's scratch come from torch's allocator (so a CUDA graph
// capture allocates from its pool). The library itself is called through the table flashtile._core hands over
// (bridge.h): this module links libtorch only.
//
// Errors: a library error comes out as a RuntimeError whose text starts with "[flashtile:N] " (N = 1 +
// flashtile::ErrorCode); the Python caller raises the matching flashtile exception. Tensors this fast path does
// not take (a dtype, device or rank the library does not support) raise "[flashtile:fallback]": the caller then
// takes the general path, which names the problem exactly as for every other entry point.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <array>
#include <climits>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bridge.h"

namespace flashtile::python {
namespace {

using torch::autograd::AutogradContext;
using TensorList = std::vector<at::Tensor>;

const Bridge* g_bridge = nullptr;

// Every error leaves as a c10::Error (a RuntimeError in Python) tagged for the caller. The text is put together
// with std::string alone: c10's message formatting is an inline std::ostringstream, and formatting a number
// through it in this module crashed on the GPU machine (two C++ runtime copies' locale data mixed, the hazard
// python/CMakeLists.txt describes for _core).
[[noreturn]] void fail(const std::string& tag, const char* what) {
  throw c10::Error(c10::SourceLocation{__func__, __FILE__, static_cast<std::uint32_t>(__LINE__)},
                   "[flashtile:" + tag + "] " + what);
}

[[noreturn]] void fallback(const char* why) { fail("fallback", why); }

const Bridge& bridge() {
  if (g_bridge == nullptr) fallback("flashtile_ext: set_bridge was not called");
  return *g_bridge;
}

void set_bridge(std::int64_t address) {
  const auto* b = reinterpret_cast<const Bridge*>(static_cast<std::uintptr_t>(address));
  if (b == nullptr || b->options_size != sizeof(Options) || b->view_size != sizeof(TensorView) ||
      b->forward == nullptr || b->backward == nullptr)
    fail(std::to_string(kBridgeOtherError), "flashtile_ext: the entry-point table does not match this build");
  g_bridge = b;
}

void check(int status, const std::array<char, 2048>& msg) {
  if (status != 0) fail(std::to_string(status), msg.data());
}

// A TensorView of t, or a fallback for what only the general path describes properly.
TensorView view(const at::Tensor& t) {
  TensorView v;
  switch (t.scalar_type()) {
    case at::kFloat: v.dtype = DType::float32; break;
    case at::kHalf: v.dtype = DType::float16; break;
    case at::kBFloat16: v.dtype = DType::bfloat16; break;
    case at::kInt: v.dtype = DType::int32; break;  // cu_seqlens
    default: fallback("dtype");
  }
  if (t.is_cuda()) {
    v.device = Device::cuda;
    v.device_index = t.get_device();
  } else if (!t.is_cpu()) {
    fallback("device");
  }
  if (t.dim() > 4) fallback("rank");
  v.rank = static_cast<int>(t.dim());
  for (int i = 0; i < v.rank; ++i) {
    v.shape[static_cast<std::size_t>(i)] = t.size(i);
    v.stride[static_cast<std::size_t>(i)] = t.stride(i);
  }
  // An empty tensor's strides carry no layout; the library expects row-major ones (as the Python path gives).
  if (t.numel() == 0) {
    std::int64_t s = 1;
    for (int i = v.rank - 1; i >= 0; --i) {
      v.stride[static_cast<std::size_t>(i)] = s;
      s *= std::max<std::int64_t>(v.shape[static_cast<std::size_t>(i)], 1);
    }
  }
  v.data = t.data_ptr();
  return v;
}

// The op's optional tensors and non-tensor arguments, kept in the autograd context between forward and backward.
struct Call {
  at::Tensor cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks;  // undefined when absent
  std::int64_t max_seqlen_q = 0, max_seqlen_k = 0;
  std::optional<double> softmax_scale;
  bool causal = false;
  std::int64_t window_left = -1, window_right = -1;
  double softcap = 0.0;
  std::string backend;
  bool strict = false;
  bool deterministic = false;
  std::int64_t sm_margin = 0;

  bool varlen() const { return cu_seqlens_q.defined(); }
};

void* current_stream(const at::Tensor& q) {
  if (!q.is_cuda()) return nullptr;
  // Through c10's device-generic guard interface, so this module needs neither CUDA headers nor libc10_cuda.
  const c10::impl::DeviceGuardImplInterface* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  return impl->getStreamNativeHandle(impl->getStream(q.device()));
}

Options options(const Call& c, const at::Tensor& q) {
  Options o;
  if (c.softmax_scale) o.softmax_scale = static_cast<float>(*c.softmax_scale);
  o.causal = c.causal;
  o.window_size = {c.window_left, c.window_right};
  o.softcap = static_cast<float>(c.softcap);
  o.backend = c.backend;
  o.strict = c.strict;
  o.deterministic = c.deterministic;
  if (c.sm_margin < INT_MIN || c.sm_margin > INT_MAX) fallback("sm_margin beyond an int");  // the _core path names it
  o.sm_margin = static_cast<int>(c.sm_margin);
  o.cuda_stream = current_stream(q);
  o.device_pointers_checked = true;  // torch tensors: data_ptr is memory of the device they report
  if (c.alibi_slopes.defined()) o.alibi_slopes = view(c.alibi_slopes);
  if (c.sinks.defined()) o.sinks = view(c.sinks);
  if (c.cu_seqlens_q.defined()) o.cu_seqlens_q = view(c.cu_seqlens_q);
  if (c.cu_seqlens_k.defined()) o.cu_seqlens_k = view(c.cu_seqlens_k);
  o.max_seqlen_q = c.max_seqlen_q;
  o.max_seqlen_k = c.max_seqlen_k;
  return o;
}

// q, k, v are [B, S, H, D], or [total, H, D] in a varlen call; anything else goes to the general path's errors.
void require_rank(const Call& c, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const std::int64_t r = c.varlen() ? 3 : 4;
  if (q.dim() != r || k.dim() != r || v.dim() != r) fallback("rank");
}

std::tuple<at::Tensor, at::Tensor> run_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                               const Call& c) {
  require_rank(c, q, k, v);
  const Options o = options(c, q);
  std::vector<std::int64_t> out_shape(q.sizes().begin(), q.sizes().end());
  out_shape.back() = v.size(-1);
  at::Tensor out = at::empty(out_shape, q.options());
  // lse: [B, Hq, Sq], or [Hq, total_q] for a packed batch.
  at::Tensor lse = c.varlen() ? at::empty({q.size(1), q.size(0)}, q.options().dtype(at::kFloat))
                              : at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(at::kFloat));
  const std::array<TensorView, 5> t{view(q), view(k), view(v), view(out), view(lse)};
  std::array<char, 2048> msg{};
  check(bridge().forward(t.data(), o, msg.data(), msg.size()), msg);
  return {out, lse};
}

// Options::workspace_alloc: the backward's scratch from torch's allocator (the graph's pool under capture), kept
// until the call returns; the caching allocator orders its reuse after the work queued on the stream.
struct Workspace {
  at::TensorOptions options;
  at::Tensor tensor;
};

void* workspace_alloc(std::size_t bytes, void* context) noexcept {
  auto* w = static_cast<Workspace*>(context);
  try {
    w->tensor = at::empty({static_cast<std::int64_t>(bytes)}, w->options);
    return w->tensor.data_ptr();
  } catch (...) {
    return nullptr;  // the library reports a failed allocation
  }
}

// dq, dk, dv and (with sinks) dsinks.
TensorList run_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                        at::Tensor dout, const at::Tensor& lse, const Call& c) {
  // Gradients of reductions arrive expanded (stride 0); the kernels need a unit-stride last dimension.
  if (dout.dim() > 0 && dout.stride(-1) != 1) dout = dout.contiguous();
  Options o = options(c, q);
  at::Tensor dq = at::empty(q.sizes(), q.options());
  // With no query rows no kernel runs, and dk, dv (sums over query rows) must be zero.
  const bool no_rows = c.varlen() ? q.size(0) == 0 : q.size(1) == 0;
  at::Tensor dk = no_rows ? at::zeros(k.sizes(), q.options()) : at::empty(k.sizes(), q.options());
  at::Tensor dv = no_rows ? at::zeros(v.sizes(), q.options()) : at::empty(v.sizes(), q.options());
  at::Tensor dsinks;
  if (c.sinks.defined()) {
    dsinks = at::empty(c.sinks.sizes(), c.sinks.options());
    o.dsinks = view(dsinks);
  }
  Workspace ws{q.options().dtype(at::kByte), {}};
  o.workspace_alloc = &workspace_alloc;
  o.workspace_alloc_context = &ws;
  const std::array<TensorView, 9> t{view(q),   view(k),  view(v),  view(out), view(dout),
                                    view(lse), view(dq), view(dk), view(dv)};
  std::array<char, 2048> msg{};
  check(bridge().backward(t.data(), o, msg.data(), msg.size()), msg);
  return {dq, dk, dv, dsinks};
}

// Inputs of forward(): q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks, then the Call. backward() returns
// one gradient per input; only q, k, v and sinks have one.
class AttentionFunction : public torch::autograd::Function<AttentionFunction> {
 public:
  static TensorList forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::optional<at::Tensor>& /*cu_seqlens_q*/,
                            const std::optional<at::Tensor>& /*cu_seqlens_k*/,
                            const std::optional<at::Tensor>& /*alibi_slopes*/,
                            const std::optional<at::Tensor>& /*sinks*/, const Call& c) {
    auto [out, lse] = run_forward(q, k, v, c);
    // out and lse are all the backward needs: P is recomputed, never stored.
    ctx->save_for_backward({q, k, v, out, lse, c.cu_seqlens_q, c.cu_seqlens_k, c.alibi_slopes, c.sinks});
    ctx->saved_data["max_seqlen_q"] = c.max_seqlen_q;
    ctx->saved_data["max_seqlen_k"] = c.max_seqlen_k;
    ctx->saved_data["softmax_scale"] = c.softmax_scale;
    ctx->saved_data["causal"] = c.causal;
    ctx->saved_data["window_left"] = c.window_left;
    ctx->saved_data["window_right"] = c.window_right;
    ctx->saved_data["softcap"] = c.softcap;
    ctx->saved_data["backend"] = c.backend;
    ctx->saved_data["strict"] = c.strict;
    ctx->saved_data["deterministic"] = c.deterministic;
    ctx->saved_data["sm_margin"] = c.sm_margin;
    // The library's backward takes no gradient for lse: a loss that used it must not get a silently wrong
    // gradient, so lse is a constant for autograd, and no zero gradient is materialised for it.
    ctx->mark_non_differentiable({lse});
    ctx->set_materialize_grads(false);
    return {out, lse};
  }

  static TensorList backward(AutogradContext* ctx, TensorList grads) {
    const at::Tensor& dout = grads[0];
    if (!dout.defined()) return TensorList(8);  // out did not reach the loss
    const TensorList s = ctx->get_saved_variables();
    Call c;
    c.cu_seqlens_q = s[5];
    c.cu_seqlens_k = s[6];
    c.alibi_slopes = s[7];
    c.sinks = s[8];
    c.max_seqlen_q = ctx->saved_data["max_seqlen_q"].toInt();
    c.max_seqlen_k = ctx->saved_data["max_seqlen_k"].toInt();
    const c10::IValue& scale = ctx->saved_data["softmax_scale"];
    if (!scale.isNone()) c.softmax_scale = scale.toDouble();
    c.causal = ctx->saved_data["causal"].toBool();
    c.window_left = ctx->saved_data["window_left"].toInt();
    c.window_right = ctx->saved_data["window_right"].toInt();
    c.softcap = ctx->saved_data["softcap"].toDouble();
    c.backend = ctx->saved_data["backend"].toStringRef();
    c.strict = ctx->saved_data["strict"].toBool();
    c.deterministic = ctx->saved_data["deterministic"].toBool();
    c.sm_margin = ctx->saved_data["sm_margin"].toInt();
    TensorList g = run_backward(s[0], s[1], s[2], s[3], dout, s[4], c);
    return {g[0], g[1], g[2], at::Tensor(), at::Tensor(), at::Tensor(), g[3], at::Tensor()};
  }
};

at::Tensor or_undefined(const std::optional<at::Tensor>& t) { return t ? *t : at::Tensor(); }

Call make_call(const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_k,
               std::int64_t max_seqlen_q, std::int64_t max_seqlen_k, const std::optional<at::Tensor>& alibi_slopes,
               const std::optional<at::Tensor>& sinks, std::optional<double> softmax_scale, bool causal,
               std::int64_t window_left, std::int64_t window_right, double softcap, std::string backend,
               bool strict, bool deterministic, std::int64_t sm_margin) {
  Call c;
  c.cu_seqlens_q = or_undefined(cu_seqlens_q);
  c.cu_seqlens_k = or_undefined(cu_seqlens_k);
  c.alibi_slopes = or_undefined(alibi_slopes);
  c.sinks = or_undefined(sinks);
  c.max_seqlen_q = max_seqlen_q;
  c.max_seqlen_k = max_seqlen_k;
  c.softmax_scale = softmax_scale;
  c.causal = causal;
  c.window_left = window_left;
  c.window_right = window_right;
  c.softcap = softcap;
  c.backend = std::move(backend);
  c.strict = strict;
  c.deterministic = deterministic;
  c.sm_margin = sm_margin;
  return c;
}

#define FT_ATTENTION_PARAMS                                                                                    \
  const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, const std::optional<at::Tensor>&cu_seqlens_q, \
      const std::optional<at::Tensor>&cu_seqlens_k, std::int64_t max_seqlen_q, std::int64_t max_seqlen_k,      \
      const std::optional<at::Tensor>&alibi_slopes, const std::optional<at::Tensor>&sinks,                    \
      std::optional<double> softmax_scale, bool causal, std::int64_t window_left, std::int64_t window_right,   \
      double softcap, std::string backend, bool strict, bool deterministic, std::int64_t sm_margin
#define FT_CALL_ARGS                                                                                          \
  cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, sinks, softmax_scale, causal,         \
      window_left, window_right, softcap, std::move(backend), strict, deterministic, sm_margin

std::tuple<at::Tensor, at::Tensor> attention_autograd(FT_ATTENTION_PARAMS) {
  const Call c = make_call(FT_CALL_ARGS);
  // The optional tensors go in as optionals (autograd records an absent one as no input), and in `c` for the call.
  TensorList r = AttentionFunction::apply(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks, c);
  return {r[0], r[1]};
}

// Below autograd (inference mode, or a caller that excluded the autograd keys): the forward alone.
std::tuple<at::Tensor, at::Tensor> attention_plain(FT_ATTENTION_PARAMS) {
  return run_forward(q, k, v, make_call(FT_CALL_ARGS));
}

#undef FT_ATTENTION_PARAMS
#undef FT_CALL_ARGS

}  // namespace
}  // namespace flashtile::python

TORCH_LIBRARY(flashtile_ext, m) {
  m.def("set_bridge(int address) -> ()", &flashtile::python::set_bridge);
  m.def(
      "attention(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, int max_seqlen_q, "
      "int max_seqlen_k, Tensor? alibi_slopes, Tensor? sinks, float? softmax_scale, bool causal, "
      "int window_left, int window_right, float softcap, str backend, bool strict, bool deterministic, "
      "int sm_margin=0) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(flashtile_ext, Autograd, m) {
  m.impl("attention", &flashtile::python::attention_autograd);
}

TORCH_LIBRARY_IMPL(flashtile_ext, CPU, m) {
  m.impl("attention", &flashtile::python::attention_plain);
}

TORCH_LIBRARY_IMPL(flashtile_ext, CUDA, m) {
  m.impl("attention", &flashtile::python::attention_plain);
}
