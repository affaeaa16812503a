#include "errors.h"

#include <cstddef>
#include <exception>
#include <iterator>
#include <string>

#include "flashtile/errors.h"

namespace nb = nanobind;

namespace flashtile::python {
namespace {

// Indexed by flashtile::ErrorCode. The types live as long as the interpreter: the module holds a
// reference and so do these pointers (never released; the module cannot be unloaded).
PyObject* g_types[5] = {};
PyObject* g_base = nullptr;  // for codes added to the core later

PyObject* make_type(nb::module_& m, const char* name, const char* doc, PyObject* bases) {
  const std::string qualified = std::string("flashtile.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  if (type == nullptr) throw nb::python_error();
  m.attr(name) = nb::handle(type);
  return type;
}

// Each subclass also derives from the builtin that callers already catch (ValueError, TypeError,
// RuntimeError), so `except ValueError` keeps working and FlashTileError catches them all.
PyObject* make_subtype(nb::module_& m, const char* name, const char* doc, PyObject* base, PyObject* builtin) {
  nb::object bases = nb::make_tuple(nb::handle(base), nb::handle(builtin));
  return make_type(m, name, doc, bases.ptr());
}

}  // namespace

void register_errors(nb::module_& m) {
  PyObject* base = make_type(m, "FlashTileError", "Base class of every error raised by FlashTile.", nullptr);
  g_base = base;
  g_types[static_cast<int>(ErrorCode::invalid_argument)] =
      make_subtype(m, "InvalidArgumentError", "A shape, stride, size or option is invalid (a ValueError).", base,
                   PyExc_ValueError);
  g_types[static_cast<int>(ErrorCode::dtype)] = make_subtype(
      m, "DTypeError", "An element type is unsupported or differs where it must match (a TypeError).", base,
      PyExc_TypeError);
  g_types[static_cast<int>(ErrorCode::device)] = make_subtype(
      m, "DeviceError", "A tensor is on the wrong device, or devices differ (a ValueError).", base,
      PyExc_ValueError);
  g_types[static_cast<int>(ErrorCode::unsupported)] = make_subtype(
      m, "UnsupportedError", "No backend can run the call, or strict mode refused a fallback (a RuntimeError).",
      base, PyExc_RuntimeError);
  g_types[static_cast<int>(ErrorCode::backend)] =
      make_subtype(m, "BackendError", "A kernel or driver call failed (a RuntimeError).", base, PyExc_RuntimeError);

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      const auto i = static_cast<std::size_t>(e.code());
      PyObject* type = i < std::size(g_types) && g_types[i] != nullptr ? g_types[i] : g_base;
      PyErr_SetString(type, e.what());
    }
    // Anything else propagates to nanobind's default translators.
  });
}

}  // namespace flashtile::python
