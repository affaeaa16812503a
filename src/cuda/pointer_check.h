// Whether a pointer is CUDA device memory (cudaMalloc / cudaMallocAsync). Used by the CPU backends to refuse
// device pointers (src/cpu/backends.cpp, host_only()); compiled only when the CUDA backend is built.
#pragma once

namespace flashtile::detail {

// False on machines without a CUDA device, for host memory (pageable, pinned or registered) and for managed
// memory (the CPU can read it). The first call initialises the CUDA runtime.
bool is_device_pointer(const void* p);

}  // namespace flashtile::detail
