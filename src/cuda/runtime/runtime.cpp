#include "runtime/runtime.h"

#include <array>
#include <cstdint>
#include <mutex>
#include <sstream>

#include "flashtile/errors.h"

namespace flashtile::cuda {

void check(cudaError_t e, const char* backend, const char* what) {
  if (e == cudaSuccess) return;
  std::ostringstream s;
  s << backend << ": " << what << " failed: " << cudaGetErrorName(e) << ": " << cudaGetErrorString(e);
  throw BackendError(s.str());
}

const Gpus& gpus() {
  static const Gpus g = [] {
    Gpus r;
    int n = 0;
    r.error = cudaGetDeviceCount(&n);
    if (r.error != cudaSuccess) {
      (void)cudaGetLastError();
      return r;
    }
    for (int i = 0; i < n; ++i) {
      cudaDeviceProp prop{};
      if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
        (void)cudaGetLastError();
        continue;
      }
      r.list.push_back({prop.major, prop.minor, static_cast<int>(prop.sharedMemPerBlockOptin),
                        prop.multiProcessorCount, prop.name});
    }
    return r;
  }();
  return g;
}

const Gpu* gpu(int index) {
  const Gpus& g = gpus();
  if (index < 0 || index >= static_cast<int>(g.list.size())) return nullptr;
  return &g.list[static_cast<std::size_t>(index)];
}

int sm_count(int device_index) {
  const Gpu* g = gpu(device_index);
  return g != nullptr && g->sms > 0 ? g->sms : 132;
}

int call_sms(const detail::AttnParams& p) {
  const int sms = sm_count(p.device_index) - p.sm_margin;
  return sms > 1 ? sms : 1;
}

DeviceGuard::DeviceGuard(int index, const char* backend) {
  check(cudaGetDevice(&previous_), backend, "cudaGetDevice");
  switched_ = previous_ != index;
  if (switched_) check(cudaSetDevice(index), backend, "cudaSetDevice");
}
DeviceGuard::~DeviceGuard() {
  if (switched_) (void)cudaSetDevice(previous_);
}

namespace {

// The backward's workspace comes from one stream-ordered memory pool per device that keeps its memory between
// calls. The device's default pool (plain cudaMallocAsync) returns freed memory to the driver at every
// synchronisation (release threshold 0), so every call mapped its dQ accumulator afresh: on the H200 at
// B=32 H=16 S=512 D=128 (134 MB) a call took 985 us with it and 823 us with this pool, whose kernels are the
// same (bench/results/h200.md, breakdown). Like PyTorch's caching allocator, the pool keeps the largest
// workspace it has served until the process ends.
cudaMemPool_t workspace_pool(int device, const char* backend) {
  static std::mutex mutex;
  static std::vector<cudaMemPool_t> pools;
  const std::lock_guard<std::mutex> lock(mutex);
  if (pools.size() <= static_cast<std::size_t>(device)) pools.resize(static_cast<std::size_t>(device) + 1, nullptr);
  cudaMemPool_t& pool = pools[static_cast<std::size_t>(device)];
  if (pool == nullptr) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    check(cudaMemPoolCreate(&pool, &props), backend, "cudaMemPoolCreate (backward workspace pool)");
    std::uint64_t keep = UINT64_MAX;
    check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), backend,
          "cudaMemPoolSetAttribute (backward workspace pool)");
  }
  return pool;
}

struct Pointer {
  const char* name;
  const void* ptr;
};

// The call's device pointers, in a fixed array: can_run() walks them on every call, so no heap allocation.
struct Pointers {
  std::array<Pointer, 16> list{};
  std::size_t count = 0;
  void add(const char* name, const void* ptr) {
    if (ptr != nullptr) list[count++] = {name, ptr};
  }
};

Pointers pointers(const detail::AttnParams& p) {
  Pointers v;
  v.add("q", p.q);
  v.add("k", p.k);
  v.add("v", p.v);
  v.add("out", p.out);
  v.add("lse", p.lse);
  v.add("cu_seqlens_q", p.cu_seqlens_q);
  v.add("cu_seqlens_k", p.cu_seqlens_k);
  v.add("seqused_k", p.seqused_k);
  v.add("alibi_slopes", p.alibi_slopes);
  v.add("sinks", p.sinks);
  if (p.is_backward()) {
    v.add("dout", p.dout);
    v.add("dq", p.dq);
    v.add("dk", p.dk);
    v.add("dv", p.dv);
    v.add("dsinks", p.dsinks);
    v.add("workspace", p.workspace);
  }
  if (p.kvcache) {
    v.add("cache_seqlens", p.cache_seqlens);
    v.add("block_table", p.page_table);
    v.add("cache_batch_idx", p.cache_batch_idx);
    v.add("k_new", p.k_new);
    v.add("v_new", p.v_new);
    v.add("workspace", p.workspace);
  }
  return v;
}

}  // namespace

void check_device_pointers(const detail::AttnParams& p, detail::Reasons& why) {
  const Pointers v = pointers(p);
  for (std::size_t i = 0; i < v.count; ++i) {
    const Pointer& o = v.list[i];
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, o.ptr) != cudaSuccess) {
      (void)cudaGetLastError();
      why.push_back(std::string("device: ") + o.name + " is not CUDA memory (cudaPointerGetAttributes failed)");
      return;
    }
    if (a.type == cudaMemoryTypeManaged) continue;
    if (a.type != cudaMemoryTypeDevice) {
      why.push_back(std::string("device: ") + o.name + " points to host memory; tensors declared cuda:" +
                    std::to_string(p.device_index) + " must hold device pointers");
      return;
    }
    if (a.device != p.device_index) {
      why.push_back(std::string("device: ") + o.name + " is memory of cuda:" + std::to_string(a.device) +
                    ", tensors declared cuda:" + std::to_string(p.device_index));
      return;
    }
  }
}

Workspace::Workspace(const detail::AttnParams& p, std::size_t bytes, cudaStream_t stream, const char* backend)
    : stream_(stream), backend_(backend) {
  // The caller's workspace (Options::workspace: nothing is allocated, so the call can be captured in a CUDA
  // graph with memory the caller owns), else the caller's allocator, else the per-device pool.
  void* ws = p.workspace;
  if (ws != nullptr && p.workspace_bytes < bytes)
    throw InvalidArgument("workspace: " + std::to_string(p.workspace_bytes) + " bytes given, " + backend + " needs " +
                          std::to_string(bytes) + " for this call (" +
                          (p.kvcache ? "forward_kvcache_workspace_bytes" : "backward_workspace_bytes") + ")");
  if (ws == nullptr && p.workspace_alloc != nullptr) {
    ws = p.workspace_alloc(bytes, p.workspace_alloc_context);
    if (ws == nullptr || reinterpret_cast<std::uintptr_t>(ws) % 256 != 0)
      throw InvalidArgument("workspace_alloc: returned " + std::string(ws ? "memory not 256-byte aligned" : "null") +
                            " for " + std::to_string(bytes) + " bytes");
  }
  if (ws == nullptr) {
    check(cudaMallocFromPoolAsync(&ws, bytes, workspace_pool(p.device_index, backend), stream), backend,
          "cudaMallocFromPoolAsync (backward workspace)");
    owned_ = true;
  }
  data_ = static_cast<char*>(ws);
}

void Workspace::release() {
  if (!owned_) return;
  owned_ = false;
  check(cudaFreeAsync(data_, stream_), backend_, "cudaFreeAsync (backward workspace)");
}

Workspace::~Workspace() {
  if (owned_) (void)cudaFreeAsync(data_, stream_);
}

}  // namespace flashtile::cuda
