// Owning, contiguous host buffers for one attention problem, filled with N(0, 1) data.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "args.h"
#include "flashtile/tensor.h"

namespace flashtile::app {

class Buffer {
 public:
  Buffer(DType dtype, std::vector<std::int64_t> shape);
  TensorView view();
  std::int64_t numel() const { return numel_; }
  void fill_normal(std::mt19937_64& rng);
  std::vector<float> to_float() const;  // for the float32 standard-attention baseline
  float* f32() { return dtype_ == DType::float32 ? reinterpret_cast<float*>(bytes_.data()) : nullptr; }

 private:
  DType dtype_;
  std::vector<std::int64_t> shape_;
  std::int64_t numel_ = 1;
  std::vector<unsigned char> bytes_;
};

struct Problem {
  Shape s;
  Buffer q, k, v, out, lse, dout, dq, dk, dv;
  Problem(const Shape& shape, std::uint64_t seed, bool with_backward);
};

}  // namespace flashtile::app
