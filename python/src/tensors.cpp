#include "tensors.h"

#include <algorithm>
#include <array>
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
    if (code == dl::dtype_code::Int && t.bits == 32) return DType::int32;  // cu_seqlens; the library says where
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

// Producers describe tensors with no elements with arbitrary strides (numpy exports all zeros), which the
// library would reject as a non-contiguous last dim. Any strides address the same empty set.
void contiguous_strides_if_empty(TensorView& v) {
  bool empty = false;
  for (int i = 0; i < v.rank; ++i) empty = empty || v.shape[static_cast<std::size_t>(i)] == 0;
  if (!empty) return;
  std::int64_t s = 1;
  for (auto i = static_cast<std::size_t>(v.rank); i-- > 0;) {
    v.stride[i] = s;
    s *= v.shape[i] > 0 ? v.shape[i] : 1;
  }
}

[[noreturn]] void too_many_dims(const char* name, std::size_t rank, const std::int64_t* shape) {
  std::ostringstream s;
  s << name << ": expected at most 4 dimensions, got " << rank << " (shape [";
  for (std::size_t i = 0; i < rank; ++i) s << (i ? ", " : "") << shape[i];
  s << "])";
  throw InvalidArgument(s.str());
}

template <class Array>
TensorView make(const Array& a, const char* name, bool bf16_bits) {
  TensorView v;
  const auto rank = a.ndim();
  if (rank > v.shape.size()) too_many_dims(name, rank, a.shape_ptr());
  v.dtype = to_dtype(a.dtype(), name, bf16_bits);
  set_device(v, a.device_type(), a.device_id(), name);
  v.rank = static_cast<int>(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    v.shape[i] = a.shape_ptr()[i];
    v.stride[i] = a.stride(i);
  }
  contiguous_strides_if_empty(v);
  v.data = static_cast<char*>(a.data_handle()) + a.byte_offset();
  return v;
}

[[noreturn]] void not_importable(nb::handle obj, const char* name, bool writable) {
  std::string type = nb::type_name(obj.type()).c_str();
  std::string why = std::string(name) + ": cannot read " + type + " through DLPack";
  if (writable) why += " as a writable tensor";
  throw nb::type_error((why + "; pass a numpy array or a torch tensor (detached) with a supported dtype").c_str());
}

// torch's objects and attribute names, looked up once. Never freed: they must not be released after the
// interpreter has gone.
struct Torch {
  nb::object tensor_type, float32, float16, bfloat16, int32;
  nb::str data_ptr{"data_ptr"}, shape{"shape"}, stride{"stride"}, dtype{"dtype"}, is_cuda{"is_cuda"},
      is_cpu{"is_cpu"}, get_device{"get_device"}, device{"device"};
};

const Torch& torch() {
  static const Torch* t = [] {
    auto* r = new Torch;
    nb::module_ m = nb::module_::import_("torch");
    r->tensor_type = m.attr("Tensor");
    r->float32 = m.attr("float32");
    r->float16 = m.attr("float16");
    r->bfloat16 = m.attr("bfloat16");
    r->int32 = m.attr("int32");
    return r;
  }();
  return *t;
}

std::int64_t to_i64(PyObject* o) {
  const long long x = PyLong_AsLongLong(o);
  if (x == -1 && PyErr_Occurred()) throw nb::python_error();
  return static_cast<std::int64_t>(x);
}

}  // namespace

TensorView torch_view(nb::handle t, const char* name) {
  const Torch& T = torch();
  if (!nb::isinstance(t, T.tensor_type))
    throw nb::type_error((std::string(name) + ": expected a torch.Tensor like q, got " +
                          nb::type_name(t.type()).c_str()).c_str());
  TensorView v;
  const nb::object dtype = t.attr(T.dtype);
  if (dtype.is(T.float32)) v.dtype = DType::float32;
  else if (dtype.is(T.bfloat16)) v.dtype = DType::bfloat16;
  else if (dtype.is(T.float16)) v.dtype = DType::float16;
  else if (dtype.is(T.int32)) v.dtype = DType::int32;  // cu_seqlens; the library refuses it for q, k, v
  else {
    std::string d = nb::str(dtype).c_str();
    if (d.rfind("torch.", 0) == 0) d = d.substr(6);
    throw DTypeError(std::string(name) + ": unsupported dtype " + d + "; FlashTile takes float32, float16 or bfloat16");
  }
  if (nb::cast<bool>(t.attr(T.is_cuda))) {
    v.device = Device::cuda;
    v.device_index = nb::cast<int>(t.attr(T.get_device)());
  } else if (!nb::cast<bool>(t.attr(T.is_cpu))) {
    throw DeviceError(std::string(name) + ": device " + nb::str(t.attr(T.device)).c_str() +
                      " is not supported; FlashTile reads CPU memory and CUDA devices");
  }
  const nb::object shape = t.attr(T.shape), stride = t.attr(T.stride)();
  const auto rank = static_cast<std::size_t>(PyTuple_GET_SIZE(shape.ptr()));
  std::array<std::int64_t, 8> dims{};
  for (std::size_t i = 0; i < rank && i < dims.size(); ++i)
    dims[i] = to_i64(PyTuple_GET_ITEM(shape.ptr(), static_cast<Py_ssize_t>(i)));
  if (rank > v.shape.size()) too_many_dims(name, std::min(rank, dims.size()), dims.data());
  v.rank = static_cast<int>(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    v.shape[i] = dims[i];
    v.stride[i] = to_i64(PyTuple_GET_ITEM(stride.ptr(), static_cast<Py_ssize_t>(i)));
  }
  contiguous_strides_if_empty(v);
  v.data = reinterpret_cast<void*>(static_cast<std::uintptr_t>(to_i64(t.attr(T.data_ptr)().ptr())));
  return v;
}

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
