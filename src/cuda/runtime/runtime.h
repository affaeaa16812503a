// The CUDA runtime layer every CUDA backend shares (sm80 today, sm90 next): device properties, a scoped
// device switch, the backward's workspace (caller's memory, caller's allocator or a per-device pool), the
// device-pointer checks of can_run, and CUDA errors as typed errors. No kernels and no CuTe here.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <vector>

#include "core/backend.h"

namespace flashtile::cuda {

// Throws BackendError "<backend>: <what> failed: <error name>: <error string>" unless e is cudaSuccess.
void check(cudaError_t e, const char* backend, const char* what);

struct Gpu {
  int major = 0, minor = 0;
  int smem_optin = 0;  // bytes of shared memory a block may opt into
  int sms = 0;         // streaming multiprocessors
  std::string name;
};
struct Gpus {
  cudaError_t error = cudaSuccess;
  std::vector<Gpu> list;
};
// The devices of this process, queried once.
const Gpus& gpus();
// The device `index`, or null when it does not exist.
const Gpu* gpu(int index);
// Streaming multiprocessors of device `device_index` (132, the H100's and H200's count, when it is unknown): the
// persistent kernels' CTA count.
int sm_count(int device_index);
// SMs the call's SM-sized grids use (cuda-sm90's persistent forward, the split-KV plan): the device's less
// Options::sm_margin; check_common refuses a margin that leaves none (at least 1 here all the same).
int call_sms(const detail::AttnParams& p);

// Sets the current device for the scope of a call and restores the caller's.
class DeviceGuard {
 public:
  DeviceGuard(int index, const char* backend);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

// Each device pointer of the call (operands, workspace, sequence arrays, slopes, sinks, the KV cache's index
// tensors and new rows) must be memory of the tensors' device (managed memory is accepted); appends one reason
// for the first that is not.
void check_device_pointers(const detail::AttnParams& p, detail::Reasons& why);

// The backward's scratch memory for one call, `bytes` large and 256-byte aligned: p.workspace (checked to be
// large enough), else p.workspace_alloc's, else the per-device pool's (stream-ordered, returned by the
// destructor on the same stream). Throws a typed error naming the argument when the caller's is unusable.
class Workspace {
 public:
  Workspace(const detail::AttnParams& p, std::size_t bytes, cudaStream_t stream, const char* backend);
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  char* data() const { return data_; }
  // Returns pool memory now and reports a failure (the destructor only tries).
  void release();

 private:
  char* data_ = nullptr;
  bool owned_ = false;
  cudaStream_t stream_ = nullptr;
  const char* backend_ = nullptr;
};

}  // namespace flashtile::cuda
