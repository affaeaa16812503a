// The can_run checks every CUDA backend makes (checks.h).
#include "checks.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <sstream>
#include <string_view>

#include "decode/params.h"
#include "flashtile/errors.h"

namespace flashtile::cuda {
namespace {

using detail::AttnParams;
using detail::Reasons;
using detail::Strides;

struct Operand {
  const char* name;
  const void* ptr;
  const Strides* stride;
};

// The 16-bit operands, read and written in 16-byte vectors, in a fixed array (can_run() walks them on every
// call, so no heap allocation).
struct Operands {
  std::array<Operand, 8> list{};
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
  if (p.is_backward()) {
    add("dout", p.dout, &p.dout_stride);
    add("dq", p.dq, &p.dq_stride);
    add("dk", p.dk, &p.dk_stride);
    add("dv", p.dv, &p.dv_stride);
  }
  if (p.kvcache) {  // the appended rows, copied in 16-byte vectors
    add("k_new", p.k_new, &p.k_new_stride);
    add("v_new", p.v_new, &p.v_new_stride);
  }
  return v;
}

void check_alignment(const AttnParams& p, Reasons& why) {
  for (const Operand& o : operands(p)) {
    if (o.ptr == nullptr) continue;
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

// The variants (issue 12) the kernels run, and what they refuse.
void check_variants(const AttnParams& p, Reasons& why) {
  if (p.is_backward() && p.sinks != nullptr && p.dsinks == nullptr)
    why.push_back("sinks: a backward with sinks needs dsinks (dL/dsinks)");
  if (p.is_varlen() && (p.total_q > INT_MAX || p.total_k > INT_MAX))
    why.push_back("varlen: total_q = " + std::to_string(p.total_q) + ", total_k = " + std::to_string(p.total_k) +
                  ": must be < 2^31 (int32 cu_seqlens)");
}

}  // namespace

bool kvcache_runs_on_sm80(const AttnParams& p) {
  return p.device == Device::cuda && p.kvcache && !decode::wgmma_tile(p.group() * p.seqlen_q);
}

const Gpu* check_common(const AttnParams& p, const char* backend, Reasons& why) {
  if (p.device != Device::cuda) {
    why.push_back(std::string("device: tensors are on ") + std::string(device_name(p.device)) + ":" +
                  std::to_string(p.device_index) + "; " + backend + " runs on CUDA devices");
    return nullptr;
  }
  const cuda::Gpus& g = cuda::gpus();
  if (g.error != cudaSuccess || g.list.empty()) {
    why.push_back(std::string("no CUDA device: ") +
                  (g.error != cudaSuccess ? cudaGetErrorString(g.error) : "cudaGetDeviceCount returned 0"));
    return nullptr;
  }
  const cuda::Gpu* gpu = cuda::gpu(p.device_index);
  if (gpu == nullptr) {
    why.push_back("device: cuda:" + std::to_string(p.device_index) + " does not exist (" +
                  std::to_string(g.list.size()) + " devices)");
    return nullptr;
  }
  // cuda-sm90's KV-cache kernel is the wgmma one of the 64-row tiles (decode/kernel_sm90.h); the calls of up to 16
  // packed rows it hands to cuda-sm80 (kvcache_runs_on_sm80). Refused here, before the pointer queries (a
  // cudaPointerGetAttributes per tensor), which cuda-sm80's check then makes: a decode call paid them twice.
  if (std::string_view(backend) == "cuda-sm90" && kvcache_runs_on_sm80(p)) {
    why.push_back("KV cache: G·Sq = " + std::to_string(p.group() * p.seqlen_q) +
                  " packed rows <= 16 run on cuda-sm80's 16-row mma.sync decode kernel (cuda-sm90's wgmma kernel "
                  "takes 64-row tiles: 4x to 64x the products for the same K and V bytes)");
    return nullptr;
  }
  if (p.sm_margin >= gpu->sms)
    why.push_back("sm_margin = " + std::to_string(p.sm_margin) + " leaves none of cuda:" +
                  std::to_string(p.device_index) + "'s " + std::to_string(gpu->sms) + " SMs");
  if (!p.device_pointers_checked) cuda::check_device_pointers(p, why);
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
  check_variants(p, why);
  check_alignment(p, why);
  return gpu;
}

BwdWorkspacePlan plan_bwd_workspace(const AttnParams& p, int block_m, int hdim_bucket) {
  BwdWorkspacePlan w;
  w.block_m = block_m;
  w.seqlen_q_pad = static_cast<int>((p.seqlen_q + block_m - 1) / block_m * block_m);
  if (p.is_varlen()) {
    w.ws_head = varlen_ws_rows(p.total_q, p.batch, block_m);
    w.ws_batch = 0;
    w.slots = w.ws_head * p.heads_q;
  } else {
    w.ws_head = w.seqlen_q_pad;
    w.ws_batch = w.ws_head * p.heads_q;
    w.slots = w.ws_batch * p.batch;
  }
  const auto slots = static_cast<std::size_t>(w.slots);
  auto round = [](std::size_t x) { return (x + 255) / 256 * 256; };
  w.bytes_dq = round(slots * static_cast<std::size_t>(hdim_bucket) * 4);
  w.bytes_row = round(slots * 4);
  const std::size_t rows = p.sinks != nullptr ? 3 : 2;
  const std::size_t bytes_sem = p.deterministic ? round(slots / static_cast<std::size_t>(block_m) * 4) : 0;
  w.bytes = w.bytes_dq + rows * w.bytes_row + bytes_sem;
  return w;
}

void place_bwd_workspace(const AttnParams& p, const BwdWorkspacePlan& plan, int hdim_bucket, char* base,
                         BwdParams& b) {
  b.seqlen_q_pad = plan.seqlen_q_pad;
  b.block_m = plan.block_m;
  b.hdim_pad = hdim_bucket;
  b.ws_batch = plan.ws_batch;
  b.ws_head = plan.ws_head;
  b.ws_slots = plan.slots;
  const std::size_t row_bytes = plan.bytes_row;
  b.dq_accum = reinterpret_cast<float*>(base);
  b.dsum = reinterpret_cast<float*>(base + plan.bytes_dq);
  b.lse_log2 = reinterpret_cast<float*>(base + plan.bytes_dq + row_bytes);
  std::size_t at = plan.bytes_dq + 2 * row_bytes;
  if (p.sinks != nullptr) {
    b.sink_terms = reinterpret_cast<float*>(base + at);
    at += row_bytes;
  }
  b.dq_semaphore = p.deterministic ? reinterpret_cast<int*>(base + at) : nullptr;
}

void fill_params(const AttnParams& p, FwdParams& f) {
  f.a = p;
  if (f.a.causal) f.a.window_right = 0;
  f.scale_log2 = p.softmax_scale * 1.4426950408889634f;
  f.group = static_cast<int>(p.group());
}

}  // namespace flashtile::cuda
