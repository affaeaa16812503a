#include "tensors.h"

#include <cstdint>
#include <sstream>
#include <string>

#include "flashtile/errors.h"

namespace nb = nanobind;

namespace flashtile::python {
namespace {

namespace dl = nb::dlpack;

std::string dtype_str(dl::dtype t) {
  std::ostringstream s;
  switch (static_cast<dl::dtype_code>(t.code)) {
    case dl::dtype_code::Int: s << "int"; break;
    case dl::dtype_code::UInt: s << "uint"; break;
    case dl::dtype_code::Float: s << "float"; break;
    case dl::dtype_code::Bfloat: s << "bfloat"; break;
    case dl::dtype_code::Complex: s << "complex"; break;
    case dl::dtype_code::Bool: s << "bool"; break;
    default: s << "dlpack-code-" << int(t.code) << "-"; break;
  }
  s << int(t.bits);
  if (t.lanes != 1) s << "x" << t.lanes;
  return s.str();
}

DType to_dtype(dl::dtype t, const char* name, bool bf16_bits) {
  const auto code = static_cast<dl::dtype_code>(t.code);
  if (t.lanes == 1) {
    if (code == dl::dtype_code::Float && t.bits == 32) return DType::float32;
    if (code == dl::dtype_code::Float && t.bits == 16) return DType::float16;
    if (code == dl::dtype_code::Bfloat && t.bits == 16) return DType::bfloat16;
    if (bf16_bits && code == dl::dtype_code::UInt && t.bits == 16) return DType::bfloat16;
  }
  throw DTypeError(std::string(name) + ": unsupported dtype " + dtype_str(t) +
                   "; FlashTile takes float32, float16 or bfloat16");
}

// DLPack device types (dlpack.h): 1 CPU, 2 CUDA, 3 CUDA host (pinned), 13 CUDA managed.
void set_device(TensorView& v, int type, int id, const char* name) {
  switch (type) {
    case nb::device::cpu::value:
    case nb::device::cuda_host::value:  // pinned host memory: the CPU reads it directly
      v.device = Device::cpu;
      v.device_index = 0;
      return;
    case nb::device::cuda::value:
    case nb::device::cuda_managed::value:
      v.device = Device::cuda;
      v.device_index = id;
      return;
    default:
      throw DeviceError(std::string(name) + ": DLPack device type " + std::to_string(type) +
                        " is not supported; FlashTile reads CPU memory and CUDA devices");
  }
}

template <class Array>
TensorView make(const Array& a, const char* name, bool bf16_bits) {
  TensorView v;
  const auto rank = a.ndim();
  if (rank > v.shape.size()) {
    std::ostringstream s;
    s << name << ": expected at most " << v.shape.size() << " dimensions, got " << rank << " (shape [";
    for (std::size_t i = 0; i < rank; ++i) s << (i ? ", " : "") << a.shape(i);
    s << "])";
    throw InvalidArgument(s.str());
  }
  v.dtype = to_dtype(a.dtype(), name, bf16_bits);
  set_device(v, a.device_type(), a.device_id(), name);
  v.rank = static_cast<int>(rank);
  bool empty = false;
  for (std::size_t i = 0; i < rank; ++i) {
    v.shape[i] = a.shape_ptr()[i];
    v.stride[i] = a.stride(i);
    empty = empty || v.shape[i] == 0;
  }
  // Producers describe tensors with no elements with arbitrary strides (numpy exports all zeros), which
  // the library would reject as a non-contiguous last dim. Any strides address the same empty set.
  if (empty) {
    std::int64_t s = 1;
    for (std::size_t i = rank; i-- > 0;) {
      v.stride[i] = s;
      s *= v.shape[i] > 0 ? v.shape[i] : 1;
    }
  }
  v.data = static_cast<char*>(a.data_handle()) + a.byte_offset();
  return v;
}

[[noreturn]] void not_importable(nb::handle obj, const char* name, bool writable) {
  std::string type = nb::type_name(obj.type()).c_str();
  std::string why = std::string(name) + ": cannot read " + type + " through DLPack";
  if (writable) why += " as a writable tensor";
  throw nb::type_error((why + "; pass a numpy array or a torch tensor (detached) with a supported dtype").c_str());
}

}  // namespace

TensorView Imports::input(nb::handle obj, const char* name, bool bf16_bits) {
  nb::ndarray<nb::ro> a;
  // convert=false: a tensor that cannot be viewed as it is must be an error, never a silent copy.
  if (!nb::try_cast(obj, a, false)) not_importable(obj, name, false);
  inputs_.push_back(a);
  return make(a, name, bf16_bits);
}

TensorView Imports::output(nb::handle obj, const char* name, bool bf16_bits) {
  nb::ndarray<> a;
  if (!nb::try_cast(obj, a, false)) not_importable(obj, name, true);
  outputs_.push_back(a);
  return make(a, name, bf16_bits);
}

}  // namespace flashtile::python
