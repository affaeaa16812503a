#include "flashtile/tensor.h"

#include <string>

#include "flashtile/errors.h"

namespace flashtile {

std::int64_t TensorView::numel() const noexcept {
  if (rank < 0 || rank > static_cast<int>(shape.size())) return -1;  // not a shape this view can hold
  std::int64_t n = 1;
  for (int i = 0; i < rank; ++i)
    if (__builtin_mul_overflow(n, shape[static_cast<std::size_t>(i)], &n)) return -1;
  return n;
}

bool TensorView::empty() const noexcept { return numel() == 0; }

TensorView make_view(void* data, DType dtype, std::initializer_list<std::int64_t> shape, Device device) {
  if (shape.size() > 4)
    throw InvalidArgument("shape: at most 4 dimensions are supported, got " + std::to_string(shape.size()));
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.rank = static_cast<int>(shape.size());
  std::size_t i = 0;
  for (std::int64_t s : shape) {
    if (i == 4) break;
    t.shape[i++] = s;
  }
  std::int64_t stride = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    t.stride[static_cast<std::size_t>(d)] = stride;
    stride *= t.shape[static_cast<std::size_t>(d)] > 0 ? t.shape[static_cast<std::size_t>(d)] : 1;
  }
  return t;
}

TensorView make_view(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                     std::initializer_list<std::int64_t> stride, Device device) {
  TensorView t = make_view(data, dtype, shape, device);
  if (stride.size() != shape.size())
    throw InvalidArgument("stride: " + std::to_string(stride.size()) + " strides given for a shape of " +
                          std::to_string(shape.size()) + " dimensions");
  std::size_t i = 0;
  for (std::int64_t s : stride) {
    if (i == 4) break;
    t.stride[i++] = s;
  }
  return t;
}

}  // namespace flashtile
