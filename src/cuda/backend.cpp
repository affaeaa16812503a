// The CUDA backend "cuda-sm80": FlashAttention forward and backward with mma.sync tensor-core tiles, for
// every GPU of compute capability >= 8.0 (A100, RTX 30/40, H100/H200). Registered first, so auto picks it
// for CUDA tensors. can_run() is a list of small named checks; plan() reports the tile-table entry.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <sstream>
#include <vector>

#include "core/backend.h"
#include "flashtile/errors.h"
#include "kernel_switch.h"
#include "sm80/tile_table.h"

namespace flashtile::detail {
namespace {

using cuda::Elem;
namespace sm80 = cuda::sm80;

constexpr const char* kName = "cuda-sm80";

[[noreturn]] void fail(const char* what, cudaError_t e) {
  std::ostringstream s;
  s << kName << ": " << what << " failed: " << cudaGetErrorName(e) << ": " << cudaGetErrorString(e);
  throw BackendError(s.str());
}
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(what, e);
}

struct Gpu {
  int major = 0, minor = 0;
  int smem_optin = 0;  // bytes of shared memory a block may opt into
  std::string name;
};

struct Gpus {
  cudaError_t error = cudaSuccess;
  std::vector<Gpu> list;
};

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
      r.list.push_back({prop.major, prop.minor, static_cast<int>(prop.sharedMemPerBlockOptin), prop.name});
    }
    return r;
  }();
  return g;
}

// The backward's workspace comes from one stream-ordered memory pool per device that keeps its memory between
// calls. The device's default pool (plain cudaMallocAsync) returns freed memory to the driver at every
// synchronisation (release threshold 0), so every call mapped its dQ accumulator afresh: on the H200 at
// B=32 H=16 S=512 D=128 (134 MB) a call took 985 us with it and 823 us with this pool, whose kernels are the
// same (bench/results/h200.md, breakdown). Like PyTorch's caching allocator, the pool keeps the largest
// workspace it has served until the process ends.
cudaMemPool_t workspace_pool(int device) {
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
    check(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate (backward workspace pool)");
    std::uint64_t keep = UINT64_MAX;
    check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep),
          "cudaMemPoolSetAttribute (backward workspace pool)");
  }
  return pool;
}

// Sets the current device for the scope of a call and restores the caller's.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    switched_ = previous_ != index;
    if (switched_) check(cudaSetDevice(index), "cudaSetDevice");
  }
  ~DeviceGuard() {
    if (switched_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

int bucket_of(const AttnParams& p) {
  return sm80::hdim_bucket(static_cast<int>(std::max(p.hdim, p.hdim_v)));
}
Elem elem_of(DType t) { return t == DType::float16 ? Elem::fp16 : Elem::bf16; }
const char* elem_name(Elem e) { return e == Elem::fp16 ? "fp16" : "bf16"; }

struct Operand {
  const char* name;
  const void* ptr;
  const Strides* stride;  // null for lse (read/written one float at a time)
};

// The call's device pointers, in a fixed array: can_run() walks them on every call, so no heap allocation.
struct Operands {
  std::array<Operand, 10> list{};
  std::size_t count = 0;
  const Operand* begin() const { return list.data(); }
  const Operand* end() const { return list.data() + count; }
};

Operands operands(const AttnParams& p) {
  Operands v;
  auto add = [&v](const char* name, const void* ptr, const Strides* stride) { v.list[v.count++] = {name, ptr, stride}; };
  add("q", p.q, &p.q_stride);
  add("k", p.k, &p.k_stride);
  add("v", p.v, &p.v_stride);
  add("out", p.out, &p.out_stride);
  add("lse", p.lse, nullptr);
  if (p.is_backward()) {
    add("dout", p.dout, &p.dout_stride);
    add("dq", p.dq, &p.dq_stride);
    add("dk", p.dk, &p.dk_stride);
    add("dv", p.dv, &p.dv_stride);
    add("workspace", p.workspace, nullptr);
  }
  return v;
}

// Each pointer must be device memory of the tensors' device (managed memory is accepted).
void check_pointers(const AttnParams& p, Reasons& why) {
  for (const Operand& o : operands(p)) {
    if (o.ptr == nullptr) continue;
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

void check_alignment(const AttnParams& p, Reasons& why) {
  for (const Operand& o : operands(p)) {
    if (o.stride == nullptr || o.ptr == nullptr) continue;
    if (reinterpret_cast<std::uintptr_t>(o.ptr) % 16 != 0)
      why.push_back(std::string("alignment: ") + o.name + " is not 16-byte aligned (cp.async and 16-byte stores)");
    const Strides& s = *o.stride;
    if (s.batch % 8 != 0 || s.row % 8 != 0 || s.head % 8 != 0) {
      std::ostringstream m;
      m << "strides: " << o.name << " strides (batch, seq, head) = (" << s.batch << ", " << s.row << ", " << s.head
        << ") must be multiples of 8 elements (16-byte rows)";
      why.push_back(m.str());
    }
  }
}

class CudaSm80 final : public Backend {
 public:
  std::string name() const override { return kName; }

  Reasons can_run(const AttnParams& p) const override {
    Reasons why;
    if (p.device != Device::cuda) {
      why.push_back(std::string("device: tensors are on ") + std::string(device_name(p.device)) + ":" +
                    std::to_string(p.device_index) + "; " + kName + " runs on CUDA devices");
      return why;
    }
    const Gpus& g = gpus();
    if (g.error != cudaSuccess || g.list.empty()) {
      why.push_back(std::string("no CUDA device: ") +
                    (g.error != cudaSuccess ? cudaGetErrorString(g.error) : "cudaGetDeviceCount returned 0"));
      return why;
    }
    if (p.device_index < 0 || p.device_index >= static_cast<int>(g.list.size())) {
      why.push_back("device: cuda:" + std::to_string(p.device_index) + " does not exist (" +
                    std::to_string(g.list.size()) + " devices)");
      return why;
    }
    if (!p.device_pointers_checked) check_pointers(p, why);
    const Gpu& gpu = g.list[static_cast<std::size_t>(p.device_index)];
    if (gpu.major < 8)
      why.push_back("compute capability " + std::to_string(gpu.major) + "." + std::to_string(gpu.minor) + " of " +
                    gpu.name + " < 8.0 (mma.sync m16n8k16 bf16, cp.async)");
    if (p.dtype == DType::float32)
      why.push_back("dtype float32 is not supported (float16 and bfloat16 only; cpu-flash runs float32)");
    const std::int64_t dmax = std::max(p.hdim, p.hdim_v);
    if (p.hdim % 8 != 0 || p.hdim_v % 8 != 0)
      why.push_back("head dim D = " + std::to_string(p.hdim) + ", Dv = " + std::to_string(p.hdim_v) +
                    ": both must be multiples of 8 (16-byte rows)");
    if (dmax > 256) why.push_back("head dim " + std::to_string(dmax) + " > 256 (largest bucket)");
    if (!(p.softmax_scale > 0.f))
      why.push_back("softmax_scale = " + std::to_string(p.softmax_scale) +
                    " <= 0 is not supported (the online softmax folds the scale into the running max)");
    if (p.is_backward() && p.heads_q == 0 && p.heads_kv > 0)
      why.push_back("backward with Hq = 0 query heads and Hkv = " + std::to_string(p.heads_kv) +
                    " (dK = dV = 0): not supported by the CUDA kernels");
    if (p.seqlen_q > INT_MAX / 2 || p.seqlen_k > INT_MAX / 2 || p.batch > 65535 || p.heads_q > 65535)
      why.push_back("sizes: seqlen must be < 2^30 and batch, heads <= 65535 (grid limits)");
    check_alignment(p, why);
    const int bucket = dmax <= 256 ? bucket_of(p) : 0;
    if (bucket != 0 && p.dtype != DType::float32) {
      if (!cuda::kernel_built(elem_of(p.dtype), bucket))
        why.push_back(std::string("kernel not built in this build: ") + elem_name(elem_of(p.dtype)) + " hdim " +
                      std::to_string(bucket) + " (FLASHTILE_CUDA_KERNELS built: " + cuda::built_kernels() + ")");
      const int smem = p.is_backward() ? sm80::bwd_smem_bytes(bucket) : sm80::fwd_smem_bytes(bucket);
      if (smem > gpu.smem_optin)
        why.push_back("shared memory: the hdim " + std::to_string(bucket) + " kernel needs " + std::to_string(smem) +
                      " bytes per block, " + gpu.name + " allows " + std::to_string(gpu.smem_optin));
    }
    return why;
  }

  KernelInfo plan(const AttnParams& p) const override {
    const int bucket = bucket_of(p);
    const Elem e = elem_of(p.dtype);
    KernelInfo k;
    k.backend = kName;
    k.kernel = std::string("sm80_") + (p.is_backward() ? "bwd_" : "fwd_") + elem_name(e) + "_hdim" +
               std::to_string(bucket) + (p.causal ? "_causal" : "_nomask");
    const Gpus& g = gpus();
    std::string arch = "sm_80 path";
    if (p.device_index >= 0 && p.device_index < static_cast<int>(g.list.size())) {
      const Gpu& gpu = g.list[static_cast<std::size_t>(p.device_index)];
      arch = "sm_" + std::to_string(gpu.major) + std::to_string(gpu.minor);
    }
    k.isa = arch + " mma.sync.m16n8k16";
    std::ostringstream d;
    if (!p.is_backward()) {
      const sm80::FwdTile t = sm80::fwd_tile(bucket);
      k.block_q = t.block_m;
      k.block_k = t.block_n;
      k.threads = t.warps * 32;
      d << "hdim_bucket=" << bucket << " warps=" << t.warps << " (split along query rows)"
        << " stages=2 (K and V buffers, cp.async) smem=" << sm80::fwd_smem_bytes(bucket) << "B";
    } else {
      const bool large = large_bwd(p, bucket);
      const sm80::BwdTile t = sm80::bwd_tile(bucket, large);
      k.block_q = t.block_m;
      k.block_k = t.block_n;
      k.threads = t.warps * 32;
      d << "hdim_bucket=" << bucket << " warps=" << t.warps << " (S/dP " << t.atom_m_sdp << "x"
        << t.warps / t.atom_m_sdp << ", dK/dV " << t.atom_n_dkv << "x" << t.warps / t.atom_n_dkv << ", dQ "
        << t.atom_m_dq << "x" << t.warps / t.atom_m_dq << ") q_stages=" << t.stages_q
        << " smem=" << sm80::bwd_smem_bytes(bucket, large) << "B dq=fp32 reductions"
        << (p.deterministic ? " (deterministic: ordered by key block)" : "");
    }
    d << " dtype=" << dtype_name(p.dtype) << " accumulate=float32";
    k.detail = d.str();
    return k;
  }

  void run(const AttnParams& p) const override {
    DeviceGuard guard(p.device_index);
    (void)cudaGetLastError();  // a stale error of an earlier, unrelated launch is not ours to report
    const int bucket = bucket_of(p);
    const Elem e = elem_of(p.dtype);
    // The caller's stream (Options::cuda_stream); null is the legacy default stream, as PyTorch's default.
    cudaStream_t stream = static_cast<cudaStream_t>(p.cuda_stream);
    if (!p.is_backward()) {
      cuda::FwdParams f;
      fill(p, f);
      check(cuda::launch_fwd(e, bucket, p.causal, f, stream), "forward kernel launch");
      return;
    }
    const BwdPlan plan = plan_bwd(p);
    cuda::BwdParams b;
    fill(p, b);
    b.large_smem = plan.large_smem;
    b.dout = p.dout;
    b.dq = p.dq;
    b.dk = p.dk;
    b.dv = p.dv;
    b.dout_stride = bshd(p.dout_stride);
    b.dq_stride = bshd(p.dq_stride);
    b.dk_stride = bshd(p.dk_stride);
    b.dv_stride = bshd(p.dv_stride);
    b.seqlen_q_pad = plan.seqlen_q_pad;
    b.hdim_pad = bucket;
    b.deterministic = p.deterministic;
    // The caller's workspace (Options::workspace: nothing is allocated, so the call can be captured in a CUDA
    // graph with memory the caller owns), else the per-device pool.
    void* ws = p.workspace;
    if (ws != nullptr && p.workspace_bytes < plan.bytes)
      throw InvalidArgument("workspace: " + std::to_string(p.workspace_bytes) + " bytes given, " + kName +
                            "'s backward needs " + std::to_string(plan.bytes) + " (backward_workspace_bytes)");
    if (ws == nullptr && p.workspace_alloc != nullptr) {
      ws = p.workspace_alloc(plan.bytes, p.workspace_alloc_context);
      if (ws == nullptr || reinterpret_cast<std::uintptr_t>(ws) % 256 != 0)
        throw InvalidArgument("workspace_alloc: returned " + std::string(ws ? "memory not 256-byte aligned" : "null") +
                              " for " + std::to_string(plan.bytes) + " bytes");
    }
    const bool own = ws == nullptr;
    if (own)
      check(cudaMallocFromPoolAsync(&ws, plan.bytes, workspace_pool(p.device_index), stream),
            "cudaMallocFromPoolAsync (backward workspace)");
    char* base = static_cast<char*>(ws);
    b.dq_accum = reinterpret_cast<float*>(base);
    b.dsum = reinterpret_cast<float*>(base + plan.bytes_dq);
    b.lse_log2 = reinterpret_cast<float*>(base + plan.bytes_dq + plan.bytes_row);
    b.dq_semaphore = p.deterministic ? reinterpret_cast<int*>(base + plan.bytes_dq + 2 * plan.bytes_row) : nullptr;
    const cudaError_t err = cuda::launch_bwd(e, bucket, p.causal, b, stream);
    const cudaError_t free_err = own ? cudaFreeAsync(ws, stream) : cudaSuccess;
    check(err, "backward kernel launch");
    check(free_err, "cudaFreeAsync (backward workspace)");
  }

  std::size_t workspace_bytes(const AttnParams& p) const override {
    return p.is_backward() ? plan_bwd(p).bytes : 0;
  }

 private:
  // The backward's workspace: dq_accum [B, Hq, Sq_pad, bucket] fp32, dsum and lse_log2 [B, Hq, Sq_pad], and with
  // deterministic one counter per query block; each part 256-byte aligned.
  struct BwdPlan {
    bool large_smem = false;
    int seqlen_q_pad = 0;
    std::size_t bytes_dq = 0, bytes_row = 0, bytes = 0;
  };
  BwdPlan plan_bwd(const AttnParams& p) const {
    const int bucket = bucket_of(p);
    BwdPlan w;
    w.large_smem = large_bwd(p, bucket);
    const sm80::BwdTile t = sm80::bwd_tile(bucket, w.large_smem);
    w.seqlen_q_pad = static_cast<int>((p.seqlen_q + t.block_m - 1) / t.block_m * t.block_m);
    const std::size_t rows = static_cast<std::size_t>(p.batch * p.heads_q) * static_cast<std::size_t>(w.seqlen_q_pad);
    auto round = [](std::size_t x) { return (x + 255) / 256 * 256; };
    w.bytes_dq = round(rows * static_cast<std::size_t>(bucket) * 4);
    w.bytes_row = round(rows * 4);
    const std::size_t bytes_sem = p.deterministic ? round(rows / static_cast<std::size_t>(t.block_m) * 4) : 0;
    w.bytes = w.bytes_dq + 2 * w.bytes_row + bytes_sem;
    return w;
  }
  // The backward's large-shared-memory tile applies when the device can give a block that much.
  bool large_bwd(const AttnParams& p, int bucket) const {
    if (!sm80::has_large_bwd_tile(bucket)) return false;
    const Gpus& g = gpus();
    if (p.device_index < 0 || p.device_index >= static_cast<int>(g.list.size())) return false;
    return g.list[static_cast<std::size_t>(p.device_index)].smem_optin >= sm80::bwd_smem_bytes(bucket, true);
  }
  static cuda::BshdStrides bshd(const Strides& s) { return {s.batch, s.row, s.head}; }
  static void fill(const AttnParams& p, cuda::FwdParams& f) {
    f.q = p.q;
    f.k = p.k;
    f.v = p.v;
    f.out = p.out;
    f.lse = p.lse;
    f.q_stride = bshd(p.q_stride);
    f.k_stride = bshd(p.k_stride);
    f.v_stride = bshd(p.v_stride);
    f.out_stride = bshd(p.out_stride);
    f.lse_batch = p.lse_stride.batch;
    f.lse_head = p.lse_stride.head;
    f.lse_row = p.lse_stride.row;
    f.batch = static_cast<int>(p.batch);
    f.seqlen_q = static_cast<int>(p.seqlen_q);
    f.seqlen_k = static_cast<int>(p.seqlen_k);
    f.heads_q = static_cast<int>(p.heads_q);
    f.heads_kv = static_cast<int>(p.heads_kv);
    f.group = static_cast<int>(p.group());
    f.hdim = static_cast<int>(p.hdim);
    f.hdim_v = static_cast<int>(p.hdim_v);
    f.scale = p.softmax_scale;
    f.scale_log2 = p.softmax_scale * 1.4426950408889634f;
  }
};

}  // namespace

void register_cuda_backends(std::vector<std::unique_ptr<Backend>>& out) {
  out.push_back(std::make_unique<CudaSm80>());
}

}  // namespace flashtile::detail
