// The C ABI of include/flashtile/capi.h over flashtile::forward / backward / forward_kvcache. Integer arguments are
// range-checked here, before they become C++ enums or bools: a cast of an out-of-range value to DType would
// be a value no switch expects.
#include "flashtile/capi.h"

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <sstream>
#include <string>

#include "flashtile/flashtile.h"

namespace {

static_assert(FT_DTYPE_FLOAT32 == static_cast<int>(flashtile::DType::float32));
static_assert(FT_DTYPE_FLOAT16 == static_cast<int>(flashtile::DType::float16));
static_assert(FT_DTYPE_BFLOAT16 == static_cast<int>(flashtile::DType::bfloat16));
static_assert(FT_ERR_INVALID_ARGUMENT == 1 + static_cast<int>(flashtile::ErrorCode::invalid_argument));
static_assert(FT_ERR_DTYPE == 1 + static_cast<int>(flashtile::ErrorCode::dtype));
static_assert(FT_ERR_DEVICE == 1 + static_cast<int>(flashtile::ErrorCode::device));
static_assert(FT_ERR_UNSUPPORTED == 1 + static_cast<int>(flashtile::ErrorCode::unsupported));
static_assert(FT_ERR_BACKEND == 1 + static_cast<int>(flashtile::ErrorCode::backend));

using flashtile::InvalidArgument;

flashtile::DType checked_dtype(int dtype) {
  if (dtype < FT_DTYPE_FLOAT32 || dtype > FT_DTYPE_BFLOAT16)
    throw InvalidArgument("dtype: expected 0 (float32), 1 (float16) or 2 (bfloat16), got " + std::to_string(dtype));
  return static_cast<flashtile::DType>(dtype);
}

void check_device(int device) {
  if (device < FT_DEVICE_HOST)
    throw InvalidArgument("device: expected -1 (host memory) or a CUDA device index >= 0, got " +
                          std::to_string(device));
}

bool checked_flag(const char* name, int value) {
  if (value != 0 && value != 1)
    throw InvalidArgument(std::string(name) + ": expected 0 or 1, got " + std::to_string(value));
  return value == 1;
}

flashtile::TensorView view(const char* name, const ft_tensor* t, flashtile::DType dtype, int device) {
  if (t == nullptr) throw InvalidArgument(std::string(name) + ": expected a tensor, got NULL");
  if (t->rank < 0 || t->rank > 4)
    throw InvalidArgument(std::string(name) + ": rank must be 0..4, got " + std::to_string(t->rank));
  flashtile::TensorView v;
  v.data = t->data;
  v.dtype = dtype;
  v.device = device == FT_DEVICE_HOST ? flashtile::Device::cpu : flashtile::Device::cuda;
  v.device_index = device == FT_DEVICE_HOST ? 0 : device;
  v.rank = t->rank;
  for (int i = 0; i < t->rank; ++i) {
    v.shape[static_cast<std::size_t>(i)] = t->shape[i];
    v.stride[static_cast<std::size_t>(i)] = t->stride[i];
  }
  return v;
}

// An optional tensor argument: NULL is absent.
flashtile::TensorView optional_view(const char* name, const ft_tensor* t, flashtile::DType dtype, int device) {
  return t == nullptr ? flashtile::TensorView{} : view(name, t, dtype, device);
}

void put(char* msg, int len, const std::string& s) {
  if (msg == nullptr || len <= 0) return;
  const std::size_t n = std::min(s.size(), static_cast<std::size_t>(len - 1));
  std::memcpy(msg, s.data(), n);
  msg[n] = '\0';
}

flashtile::Options options(double scale, bool causal, bool deterministic, const char* backend, bool strict) {
  flashtile::Options o;
  if (!std::isnan(scale)) o.softmax_scale = static_cast<float>(scale);
  o.causal = causal;
  o.deterministic = deterministic;
  o.backend = backend != nullptr ? backend : "auto";
  o.strict = strict;
  return o;
}

// The caller's ft_variants as this library knows it (see capi.h, "ABI"): the fields its struct_size covers, the
// defaults for the rest; refused when smaller than the first version or when unknown trailing bytes are set.
ft_variants read_variants(const ft_variants* x) {
  std::uint64_t size = 0;
  std::memcpy(&size, x, sizeof size);
  constexpr std::uint64_t kFirst = offsetof(ft_variants, max_seqlen_k) + sizeof(std::int64_t);  // version 1
  if (size < kFirst)
    throw InvalidArgument("variants: struct_size must be at least " + std::to_string(kFirst) +
                          " (sizeof(ft_variants) of the first version), got " + std::to_string(size));
  ft_variants v = FT_VARIANTS_INIT;
  std::memcpy(&v, x, static_cast<std::size_t>(std::min<std::uint64_t>(size, sizeof v)));
  const auto* bytes = reinterpret_cast<const unsigned char*>(x);
  for (std::uint64_t i = sizeof v; i < size; ++i)
    if (bytes[i] != 0)
      throw InvalidArgument("variants: struct_size " + std::to_string(size) + " is larger than this library's " +
                            std::to_string(sizeof v) + " and byte " + std::to_string(i) +
                            " is set: a field this library does not know; got struct_size " + std::to_string(size));
  return v;
}

// Options with the variants attached; dsinks only in a backward (a forward has no gradient to write).
flashtile::Options with_variants(flashtile::Options o, const ft_variants* x, int device, bool backward) {
  if (x == nullptr) return o;
  const ft_variants v = read_variants(x);
  o.window_size = {v.window_left, v.window_right};
  if (!std::isfinite(v.softcap) || std::abs(v.softcap) > FLT_MAX) {  // a float cannot hold it
    std::ostringstream s;
    s << "softcap: must be finite and >= 0 (0 = off), got " << v.softcap;
    throw InvalidArgument(s.str());
  }
  o.softcap = static_cast<float>(v.softcap);
  auto optional = [device](const char* name, const ft_tensor* t, flashtile::DType dtype) {
    return optional_view(name, t, dtype, device);
  };
  using flashtile::DType;
  o.alibi_slopes = optional("alibi_slopes", v.alibi_slopes, DType::float32);
  o.sinks = optional("sinks", v.sinks, DType::float32);
  if (backward) o.dsinks = optional("dsinks", v.dsinks, DType::float32);
  o.cu_seqlens_q = optional("cu_seqlens_q", v.cu_seqlens_q, DType::int32);
  o.cu_seqlens_k = optional("cu_seqlens_k", v.cu_seqlens_k, DType::int32);
  o.seqused_k = optional("seqused_k", v.seqused_k, DType::int32);
  o.max_seqlen_q = v.max_seqlen_q;
  o.max_seqlen_k = v.max_seqlen_k;
  if (v.sm_margin < INT_MIN || v.sm_margin > INT_MAX)  // its sign is validation's to check, as every door's
    throw InvalidArgument("sm_margin: must fit an int, got " + std::to_string(v.sm_margin));
  o.sm_margin = static_cast<int>(v.sm_margin);
  return o;
}

// A forward's options (ft_forward_ex, ft_forward_kvcache): the flags checked, the variants attached.
flashtile::Options forward_options(double scale, int causal, const char* backend, int strict,
                                   const ft_variants* variants, int device) {
  return with_variants(options(scale, checked_flag("causal", causal), false, backend, checked_flag("strict", strict)),
                       variants, device, false);
}

template <class F>
int guarded(char* msg, int len, F&& f) {
  try {
    const flashtile::DispatchReport report = f();
    if (msg != nullptr && len > 0) put(msg, len, report.to_string());  // no report text for a caller without a buffer
    return FT_OK;
  } catch (const flashtile::Error& e) {
    put(msg, len, e.what());
    return 1 + static_cast<int>(e.code());
  } catch (const std::exception& e) {
    put(msg, len, e.what());
    return FT_ERR_OTHER;
  }
}

}  // namespace

extern "C" {

int ft_forward(const ft_tensor* q, const ft_tensor* k, const ft_tensor* v, const ft_tensor* out, const ft_tensor* lse,
               int dtype, int device, double scale, int causal, const char* backend, int strict, char* msg,
               int msg_len) {
  return ft_forward_ex(q, k, v, out, lse, dtype, device, scale, causal, backend, strict, nullptr, msg, msg_len);
}

int ft_forward_ex(const ft_tensor* q, const ft_tensor* k, const ft_tensor* v, const ft_tensor* out,
                  const ft_tensor* lse, int dtype, int device, double scale, int causal, const char* backend,
                  int strict, const ft_variants* variants, char* msg, int msg_len) {
  return guarded(msg, msg_len, [&] {
    const flashtile::DType t = checked_dtype(dtype);
    check_device(device);
    const flashtile::Options o = forward_options(scale, causal, backend, strict, variants, device);
    return flashtile::forward(view("q", q, t, device), view("k", k, t, device), view("v", v, t, device),
                              view("out", out, t, device), view("lse", lse, flashtile::DType::float32, device), o);
  });
}

int ft_backward(const ft_tensor* q, const ft_tensor* k, const ft_tensor* v, const ft_tensor* out,
                const ft_tensor* dout, const ft_tensor* lse, const ft_tensor* dq, const ft_tensor* dk,
                const ft_tensor* dv, int dtype, int device, double scale, int causal, int deterministic,
                const char* backend, int strict, char* msg, int msg_len) {
  return ft_backward_ex(q, k, v, out, dout, lse, dq, dk, dv, dtype, device, scale, causal, deterministic, backend,
                        strict, nullptr, msg, msg_len);
}

int ft_backward_ex(const ft_tensor* q, const ft_tensor* k, const ft_tensor* v, const ft_tensor* out,
                   const ft_tensor* dout, const ft_tensor* lse, const ft_tensor* dq, const ft_tensor* dk,
                   const ft_tensor* dv, int dtype, int device, double scale, int causal, int deterministic,
                   const char* backend, int strict, const ft_variants* variants, char* msg, int msg_len) {
  return guarded(msg, msg_len, [&] {
    const flashtile::DType t = checked_dtype(dtype);
    check_device(device);
    const flashtile::Options o = with_variants(options(scale, checked_flag("causal", causal),
                                                       checked_flag("deterministic", deterministic), backend,
                                                       checked_flag("strict", strict)),
                                               variants, device, true);
    return flashtile::backward(view("q", q, t, device), view("k", k, t, device), view("v", v, t, device),
                               view("out", out, t, device), view("dout", dout, t, device),
                               view("lse", lse, flashtile::DType::float32, device), view("dq", dq, t, device),
                               view("dk", dk, t, device), view("dv", dv, t, device), o);
  });
}

int ft_forward_kvcache(const ft_tensor* q, const ft_tensor* k_cache, const ft_tensor* v_cache, const ft_tensor* k_new,
                       const ft_tensor* v_new, const ft_tensor* cache_seqlens, const ft_tensor* block_table,
                       const ft_tensor* cache_batch_idx, const ft_tensor* out, const ft_tensor* lse, int num_splits,
                       int async_index_check, int dtype, int device, double scale, int causal, const char* backend, int strict,
                       const ft_variants* variants, char* msg, int msg_len) {
  return guarded(msg, msg_len, [&] {
    const flashtile::DType t = checked_dtype(dtype);
    check_device(device);
    const flashtile::Options o = forward_options(scale, causal, backend, strict, variants, device);
    auto optional = [device](const char* name, const ft_tensor* x, flashtile::DType dt) {
      return optional_view(name, x, dt, device);
    };
    using flashtile::DType;
    flashtile::KVCache c;
    c.k_cache = view("k_cache", k_cache, t, device);
    c.v_cache = view("v_cache", v_cache, t, device);
    c.k_new = optional("k_new", k_new, t);
    c.v_new = optional("v_new", v_new, t);
    c.cache_seqlens = optional("cache_seqlens", cache_seqlens, DType::int32);
    c.block_table = optional("block_table", block_table, DType::int32);
    c.cache_batch_idx = optional("cache_batch_idx", cache_batch_idx, DType::int32);
    c.num_splits = num_splits;
    c.async_index_check = async_index_check != 0;
    return flashtile::forward_kvcache(view("q", q, t, device), c, view("out", out, t, device),
                                      optional("lse", lse, DType::float32), o);
  });
}

}  // extern "C"
