// A non-owning view of a strided tensor of up to four dimensions.
//
// FlashTile never allocates or owns the user's tensors: every boundary (C++ API, Python binding, CUDA
// launch) passes a pointer, a dtype, a device, shapes and element strides. Strides are in elements, not
// bytes, as in PyTorch and DLPack.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>

#include "flashtile/types.h"

namespace flashtile {

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::float32;
  Device device = Device::cpu;
  int device_index = 0;
  int rank = 0;
  std::array<std::int64_t, 4> shape{};
  std::array<std::int64_t, 4> stride{};

  // Number of elements, or -1 when the product overflows int64 or the rank is outside 0..4 (validation reports
  // both).
  std::int64_t numel() const noexcept;
  bool empty() const noexcept;
};

// Row-major (contiguous) strides for `shape`.
TensorView make_view(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                     Device device = Device::cpu);
TensorView make_view(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                     std::initializer_list<std::int64_t> stride, Device device = Device::cpu);

}  // namespace flashtile
