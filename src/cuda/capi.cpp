// A C ABI over flashtile::forward / backward for ctypes callers (bench/gpu_bench.py and
// tests/gpu/test_torch_parity.py load libflashtile_capi.so next to PyTorch, so both run in one process).
// Returns 0 on success, otherwise 1 + flashtile::ErrorCode (or 99 for other exceptions); `msg` receives the
// dispatch report or the error text.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>

#include "flashtile/flashtile.h"

extern "C" {

struct ft_tensor {
  void* data;
  std::int64_t shape[4];
  std::int64_t stride[4];
  int rank;
};

}  // extern "C"

namespace {

flashtile::TensorView view(const ft_tensor& t, int dtype, int device) {
  flashtile::TensorView v;
  v.data = t.data;
  v.dtype = static_cast<flashtile::DType>(dtype);
  v.device = device < 0 ? flashtile::Device::cpu : flashtile::Device::cuda;
  v.device_index = device < 0 ? 0 : device;
  v.rank = t.rank;
  for (int i = 0; i < 4; ++i) {
    v.shape[static_cast<std::size_t>(i)] = t.shape[i];
    v.stride[static_cast<std::size_t>(i)] = t.stride[i];
  }
  return v;
}

void put(char* msg, int len, const std::string& s) {
  if (msg == nullptr || len <= 0) return;
  const std::size_t n = std::min(s.size(), static_cast<std::size_t>(len - 1));
  std::memcpy(msg, s.data(), n);
  msg[n] = '\0';
}

flashtile::Options options(double scale, int causal, int deterministic, const char* backend, int strict) {
  flashtile::Options o;
  if (!std::isnan(scale)) o.softmax_scale = static_cast<float>(scale);
  o.causal = causal != 0;
  o.deterministic = deterministic != 0;
  o.backend = backend != nullptr ? backend : "auto";
  o.strict = strict != 0;
  return o;
}

template <class F>
int guarded(char* msg, int len, F&& f) {
  try {
    put(msg, len, f().to_string());
    return 0;
  } catch (const flashtile::Error& e) {
    put(msg, len, e.what());
    return 1 + static_cast<int>(e.code());
  } catch (const std::exception& e) {
    put(msg, len, e.what());
    return 99;
  }
}

}  // namespace

extern "C" {

#define FT_EXPORT __attribute__((visibility("default")))

// scale: NaN for the default 1/sqrt(D). device: -1 for host memory, else the CUDA device index.
FT_EXPORT int ft_forward(const ft_tensor* q, const ft_tensor* k, const ft_tensor* v, const ft_tensor* out,
               const ft_tensor* lse, int dtype, int device, double scale, int causal, const char* backend, int strict,
               char* msg, int msg_len) {
  return guarded(msg, msg_len, [&] {
    flashtile::TensorView l = view(*lse, dtype, device);
    l.dtype = flashtile::DType::float32;
    return flashtile::forward(view(*q, dtype, device), view(*k, dtype, device), view(*v, dtype, device),
                              view(*out, dtype, device), l, options(scale, causal, 0, backend, strict));
  });
}

FT_EXPORT int ft_backward(const ft_tensor* q, const ft_tensor* k, const ft_tensor* v, const ft_tensor* out,
                const ft_tensor* dout, const ft_tensor* lse, const ft_tensor* dq, const ft_tensor* dk,
                const ft_tensor* dv, int dtype, int device, double scale, int causal, int deterministic,
                const char* backend, int strict, char* msg, int msg_len) {
  return guarded(msg, msg_len, [&] {
    flashtile::TensorView l = view(*lse, dtype, device);
    l.dtype = flashtile::DType::float32;
    return flashtile::backward(view(*q, dtype, device), view(*k, dtype, device), view(*v, dtype, device),
                               view(*out, dtype, device), view(*dout, dtype, device), l, view(*dq, dtype, device),
                               view(*dk, dtype, device), view(*dv, dtype, device),
                               options(scale, causal, deterministic, backend, strict));
  });
}

}  // extern "C"
