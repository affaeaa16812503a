// flashtile._core: the thin layer between Python and the C++ library. It converts DLPack tensors to
// TensorViews, releases the GIL around the call and returns the DispatchReport. Everything that needs a
// framework (allocating outputs, autograd, torch.library) lives in the Python package above it.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>

#include "bridge.h"
#include "errors.h"
#include "flashtile/flashtile.h"
#include "flashtile/merge.h"
#include "tensors.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace flashtile::python {
namespace {

// The report of the most recent call from any thread. The C++ library keeps one per thread, but torch runs the
// backward on its own threads (one per CUDA device), where a per-thread report would be invisible to the caller.
// Kept here rather than handed to Python on every call: building the Python object cost more than the lock.
std::mutex g_last_mutex;
std::optional<DispatchReport> g_last;

void record(DispatchReport&& r) {
  const std::lock_guard<std::mutex> lock(g_last_mutex);
  g_last = std::move(r);
}

std::optional<DispatchReport> last_report() {
  const std::lock_guard<std::mutex> lock(g_last_mutex);
  return g_last;
}

Options make_options(std::optional<double> softmax_scale, bool causal, const std::string& backend, bool strict,
                     bool deterministic, int num_threads) {
  Options o;
  if (softmax_scale) o.softmax_scale = static_cast<float>(*softmax_scale);
  o.causal = causal;
  o.backend = backend;
  o.strict = strict;
  o.deterministic = deterministic;
  o.num_threads = num_threads;
  return o;
}

bool given(nb::handle h) { return h.is_valid() && !h.is_none(); }

// An int option from Python (any size there): the library checks its value; one beyond an int is refused here.
int int_option(const char* name, nb::handle h) {
  const auto x = nb::cast<std::int64_t>(h);
  if (x < INT_MIN || x > INT_MAX)
    throw InvalidArgument(std::string(name) + ": must fit an int, got " + std::to_string(x));
  return static_cast<int>(x);
}

// The variants' arguments as the Python layer passes them (_common.py Call.variants): None (none of them), or the
// tuple (window_left, window_right, softcap, alibi_slopes, sinks, dsinks, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
// max_seqlen_k, sm_margin), tensors None when absent. `view(handle, name, writable)` turns a tensor into a
// TensorView.
template <class View>
void apply_variants(Options& o, nb::handle variants, View&& view) {
  if (!given(variants)) return;
  const auto t = nb::borrow<nb::tuple>(variants);
  if (t.size() != 11) throw nb::value_error("variants: expected a tuple of 11 entries");
  o.sm_margin = int_option("sm_margin", t[10]);
  o.window_size = {nb::cast<std::int64_t>(t[0]), nb::cast<std::int64_t>(t[1])};
  o.softcap = static_cast<float>(nb::cast<double>(t[2]));
  if (given(t[3])) o.alibi_slopes = view(t[3], "alibi_slopes", false);
  if (given(t[4])) o.sinks = view(t[4], "sinks", false);
  if (given(t[5])) o.dsinks = view(t[5], "dsinks", true);
  if (given(t[6])) o.cu_seqlens_q = view(t[6], "cu_seqlens_q", false);
  if (given(t[7])) o.cu_seqlens_k = view(t[7], "cu_seqlens_k", false);
  o.max_seqlen_q = nb::cast<std::int64_t>(t[8]);
  o.max_seqlen_k = nb::cast<std::int64_t>(t[9]);
}

auto dlpack_views(Imports& in) {
  return [&in](nb::handle h, const char* name, bool writable) {
    return writable ? in.output(h, name, false) : in.input(h, name, false);
  };
}

auto torch_views() {
  return [](nb::handle h, const char* name, bool) { return torch_view(h, name); };
}

DispatchReport forward(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse,
                       std::optional<double> softmax_scale, bool causal, const std::string& backend, bool strict,
                       int num_threads, bool bf16_bits, bool explain, nb::handle variants) {
  Imports in;
  const TensorView tq = in.input(q, "q", bf16_bits), tk = in.input(k, "k", bf16_bits),
                   tv = in.input(v, "v", bf16_bits), to = in.output(out, "out", bf16_bits),
                   tl = in.output(lse, "lse", false);
  Options o = make_options(softmax_scale, causal, backend, strict, false, num_threads);
  apply_variants(o, variants, dlpack_views(in));
  if (explain) return explain_forward(tq, tk, tv, to, tl, o);
  // The views stay valid without the GIL: `in` holds a reference to every tensor.
  nb::gil_scoped_release unlocked;
  DispatchReport r = flashtile::forward(tq, tk, tv, to, tl, o);
  record(DispatchReport(r));
  return r;
}

// forward_kvcache (include/flashtile/kvcache.h) for both paths: `torch` reads every tensor through torch_view
// (and runs on `stream`), otherwise through DLPack (numpy), where the caches must be writable only when k_new /
// v_new append to them. `variants`: (window_left, window_right, softcap, alibi_slopes, sinks, max_seqlen_k,
// async_index_check, sm_margin).
DispatchReport forward_kvcache(nb::handle q, nb::handle k_cache, nb::handle v_cache, nb::handle k_new,
                               nb::handle v_new, nb::handle cache_seqlens, nb::handle block_table,
                               nb::handle cache_batch_idx, nb::handle out, nb::handle lse, int num_splits,
                               std::optional<double> softmax_scale, bool causal, const std::string& backend,
                               bool strict, int num_threads, nb::tuple variants, bool torch, std::uintptr_t stream,
                               bool bf16_bits, bool explain) {
  Imports in;
  // name, writable, whether a 16-bit unsigned array is bfloat16 (the float operands of a numpy call).
  auto view = [&](nb::handle h, const char* name, bool writable, bool bits) -> TensorView {
    if (!given(h)) return {};
    if (torch) return torch_view(h, name);
    return writable ? in.output(h, name, bits && bf16_bits) : in.input(h, name, bits && bf16_bits);
  };
  const bool append = given(k_new) || given(v_new);
  KVCache c;
  const TensorView tq = view(q, "q", false, true);
  c.k_cache = view(k_cache, "k_cache", append, true);
  c.v_cache = view(v_cache, "v_cache", append, true);
  c.k_new = view(k_new, "k", false, true);
  c.v_new = view(v_new, "v", false, true);
  c.cache_seqlens = view(cache_seqlens, "cache_seqlens", false, false);
  c.block_table = view(block_table, "block_table", false, false);
  c.cache_batch_idx = view(cache_batch_idx, "cache_batch_idx", false, false);
  c.num_splits = num_splits;
  const TensorView to = view(out, "out", true, true), tl = view(lse, "lse", true, false);
  Options o = make_options(softmax_scale, causal, backend, strict, false, num_threads);
  if (variants.size() != 8) throw nb::value_error("variants: expected a tuple of 8 entries");
  o.window_size = {nb::cast<std::int64_t>(variants[0]), nb::cast<std::int64_t>(variants[1])};
  o.softcap = static_cast<float>(nb::cast<double>(variants[2]));
  o.alibi_slopes = view(variants[3], "alibi_slopes", false, false);
  o.sinks = view(variants[4], "sinks", false, false);
  o.max_seqlen_k = nb::cast<std::int64_t>(variants[5]);
  c.async_index_check = nb::cast<bool>(variants[6]);
  o.sm_margin = int_option("sm_margin", variants[7]);
  if (torch) {
    o.cuda_stream = reinterpret_cast<void*>(stream);
    o.device_pointers_checked = true;  // torch tensors: data_ptr is memory of the device they report
  }
  if (explain) return explain_forward_kvcache(tq, c, to, tl, o);
  nb::gil_scoped_release unlocked;  // `in` (or the caller's frame, for torch) keeps every tensor alive
  DispatchReport r = flashtile::forward_kvcache(tq, c, to, tl, o);
  record(DispatchReport(r));
  return r;
}

// merge_attention_states on host arrays (the numpy path; torch tensors merge in torch ops, python/flashtile/_merge.py).
void merge_states(nb::list outs, nb::list lses, nb::handle out, nb::handle lse, bool bf16_bits) {
  Imports in;
  std::vector<TensorView> to, tl;
  for (std::size_t i = 0; i < outs.size(); ++i) {
    const std::string on = "outs[" + std::to_string(i) + "]";
    to.push_back(in.input(outs[i], on.c_str(), bf16_bits));
  }
  for (std::size_t i = 0; i < lses.size(); ++i) {
    const std::string ln = "lses[" + std::to_string(i) + "]";
    tl.push_back(in.input(lses[i], ln.c_str(), false));
  }
  const TensorView o = in.output(out, "out", bf16_bits), l = in.output(lse, "lse", false);
  nb::gil_scoped_release unlocked;
  flashtile::merge_attention_states(to, tl, o, l);
}

DispatchReport backward(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle dout, nb::handle lse,
                        nb::handle dq, nb::handle dk, nb::handle dv, std::optional<double> softmax_scale,
                        bool causal, const std::string& backend, bool strict, bool deterministic,
                        int num_threads, bool bf16_bits, bool explain, nb::handle variants) {
  Imports in;
  const TensorView tq = in.input(q, "q", bf16_bits), tk = in.input(k, "k", bf16_bits),
                   tv = in.input(v, "v", bf16_bits), to = in.input(out, "out", bf16_bits),
                   tdo = in.input(dout, "dout", bf16_bits), tl = in.input(lse, "lse", false),
                   tdq = in.output(dq, "dq", bf16_bits), tdk = in.output(dk, "dk", bf16_bits),
                   tdv = in.output(dv, "dv", bf16_bits);
  Options o = make_options(softmax_scale, causal, backend, strict, deterministic, num_threads);
  apply_variants(o, variants, dlpack_views(in));
  if (explain) return explain_backward(tq, tk, tv, to, tdo, tl, tdq, tdk, tdv, o);
  nb::gil_scoped_release unlocked;
  DispatchReport r = flashtile::backward(tq, tk, tv, to, tdo, tl, tdq, tdk, tdv, o);
  record(DispatchReport(r));
  return r;
}

// The torch path's calls: positional arguments, tensors read through torch_view, the caller's CUDA stream
// (torch's current stream of the tensors' device, 0 for CPU tensors), and nothing returned: the report is
// kept for last_dispatch(). Everything here runs on every call of flash_attn_func, so it stays lean.
void forward_torch(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse,
                   std::optional<double> softmax_scale, bool causal, const std::string& backend, bool strict,
                   std::uintptr_t stream, nb::handle variants) {
  const TensorView tq = torch_view(q, "q"), tk = torch_view(k, "k"), tv = torch_view(v, "v"),
                   to = torch_view(out, "out"), tl = torch_view(lse, "lse");
  Options o = make_options(softmax_scale, causal, backend, strict, false, 0);
  apply_variants(o, variants, torch_views());
  o.cuda_stream = reinterpret_cast<void*>(stream);
  o.device_pointers_checked = true;  // torch tensors: data_ptr is memory of the device they report
  nb::gil_scoped_release unlocked;
  record(flashtile::forward(tq, tk, tv, to, tl, o));
}

// The backward's scratch memory from torch: Options::workspace_alloc calls `make(nbytes)` (with the GIL), which
// returns a torch tensor of that many bytes on the tensors' device (torch.empty), so the memory comes from torch's
// caching allocator, and from the graph's private pool while a CUDA graph is being captured. The tensor is kept
// until the call returns; torch's allocator orders its reuse after the work queued on the stream.
struct TorchWorkspace {
  nb::handle make;
  nb::object tensor;
};

void* torch_workspace(std::size_t bytes, void* context) {
  auto* w = static_cast<TorchWorkspace*>(context);
  nb::gil_scoped_acquire gil;
  w->tensor = w->make(bytes);
  return reinterpret_cast<void*>(nb::cast<std::uintptr_t>(w->tensor.attr("data_ptr")()));
}

void backward_torch(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle dout, nb::handle lse,
                    nb::handle dq, nb::handle dk, nb::handle dv, std::optional<double> softmax_scale, bool causal,
                    const std::string& backend, bool strict, bool deterministic, std::uintptr_t stream,
                    nb::handle workspace, nb::handle variants) {
  const TensorView tq = torch_view(q, "q"), tk = torch_view(k, "k"), tv = torch_view(v, "v"),
                   to = torch_view(out, "out"), tdo = torch_view(dout, "dout"), tl = torch_view(lse, "lse"),
                   tdq = torch_view(dq, "dq"), tdk = torch_view(dk, "dk"), tdv = torch_view(dv, "dv");
  Options o = make_options(softmax_scale, causal, backend, strict, deterministic, 0);
  apply_variants(o, variants, torch_views());
  o.cuda_stream = reinterpret_cast<void*>(stream);
  o.device_pointers_checked = true;  // torch tensors: data_ptr is memory of the device they report
  TorchWorkspace ws{workspace, {}};
  o.workspace_alloc = &torch_workspace;
  o.workspace_alloc_context = &ws;
  nb::gil_scoped_release unlocked;
  record(flashtile::backward(tq, tk, tv, to, tdo, tl, tdq, tdk, tdv, o));
}

// The bridge's entry points (bridge.h): the library call and the report, errors turned into codes. Each catches
// by type in its own frame (no std::exception_ptr: nothing here depends on which C++ runtime copy made it).
int bridge_error(int code, const char* what, char* msg, std::size_t len) noexcept {
  if (msg != nullptr && len > 0) {
    std::strncpy(msg, what, len - 1);
    msg[len - 1] = '\0';
  }
  return code;
}

// Runs `call` (the library call), turning what it throws into bridge.h's codes.
template <class Call>
int bridge_call(Call&& call, char* msg, std::size_t len) noexcept {
  try {
    call();
    return 0;
  } catch (const Error& e) {
    return bridge_error(1 + static_cast<int>(e.code()), e.what(), msg, len);
  } catch (const std::exception& e) {
    return bridge_error(kBridgeOtherError, e.what(), msg, len);
  } catch (...) {
    return bridge_error(kBridgeOtherError, "unknown error", msg, len);
  }
}

int bridge_forward(const TensorView* t, const Options& o, char* msg, std::size_t len) noexcept {
  return bridge_call([&] { record(flashtile::forward(t[0], t[1], t[2], t[3], t[4], o)); }, msg, len);
}

int bridge_backward(const TensorView* t, const Options& o, char* msg, std::size_t len) noexcept {
  return bridge_call(
      [&] { record(flashtile::backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], o)); }, msg, len);
}

// The table's address, for flashtile_ext::set_bridge (an integer through torch.ops: the extension and this
// module share no Python types).
std::uintptr_t torch_bridge() {
  static const Bridge table = [] {
    Bridge b;
    b.forward = &bridge_forward;
    b.backward = &bridge_backward;
    return b;
  }();
  return reinterpret_cast<std::uintptr_t>(&table);
}

nb::dict kernel_dict(const KernelInfo& k) {
  nb::dict d;
  d["backend"] = k.backend;
  d["kernel"] = k.kernel;
  d["isa"] = k.isa;
  d["block_q"] = k.block_q;
  d["block_k"] = k.block_k;
  d["threads"] = k.threads;
  d["splits"] = k.splits;
  d["detail"] = k.detail;
  d["mask"] = k.mask;
  d["score_hooks"] = nb::cast(k.score_hooks);
  return d;
}

nb::dict report_dict(const DispatchReport& r) {
  nb::dict refused;
  for (const Refusal& x : r.refused) refused[x.backend.c_str()] = nb::cast(x.reasons);
  nb::dict d;
  d["requested"] = r.requested;
  d["ran"] = kernel_dict(r.ran);
  d["fell_back"] = r.fell_back;
  d["refused"] = refused;
  return d;
}

void bind_reports(nb::module_& m) {
  nb::class_<KernelInfo>(m, "KernelInfo", "The kernel a call ran (or would run).")
      .def_ro("backend", &KernelInfo::backend, "Backend name, e.g. 'cpu-flash'; empty when nothing ran.")
      .def_ro("kernel", &KernelInfo::kernel)
      .def_ro("isa", &KernelInfo::isa, "Instruction set: 'avx512', 'avx2', 'scalar', 'sm90', ...")
      .def_ro("block_q", &KernelInfo::block_q, "Query rows per tile.")
      .def_ro("block_k", &KernelInfo::block_k, "Key rows per tile.")
      .def_ro("threads", &KernelInfo::threads, "CPU worker threads or GPU threads per block.")
      .def_ro("splits", &KernelInfo::splits,
              "forward_kvcache: parts each sequence's keys were split into (split-KV); 0 for other calls.")
      .def_ro("detail", &KernelInfo::detail)
      .def_ro("mask", &KernelInfo::mask, "The mask the kernel ran with: 'none', 'causal', 'window(l, r)', ...")
      .def_ro("score_hooks", &KernelInfo::score_hooks, "Score hooks in the order they apply: 'softcap(c)', ...")
      .def("to_dict", &kernel_dict)
      .def("__repr__", [](const KernelInfo& k) {
        return "KernelInfo(backend='" + k.backend + "', kernel='" + k.kernel + "', isa='" + k.isa +
               "', block_q=" + std::to_string(k.block_q) + ", block_k=" + std::to_string(k.block_k) +
               ", threads=" + std::to_string(k.threads) + ", splits=" + std::to_string(k.splits) + ", detail='" +
               k.detail + "')";
      });
  nb::class_<Refusal>(m, "Refusal", "A backend that was considered and refused, with one reason per line.")
      .def_ro("backend", &Refusal::backend)
      .def_ro("reasons", &Refusal::reasons)
      .def("__repr__", [](const Refusal& r) {
        return "Refusal(backend='" + r.backend + "', reasons=" + std::to_string(r.reasons.size()) + ")";
      });
  nb::class_<DispatchReport>(m, "DispatchReport",
                             "Which kernel ran (or would run) and why every other backend did not. "
                             "str() gives a readable summary; to_dict() a plain dict.")
      .def_ro("requested", &DispatchReport::requested, "The backend asked for: 'auto' or a name.")
      .def_ro("ran", &DispatchReport::ran)
      .def_ro("fell_back", &DispatchReport::fell_back, "A named backend could not run and another one did.")
      .def_ro("refused", &DispatchReport::refused)
      .def_prop_ro("backend", [](const DispatchReport& r) { return r.ran.backend; }, "Shorthand for ran.backend.")
      .def_prop_ro("kernel", [](const DispatchReport& r) { return r.ran.kernel; }, "Shorthand for ran.kernel.")
      .def("to_dict", &report_dict)
      .def("__str__", &DispatchReport::to_string)
      .def("__repr__", [](const DispatchReport& r) { return "<DispatchReport " + r.to_string() + ">"; });
}

}  // namespace
}  // namespace flashtile::python

NB_MODULE(_core, m) {
  using namespace flashtile::python;
  m.doc() = "FlashTile's C++ library. Use the functions of the flashtile package; these are its plumbing.";
  m.attr("__version__") = FLASHTILE_VERSION;
  register_errors(m);
  bind_reports(m);
  m.def("forward", &forward, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, nb::kw_only(), "softmax_scale"_a = nb::none(),
        "causal"_a = false, "backend"_a = "auto", "strict"_a = false, "num_threads"_a = 0, "bf16_bits"_a = false,
        "explain"_a = false, "variants"_a = nb::none(),
        "Runs (or, with explain=True, only plans) the forward pass into the caller's out and lse.");
  m.def("backward", &backward, "q"_a, "k"_a, "v"_a, "out"_a, "dout"_a, "lse"_a, "dq"_a, "dk"_a, "dv"_a,
        nb::kw_only(), "softmax_scale"_a = nb::none(), "causal"_a = false, "backend"_a = "auto", "strict"_a = false,
        "deterministic"_a = false, "num_threads"_a = 0, "bf16_bits"_a = false, "explain"_a = false,
        "variants"_a = nb::none(),
        "Runs (or, with explain=True, only plans) the backward pass into the caller's dq, dk and dv.");
  m.def("forward_torch", &forward_torch, "Forward on torch tensors (the torch path's hot call).", "q"_a, "k"_a,
        "v"_a, "out"_a, "lse"_a, "softmax_scale"_a.none(), "causal"_a, "backend"_a, "strict"_a, "stream"_a,
        "variants"_a = nb::none());
  m.def("backward_torch", &backward_torch, "Backward on torch tensors (the torch path's hot call).", "q"_a, "k"_a,
        "v"_a, "out"_a, "dout"_a, "lse"_a, "dq"_a, "dk"_a, "dv"_a, "softmax_scale"_a.none(), "causal"_a,
        "backend"_a, "strict"_a, "deterministic"_a, "stream"_a, "workspace"_a, "variants"_a = nb::none());
  m.def("forward_kvcache", &forward_kvcache, "q"_a, "k_cache"_a, "v_cache"_a, "k_new"_a.none(), "v_new"_a.none(),
        "cache_seqlens"_a.none(), "block_table"_a.none(), "cache_batch_idx"_a.none(), "out"_a, "lse"_a.none(),
        "num_splits"_a, "softmax_scale"_a.none(), "causal"_a, "backend"_a, "strict"_a, "num_threads"_a,
        "variants"_a, "torch"_a, "stream"_a, "bf16_bits"_a, "explain"_a,
        "forward_kvcache (or, with explain=True, its plan): appends k_new / v_new to the caches in place, then "
        "attends; numpy arrays through DLPack or (torch=True) torch tensors.");
  m.def("merge_states", &merge_states, "outs"_a, "lses"_a, "out"_a, "lse"_a, "bf16_bits"_a = false,
        "merge_attention_states on host arrays into the caller's out and lse.");
  m.def("torch_bridge", &torch_bridge, "Address of the entry-point table for flashtile._torch_ext (bridge.h).");
  m.def("last_report", &last_report, "The report of the most recent call made through this module (any thread).");
  m.def("backend_names", &flashtile::backend_names, "Backends compiled into this build, in auto priority order.");
}
