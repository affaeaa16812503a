// Device copies of the tests' host tensors (same strides, NaN padding included), and the GPU skip rule.
#pragma once

#include <cstdlib>
#include <string>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "support.h"

namespace ft_gpu {

inline bool have_gpu() {
  static const bool ok = [] {
    int n = 0;
    const bool r = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
    (void)cudaGetLastError();
    return r;
  }();
  return ok;
}

#define FT_REQUIRE_GPU() \
  if (!::ft_gpu::have_gpu()) GTEST_SKIP() << "no CUDA device on this machine"

#define FT_CUDA_OK(expr)                                                              \
  do {                                                                                \
    const cudaError_t e_ = (expr);                                                    \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_);            \
  } while (0)

// Elements spanned by a view (its strides are non-negative).
inline std::int64_t span_elems(const flashtile::TensorView& v) {
  std::int64_t off = 0;
  for (int i = 0; i < v.rank; ++i) {
    const auto d = static_cast<std::size_t>(i);
    if (v.shape[d] == 0) return 0;
    off += (v.shape[d] - 1) * v.stride[d];
  }
  return off + 1;
}

// A device tensor mirroring a host ft_test::Tensor byte for byte.
class DevTensor {
 public:
  explicit DevTensor(const ft_test::Tensor& host) : view_(host.view()) {
    bytes_ = static_cast<std::size_t>(span_elems(view_)) * flashtile::dtype_size(view_.dtype);
    void* p = nullptr;
    if (bytes_ > 0 && cudaMalloc(&p, bytes_) != cudaSuccess) throw std::runtime_error("cudaMalloc failed");
    view_.data = p;
    view_.device = flashtile::Device::cuda;
    view_.device_index = 0;
    upload(host);
  }
  ~DevTensor() {
    if (view_.data != nullptr) cudaFree(view_.data);
  }
  DevTensor(const DevTensor&) = delete;
  DevTensor& operator=(const DevTensor&) = delete;

  void upload(const ft_test::Tensor& host) {
    if (bytes_ > 0 && cudaMemcpy(view_.data, host.view().data, bytes_, cudaMemcpyHostToDevice) != cudaSuccess)
      throw std::runtime_error("cudaMemcpy H2D failed");
  }
  void download(ft_test::Tensor& host) const {
    if (bytes_ > 0 && cudaMemcpy(host.view().data, view_.data, bytes_, cudaMemcpyDeviceToHost) != cudaSuccess)
      throw std::runtime_error("cudaMemcpy D2H failed");
  }
  const flashtile::TensorView& view() const { return view_; }
  flashtile::TensorView& view() { return view_; }

 private:
  flashtile::TensorView view_;
  std::size_t bytes_ = 0;
};

// All operands of a Problem on the device; outputs start as NaN (poison), re-poisoned by poison().
struct DevProblem {
  DevTensor q, k, v, out, lse, dout, dq, dk, dv;
  explicit DevProblem(ft_test::Problem& p)
      : q(p.q), k(p.k), v(p.v), out(poisoned(p.out)), lse(poisoned(p.lse)), dout(p.dout), dq(poisoned(p.dq)),
        dk(poisoned(p.dk)), dv(poisoned(p.dv)) {}
  static const ft_test::Tensor& poisoned(ft_test::Tensor& t) {
    t.fill(std::numeric_limits<double>::quiet_NaN());
    return t;
  }
  void poison_grads(ft_test::Problem& p) {
    dq.upload(poisoned(p.dq));
    dk.upload(poisoned(p.dk));
    dv.upload(poisoned(p.dv));
  }
};

// The CUDA backend under test: $FT_GPU_BACKEND, cuda-sm80 by default (scripts/gpu_check.sh runs the suite
// once per backend).
inline std::string gpu_backend() {
  const char* e = std::getenv("FT_GPU_BACKEND");
  return e != nullptr && *e != '\0' ? e : "cuda-sm80";
}

// Options for the CUDA backend under test, strict so a refusal is an error, not a silent CPU fallback.
inline flashtile::Options cuda_options(const ft_test::Case& c, bool deterministic = false) {
  flashtile::Options o;
  o.causal = c.causal;
  o.backend = gpu_backend();
  o.strict = true;
  o.deterministic = deterministic;
  return o;
}

// The same for a backward call (both CUDA backends run both directions).
inline flashtile::Options cuda_options_bwd(const ft_test::Case& c, bool deterministic = false) {
  return cuda_options(c, deterministic);
}

// Empty when the backward (deterministic or not) would run on the backend under test; else the refusal text.
inline std::string refusal_bwd(const DevProblem& d, const ft_test::Case& c, bool deterministic = false) {
  try {
    const auto rb = flashtile::explain_backward(d.q.view(), d.k.view(), d.v.view(), d.out.view(), d.dout.view(),
                                                d.lse.view(), d.dq.view(), d.dk.view(), d.dv.view(),
                                                cuda_options_bwd(c, deterministic));
    return rb.ran.backend == gpu_backend() ? std::string() : rb.to_string();
  } catch (const flashtile::Error& e) {
    return e.what();
  }
}

// Empty when the CUDA backend would run this problem; else the refusal text (e.g. a kernel this subset
// build did not compile). Both directions are asked: a subset build may hold a call's forward kernel and not its backward one (the
// backends' head-dim buckets differ: d = 8 is sm90's bucket 64 and sm80's bucket 32).
inline std::string refusal(const DevProblem& d, const ft_test::Case& c) {
  try {
    const auto r =
        flashtile::explain_forward(d.q.view(), d.k.view(), d.v.view(), d.out.view(), d.lse.view(), cuda_options(c));
    if (r.ran.backend != gpu_backend()) return r.to_string();
  } catch (const flashtile::Error& e) {
    return e.what();
  }
  return refusal_bwd(d, c);
}

}  // namespace ft_gpu
