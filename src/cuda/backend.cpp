// The CUDA backend "cuda-sm80": FlashAttention forward and backward with mma.sync tensor-core tiles, for
// every GPU of compute capability >= 8.0 (A100, RTX 30/40, H100/H200). Registered first, so auto picks it
// for CUDA tensors. can_run() is a list of small named checks; plan() reports the tile-table entry.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <vector>

#include "core/backend.h"
#include "flashtile/errors.h"
#include "checks.h"
#include "decode/host.h"
#include "kernel_switch.h"
#include "runtime/runtime.h"
#include "sm80/tile_table.h"

namespace flashtile::detail {
namespace {

using cuda::Elem;
using cuda::Kind;
using BwdPlan = cuda::BwdWorkspacePlan;
namespace sm80 = cuda::sm80;

constexpr const char* kName = "cuda-sm80";

void check(cudaError_t e, const char* what) { cuda::check(e, kName, what); }

int bucket_of(const AttnParams& p) {
  return sm80::hdim_bucket(static_cast<int>(std::max(p.hdim, p.hdim_v)));
}
using cuda::elem_of;
using cuda::elem_name;

class CudaSm80 final : public Backend {
 public:
  std::string name() const override { return kName; }
  bool hands_over(const AttnParams& p) const override { return p.device != Device::cuda; }

  Reasons can_run(const AttnParams& p) const override {
    Reasons why;
    const cuda::Gpu* gpu = cuda::check_common(p, kName, why);
    if (gpu == nullptr) return why;
    if (gpu->major < 8)
      why.push_back("compute capability " + std::to_string(gpu->major) + "." + std::to_string(gpu->minor) + " of " +
                    gpu->name + " < 8.0 (mma.sync m16n8k16 bf16, cp.async)");
    if (p.kvcache) {  // the decode path (src/cuda/decode/) has its own buckets
      cuda::decode::can_run(p, cuda::decode::DecodeMma::mma_sync, gpu->smem_optin, why);
      return why;
    }
    const std::int64_t dmax = std::max(p.hdim, p.hdim_v);
    const int bucket = dmax <= 256 ? bucket_of(p) : 0;
    if (bucket != 0 && p.dtype != DType::float32) {
      if (!cuda::kernel_built(elem_of(p.dtype), bucket))
        why.push_back(std::string("kernel not built in this build: ") + elem_name(elem_of(p.dtype)) + " hdim " +
                      std::to_string(bucket) + " (FLASHTILE_CUDA_KERNELS built: " + cuda::built_kernels() + ")");
      const int smem = p.is_backward() ? sm80::bwd_smem_bytes(bucket) : sm80::fwd_smem_bytes(bucket);
      if (smem > gpu->smem_optin)
        why.push_back("shared memory: the hdim " + std::to_string(bucket) + " kernel needs " + std::to_string(smem) +
                      " bytes per block, " + gpu->name + " allows " + std::to_string(gpu->smem_optin));
    }
    return why;
  }

  KernelInfo plan(const AttnParams& p) const override {
    const int bucket = bucket_of(p);
    const Elem e = elem_of(p.dtype);
    const Kind kind = cuda::kind_of(p);
    KernelInfo k;
    k.backend = kName;
    k.kernel = std::string("sm80_") + (p.is_backward() ? "bwd_" : "fwd_") + elem_name(e) + "_hdim" +
               std::to_string(bucket) + "_" + cuda::kind_name(kind);
    const cuda::Gpu* gpu = cuda::gpu(p.device_index);
    const std::string arch = gpu != nullptr ? "sm_" + std::to_string(gpu->major) + std::to_string(gpu->minor) : "sm_80 path";
    k.isa = arch + " mma.sync.m16n8k16";
    if (p.kvcache) {
      cuda::decode::describe(p, cuda::decode::DecodeMma::mma_sync, k);
      return k;
    }
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
    d << cuda::sm_margin_note(p);
    // The variant: which key tiles are visited (mask policy) and what happens to the scores (hook).
    d << " variant=" << cuda::kind_name(kind) << " (tiles: "
      << (kind == Kind::plain ? "every key tile" : "key_tiles/query_tiles of the mask policy") << ")";
    d << " dtype=" << dtype_name(p.dtype) << " accumulate=float32";
    k.detail = d.str();
    return k;
  }

  void run(const AttnParams& p) const override {
    cuda::DeviceGuard guard(p.device_index, kName);
    (void)cudaGetLastError();  // a stale error of an earlier, unrelated launch is not ours to report
    const int bucket = bucket_of(p);
    const Elem e = elem_of(p.dtype);
    const Kind kind = cuda::kind_of(p);
    // The caller's stream (Options::cuda_stream); null is the legacy default stream, as PyTorch's default.
    cudaStream_t stream = static_cast<cudaStream_t>(p.cuda_stream);
    if (p.kvcache) {
      cuda::decode::run(p, cuda::decode::DecodeMma::mma_sync, kName);
      return;
    }
    if (!p.is_backward()) {
      cuda::FwdParams f;
      cuda::fill_params(p, f);
      check(cuda::launch_fwd(e, bucket, kind, f, stream), "forward kernel launch");
      return;
    }
    const BwdPlan plan = plan_bwd(p);
    cuda::BwdParams b;
    cuda::fill_params(p, b);
    b.large_smem = plan.large_smem;
    cuda::Workspace ws(p, plan.bytes, stream, kName);
    cuda::place_bwd_workspace(p, plan, bucket, ws.data(), b);
    check(cuda::launch_bwd(e, bucket, kind, b, stream), "backward kernel launch");
    ws.release();
  }

  std::size_t workspace_bytes(const AttnParams& p) const override {
    if (p.kvcache) return cuda::decode::workspace_bytes_of(p);
    return p.is_backward() ? plan_bwd(p).bytes : 0;
  }

 private:
  BwdPlan plan_bwd(const AttnParams& p) const {
    const int bucket = bucket_of(p);
    const bool large = large_bwd(p, bucket);
    BwdPlan w = cuda::plan_bwd_workspace(p, sm80::bwd_tile(bucket, large).block_m, bucket);
    w.large_smem = large;
    return w;
  }
  // The backward's large-shared-memory tile applies when the device can give a block that much.
  bool large_bwd(const AttnParams& p, int bucket) const {
    if (!sm80::has_large_bwd_tile(bucket)) return false;
    const cuda::Gpu* gpu = cuda::gpu(p.device_index);
    return gpu != nullptr && gpu->smem_optin >= sm80::bwd_smem_bytes(bucket, true);
  }
};

}  // namespace

void register_cuda_sm90_backend(std::vector<std::unique_ptr<Backend>>& out);  // backend_sm90.cpp

// cuda-sm90 first: auto takes the first backend that can run a call.
void register_cuda_backends(std::vector<std::unique_ptr<Backend>>& out) {
  register_cuda_sm90_backend(out);
  out.push_back(std::make_unique<CudaSm80>());
}

}  // namespace flashtile::detail
