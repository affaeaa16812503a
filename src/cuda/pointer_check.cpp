#include "pointer_check.h"

#include <cuda_runtime_api.h>

namespace flashtile::detail {

bool is_device_pointer(const void* p) {
  if (p == nullptr) return false;
  static const bool any_device = [] {
    int n = 0;
    const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
    if (!ok) (void)cudaGetLastError();
    return ok;
  }();
  if (!any_device) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice;
}

}  // namespace flashtile::detail
