// DLPack tensors (numpy arrays, torch tensors, ...) to flashtile::TensorView, without copying.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <vector>

#include "flashtile/tensor.h"

namespace flashtile::python {

// Keeps every imported DLPack tensor alive for the duration of one library call (the views point into
// them while the GIL is released).
class Imports {
 public:
  // `name` is the argument name used in error messages. Outputs must be writable.
  // With bf16_bits, 16-bit unsigned integers are read as bfloat16: numpy cannot export ml_dtypes'
  // bfloat16 through DLPack, so the Python layer passes those arrays as uint16 views.
  TensorView input(nanobind::handle obj, const char* name, bool bf16_bits);
  TensorView output(nanobind::handle obj, const char* name, bool bf16_bits);

 private:
  std::vector<nanobind::ndarray<nanobind::ro>> inputs_;
  std::vector<nanobind::ndarray<>> outputs_;
};

// A torch.Tensor read through its own attributes (data_ptr, shape, stride, dtype, device) instead of DLPack:
// on the H200 host, importing the five tensors of a forward through torch's __dlpack__ cost 18 us, about four
// times a tiny call's GPU time (bench/gpu_overhead.py, bench/results/overhead.md). The caller keeps `t` alive
// for the call (it is an argument of the Python frame that called the binding). `name` is used in errors.
TensorView torch_view(nanobind::handle t, const char* name);

}  // namespace flashtile::python
