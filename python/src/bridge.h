// The table of library entry points that flashtile._core hands to flashtile._torch_ext.
//
// _torch_ext is the torch path's hot door: a libtorch extension with the op flashtile_ext::attention whose
// autograd node is C++ (a Python autograd.Function costs the backward ~75 us of engine and interpreter time per
// call, bench/results/overhead.md). It does not link the library: one copy of the library (kernels, workspace
// pools, the last report) lives in _core, and the extension calls it through this table. Both modules are built
// in one CMake build with one compiler, so the C++ types below have one layout; `options_size` and `view_size`
// let the extension refuse a table from a different build.
//
// Each function returns 0 on success, 1 + flashtile::ErrorCode for a library error, 99 for anything else, and
// writes the error text (NUL-terminated, truncated to `len`) to `msg`. None of them throws or touches Python.
#pragma once

#include <cstddef>

#include "flashtile/options.h"
#include "flashtile/tensor.h"

namespace flashtile::python {

struct Bridge {
  std::size_t options_size = sizeof(Options);
  std::size_t view_size = sizeof(TensorView);
  // t: q, k, v, out, lse.
  int (*forward)(const TensorView* t, const Options& o, char* msg, std::size_t len) noexcept = nullptr;
  // t: q, k, v, out, dout, lse, dq, dk, dv.
  int (*backward)(const TensorView* t, const Options& o, char* msg, std::size_t len) noexcept = nullptr;
};

constexpr int kBridgeOtherError = 99;

}  // namespace flashtile::python
