// The CUDA backend "cuda-sm90": the Hopper forward and backward (warp-specialised TMA producer, wgmma consumer
// warpgroups; src/cuda/sm90/) for GPUs of compute capability 9.0 (H100, H200). Registered before cuda-sm80,
// so auto picks it where it can run; what it refuses (strides TMA cannot take, an unbuilt kernel, a KV-cache call of
// up to 16 packed rows) runs on cuda-sm80 with the reason in the dispatch report. Its KV-cache calls run the wgmma
// decode kernel (src/cuda/decode/kernel_sm90.h) through the decode path's host side (decode/host.cpp).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <sstream>

#include "checks.h"
#include "common/scheduler.h"
#include "decode/host.h"
#include "core/backend.h"
#include "flashtile/errors.h"
#include "kernel_switch.h"
#include "runtime/runtime.h"
#include "sm90/tile_table.h"

namespace flashtile::detail {
namespace {

using cuda::Elem;
using cuda::Kind;
namespace sm90 = cuda::sm90;

constexpr const char* kName = "cuda-sm90";

// The kernels are sm_90a code: compute capability 9.0 exactly.
bool hopper(const cuda::Gpu& g) { return g.major == 9 && g.minor == 0; }

int bucket_of(const AttnParams& p) { return sm90::hdim_bucket(static_cast<int>(std::max(p.hdim, p.hdim_v))); }
// The backward kernel's head dim (tile_table.h: bucket 192 runs the 256 kernel).
int bwd_hdim_of(const AttnParams& p) { return sm90::bwd_hdim(bucket_of(p)); }

// TMA reads each operand as a (rows, d, heads, batch) tensor: every stride of an extent above 1 must be a
// positive multiple of 16 bytes (checks.h already asks for multiples of 8 elements).
void check_tma_strides(const AttnParams& p, Reasons& why) {
  struct Operand {
    const char* name;
    const Strides& s;
    std::int64_t heads;
  };
  // The forward stores O with TMA; the backward loads dO with it (a broadcast dO, e.g. the gradient of
  // (out * w).sum(), has zero strides and runs on cuda-sm80).
  const Operand ops[] = {{"q", p.q_stride, p.heads_q},
                         {"k", p.k_stride, p.heads_kv},
                         {"v", p.v_stride, p.heads_kv},
                         p.is_backward() ? Operand{"dout", p.dout_stride, p.heads_q}
                                         : Operand{"out", p.out_stride, p.heads_q}};
  const bool batched = !p.is_varlen() && p.batch > 1;
  for (const Operand& o : ops) {
    if (o.s.row <= 0 || (o.heads > 1 && o.s.head <= 0) || (batched && o.s.batch <= 0)) {
      std::ostringstream m;
      m << "TMA: " << o.name << " strides (batch, seq, head) = (" << o.s.batch << ", " << o.s.row << ", " << o.s.head
        << ") must be positive (the tensor-memory accelerator takes no zero or negative strides)";
      why.push_back(m.str());
    }
  }
}

class CudaSm90 final : public Backend {
 public:
  std::string name() const override { return kName; }
  // Not Hopper, or a KV-cache call for cuda-sm80's 16-row kernel: cuda-sm80 runs it, as planned.
  bool hands_over(const AttnParams& p) const override {
    if (p.device != Device::cuda || cuda::kvcache_runs_on_sm80(p)) return true;
    const cuda::Gpu* gpu = cuda::gpu(p.device_index);
    return gpu != nullptr && !hopper(*gpu);
  }

  Reasons can_run(const AttnParams& p) const override {
    Reasons why;
    const cuda::Gpu* gpu = cuda::check_common(p, kName, why);
    if (gpu == nullptr) return why;
    if (!hopper(*gpu))
      why.push_back("compute capability " + std::to_string(gpu->major) + "." + std::to_string(gpu->minor) + " of " +
                    gpu->name + " is not 9.0 (the kernels are sm_90a code: wgmma, setmaxnreg, TMA)");
    if (p.kvcache) {  // cp.async, not TMA: the decode path's own buckets and checks (checks.cpp took the short tiles)
      cuda::decode::can_run(p, cuda::decode::DecodeMma::wgmma, gpu->smem_optin, why);
      return why;
    }
    if (p.is_backward()) {
      const int b = bucket_of(p), d = bwd_hdim_of(p);
      if (!sm90::has_bwd(b))
        why.push_back("backward: head-dim bucket " + std::to_string(b) + " is not in " + kName + "'s backward");
      else if (p.dtype != DType::float32 && !cuda::sm90_bwd_kernel_built(cuda::elem_of(p.dtype), d))
        why.push_back(std::string("backward kernel not built in this build: ") +
                      cuda::elem_name(cuda::elem_of(p.dtype)) + " hdim " + std::to_string(d));
    }
    check_tma_strides(p, why);
    const std::int64_t dmax = std::max(p.hdim, p.hdim_v);
    const int bucket = dmax <= 256 ? bucket_of(p) : 0;
    if (bucket != 0 && p.dtype != DType::float32) {
      if (!cuda::sm90_kernel_built(cuda::elem_of(p.dtype), bucket)) {
        const char* built = cuda::sm90_built_kernels();
        why.push_back(std::string("kernel not built in this build: ") + cuda::elem_name(cuda::elem_of(p.dtype)) +
                      " hdim " + std::to_string(bucket) + " (cuda-sm90 built: " + (*built ? built : "none") +
                      "; FLASHTILE_CUDA_SM90 and FLASHTILE_CUDA_KERNELS choose)");
      }
      const Kind kind = cuda::kind_of(p);
      const int smem = sm90::fwd_smem_bytes(bucket, kind == Kind::plain, kind == Kind::hooks);
      if (!p.is_backward() && smem > gpu->smem_optin)
        why.push_back("shared memory: the hdim " + std::to_string(bucket) + " kernel needs " +
                      std::to_string(smem) + " bytes per block, " + gpu->name + " allows " +
                      std::to_string(gpu->smem_optin));
    }
    return why;
  }

  KernelInfo plan(const AttnParams& p) const override {
    const int bucket = bucket_of(p);
    const Elem e = cuda::elem_of(p.dtype);
    const Kind kind = cuda::kind_of(p);
    KernelInfo k;
    k.backend = kName;
    if (p.kvcache) {
      cuda::decode::describe(p, cuda::decode::DecodeMma::wgmma, k);
      return k;
    }
    k.kernel = std::string(p.is_backward() ? "sm90_bwd_" : "sm90_fwd_") + cuda::elem_name(e) + "_hdim" +
               std::to_string(p.is_backward() ? bwd_hdim_of(p) : bucket) + "_" + cuda::kind_name(kind);
    k.isa = "sm_90a wgmma + TMA";
    std::ostringstream d;
    if (!p.is_backward()) {
      const sm90::FwdTile t = sm90::fwd_tile(bucket);
      const bool plain = kind == Kind::plain;
      const int consumers = sm90::fwd_block_m(bucket, kind == Kind::hooks) / 64;
      k.block_q = consumers * 64;
      k.block_k = sm90::fwd_block_n(bucket, plain);
      k.threads = (consumers + 1) * 128;
      d << "hdim_bucket=" << bucket << " warpgroups=1 producer (TMA) + " << consumers
        << " consumers (wgmma, 64 rows each) registers=" << sm90::kProducerRegs << "/"
        << sm90::consumer_regs(consumers) << " stages=" << t.stages
        << " (K and V rings, mbarrier pipeline) scheduler=persistent, one CTA per SM";
      if (p.sm_margin > 0)
        d << " on " << cuda::call_sms(p) << " of " << cuda::sm_count(p.device_index) << " SMs (sm_margin "
          << p.sm_margin << ")";
      d << ", static snake waves, " << (kind == Kind::plain ? "blocks fastest" : "longest first");
      if (kind != Kind::plain) {  // the launcher's scheduler, built from the same sizes
        const auto s = cuda::StaticTileScheduler::make(static_cast<int>((p.seqlen_q + k.block_q - 1) / k.block_q),
                                                       static_cast<int>(p.heads_q), static_cast<int>(p.batch), true,
                                                       cuda::call_sms(p));
        if (s.section > 0) d << " in L2 sections of " << s.section << " (head, sequence) pairs";
      }
      d
        << " smem<=" << sm90::fwd_smem_bytes(bucket, plain, kind == Kind::hooks) << "B"
        << (sm90::fwd_stages_o(bucket, plain, kind == Kind::hooks)
                ? (p.is_varlen() ? " O staged in shared memory, 16-byte stores (varlen)"
                                 : " O staged in shared memory, TMA store")
                : " O stored from registers");
    } else {
      const sm90::BwdTile t = sm90::bwd_tile(bwd_hdim_of(p));
      k.block_q = t.block_m;
      k.block_k = t.block_n;
      k.threads = 384;
      d << "hdim_bucket=" << bucket;
      if (t.hdim != bucket) d << " (runs the hdim-" << t.hdim << " kernel, padded)";
      d << " warpgroups=1 producer (TMA: K, V once; Q, dO per step) + 2 consumers ";
      if (t.wide)
        d << "(dK^T, dV^T, dQ: half the head dim each; S, dP: half the keys each; P, dS through shared memory) "
          << "registers=" << sm90::kProducerRegs << "/240 stages=2 dq=fp32 vector reductions from registers";
      else
        d << "(64 keys each; S^T, dP^T, dV, dK, dQ on wgmma) registers=" << sm90::kProducerRegs
          << "/240 stages=2 dq=fp32 bulk reductions by a writer warp";
      d << (p.deterministic ? " in key-block order (deterministic)" : "") << cuda::sm_margin_note(p);
    }
    d << " variant=" << cuda::kind_name(kind) << " (tiles: "
      << (kind == Kind::plain ? "every key tile" : "the mask policy's") << ") dtype=" << dtype_name(p.dtype)
      << " accumulate=float32";
    k.detail = d.str();
    return k;
  }

  void run(const AttnParams& p) const override {
    cuda::DeviceGuard guard(p.device_index, kName);
    (void)cudaGetLastError();  // a stale error of an earlier, unrelated launch is not ours to report
    cudaStream_t stream = static_cast<cudaStream_t>(p.cuda_stream);
    if (p.kvcache) {
      cuda::decode::run(p, cuda::decode::DecodeMma::wgmma, kName);
      return;
    }
    if (!p.is_backward()) {
      cuda::FwdParams f;
      cuda::fill_params(p, f);
      cuda::check(cuda::launch_fwd_sm90(cuda::elem_of(p.dtype), bucket_of(p), cuda::kind_of(p), f, stream), kName,
                  "forward kernel launch");
      return;
    }
    const cuda::BwdWorkspacePlan plan = plan_bwd(p);
    cuda::BwdParams b;
    cuda::fill_params(p, b);
    cuda::Workspace ws(p, plan.bytes, stream, kName);
    cuda::place_bwd_workspace(p, plan, bwd_hdim_of(p), ws.data(), b);
    cuda::check(cuda::launch_bwd_sm90(cuda::elem_of(p.dtype), bwd_hdim_of(p), cuda::kind_of(p), b, stream), kName,
                "backward kernel launch");
    ws.release();
  }

  std::size_t workspace_bytes(const AttnParams& p) const override {
    if (p.kvcache) return cuda::decode::workspace_bytes_of(p);
    return p.is_backward() ? plan_bwd(p).bytes : 0;
  }

 private:
  static cuda::BwdWorkspacePlan plan_bwd(const AttnParams& p) {
    const int d = bwd_hdim_of(p);
    return cuda::plan_bwd_workspace(p, sm90::bwd_tile(d).block_m, d);
  }
};

}  // namespace

void register_cuda_sm90_backend(std::vector<std::unique_ptr<Backend>>& out) {
  out.push_back(std::make_unique<CudaSm90>());
}

}  // namespace flashtile::detail
