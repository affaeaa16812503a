// Typed errors. Every message names the argument and the values it got.
//
// The hierarchy is small on purpose so that bindings can map it one to one:
//   InvalidArgument -> ValueError   (shapes, strides, sizes, options)
//   DTypeError      -> TypeError    (element types that differ where they must match)
//   DeviceError     -> ValueError   (a pointer on the wrong device for the backend)
//   UnsupportedError-> RuntimeError (no backend can run the call, or strict mode refused a fallback)
//   BackendError    -> RuntimeError (a kernel or driver call failed)
#pragma once

#include <stdexcept>
#include <string>

namespace flashtile {

enum class ErrorCode { invalid_argument, dtype, device, unsupported, backend };

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

class InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& m) : Error(ErrorCode::invalid_argument, m) {}
};
class DTypeError : public Error {
 public:
  explicit DTypeError(const std::string& m) : Error(ErrorCode::dtype, m) {}
};
class DeviceError : public Error {
 public:
  explicit DeviceError(const std::string& m) : Error(ErrorCode::device, m) {}
};
class UnsupportedError : public Error {
 public:
  explicit UnsupportedError(const std::string& m) : Error(ErrorCode::unsupported, m) {}
};
class BackendError : public Error {
 public:
  explicit BackendError(const std::string& m) : Error(ErrorCode::backend, m) {}
};

}  // namespace flashtile
