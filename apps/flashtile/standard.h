// Standard attention, the baseline FlashTile is measured against: float32, S and P materialised for
// every head at once (as an eager framework does), OpenBLAS sgemm for the products, one BLAS thread per
// OpenMP worker. P is kept from forward to backward, as autograd keeps it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "args.h"

namespace flashtile::app {

// The BLAS behind the baseline, as OpenBLAS reports itself: build options and the kernel set (core) it chose
// for this CPU, which decides its speed.
std::string blas_description();

class StandardAttention {
 public:
  StandardAttention(const Shape& s, int threads);
  // Contiguous [B,S,H,D] float32 operands.
  void forward(const float* q, const float* k, const float* v, float* out, float* lse);
  void backward(const float* q, const float* k, const float* v, const float* dout, float* dq, float* dk, float* dv);
  void release();  // frees P

 private:
  Shape s_;
  int threads_;
  float scale_;
  std::unique_ptr<float[]> p_;  // [B, Hq, Sq, Sk]
  std::int64_t p_size_ = 0;
};

}  // namespace flashtile::app
