#include "problem.h"

#include <bit>
#include <cstring>

namespace flashtile::app {

Buffer::Buffer(DType dtype, std::vector<std::int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
  for (auto d : shape_) numel_ *= d;
  bytes_.resize(static_cast<std::size_t>(numel_) * dtype_size(dtype));
}

TensorView Buffer::view() {
  TensorView t;
  t.data = bytes_.data();
  t.dtype = dtype_;
  t.rank = static_cast<int>(shape_.size());
  std::int64_t stride = 1;
  for (int i = t.rank - 1; i >= 0; --i) {
    t.shape[static_cast<std::size_t>(i)] = shape_[static_cast<std::size_t>(i)];
    t.stride[static_cast<std::size_t>(i)] = stride;
    stride *= shape_[static_cast<std::size_t>(i)];
  }
  return t;
}

void Buffer::fill_normal(std::mt19937_64& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (std::int64_t i = 0; i < numel_; ++i) {
    const float x = nd(rng);
    unsigned char* p = bytes_.data() + static_cast<std::size_t>(i) * dtype_size(dtype_);
    if (dtype_ == DType::float32) {
      std::memcpy(p, &x, 4);
    } else if (dtype_ == DType::float16) {
      const _Float16 h = static_cast<_Float16>(x);
      std::memcpy(p, &h, 2);
    } else {
      const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
      const auto b = static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
      std::memcpy(p, &b, 2);
    }
  }
}

std::vector<float> Buffer::to_float() const {
  std::vector<float> out(static_cast<std::size_t>(numel_));
  for (std::int64_t i = 0; i < numel_; ++i) {
    const unsigned char* p = bytes_.data() + static_cast<std::size_t>(i) * dtype_size(dtype_);
    if (dtype_ == DType::float32) {
      std::memcpy(&out[static_cast<std::size_t>(i)], p, 4);
    } else if (dtype_ == DType::float16) {
      _Float16 h;
      std::memcpy(&h, p, 2);
      out[static_cast<std::size_t>(i)] = static_cast<float>(h);
    } else {
      std::uint16_t b;
      std::memcpy(&b, p, 2);
      out[static_cast<std::size_t>(i)] = std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
    }
  }
  return out;
}

Problem::Problem(const Shape& shape, std::uint64_t seed, bool with_backward)
    : s(shape),
      q(shape.dtype, {shape.batch, shape.seqlen_q, shape.heads, shape.hdim}),
      k(shape.dtype, {shape.batch, shape.sk(), shape.kv(), shape.hdim}),
      v(shape.dtype, {shape.batch, shape.sk(), shape.kv(), shape.dv()}),
      out(shape.dtype, {shape.batch, shape.seqlen_q, shape.heads, shape.dv()}),
      lse(DType::float32, {shape.batch, shape.heads, shape.seqlen_q}),
      dout(shape.dtype, {with_backward ? shape.batch : 0, shape.seqlen_q, shape.heads, shape.dv()}),
      dq(shape.dtype, {with_backward ? shape.batch : 0, shape.seqlen_q, shape.heads, shape.hdim}),
      dk(shape.dtype, {with_backward ? shape.batch : 0, shape.sk(), shape.kv(), shape.hdim}),
      dv(shape.dtype, {with_backward ? shape.batch : 0, shape.sk(), shape.kv(), shape.dv()}) {
  std::mt19937_64 rng(seed);
  q.fill_normal(rng);
  k.fill_normal(rng);
  v.fill_normal(rng);
  dout.fill_normal(rng);
}

}  // namespace flashtile::app
