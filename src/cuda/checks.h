// What the CUDA backends (cuda-sm80, cuda-sm90) share on the host: the can_run checks (the device, the device
// pointers, dtype, head dims, scale, sizes, the variants no CUDA kernel runs yet, 16-byte alignment of the 16-bit
// operands; each backend adds its own: compute capability, its buckets, shared memory) and the kernels' params.
#pragma once

#include "core/backend.h"
#include "common/params.h"
#include "runtime/runtime.h"

namespace flashtile::cuda {

// Appends a reason per failed check. Returns the call's device, or null when there is none to run on (the
// tensors are not on a CUDA device, or it does not exist) or the backend refuses the kind of call outright (a
// KV-cache call off cuda-sm80), after which nothing else was checked.
const Gpu* check_common(const detail::AttnParams& p, const char* backend, detail::Reasons& why);

// A KV-cache call of up to 16 packed rows (G · Sq): cuda-sm80's 16-row mma.sync decode kernel runs it on Hopper
// too, since a wgmma tile is 64 rows (4x to 64x the products for the same K and V bytes); cuda-sm90 hands it over.
bool kvcache_runs_on_sm80(const detail::AttnParams& p);

// The report's note on Options::sm_margin for a kernel launched with a CTA per tile (every kernel but cuda-sm90's
// persistent forward and the split-KV plan): empty without a margin.
inline const char* sm_margin_note(const detail::AttnParams& p) {
  return p.sm_margin > 0 ? " sm_margin: no effect here (a CTA per tile, which the hardware places on the free SMs)"
                         : "";
}

// The backward's workspace (common/params.h, BwdParams): dq_accum [slots, bucket] fp32, dsum and lse_log2
// [slots], sink_terms [slots] with sinks, and with deterministic one counter per block of slots; each part
// 256-byte aligned. Slots: batch mode [B, Hq, Sq_pad]; varlen [Hq, (total_q + block_m * B) rounded down to
// block_m], each sequence at its block-aligned start (ws_row0). Both CUDA backends use it with their block_m.
struct BwdWorkspacePlan {
  bool large_smem = false;  // cuda-sm80's choice of tile (set by it)
  int seqlen_q_pad = 0, block_m = 0;
  std::int64_t ws_batch = 0, ws_head = 0, slots = 0;
  std::size_t bytes_dq = 0, bytes_row = 0, bytes = 0;
};
BwdWorkspacePlan plan_bwd_workspace(const detail::AttnParams& p, int block_m, int hdim_bucket);
// Points b's workspace fields into `base` (plan.bytes large) and sets its slot layout.
void place_bwd_workspace(const detail::AttnParams& p, const BwdWorkspacePlan& plan, int hdim_bucket, char* base,
                         BwdParams& b);

// The kernels' parameters from the call's: AttnParams whole, plus the folded constants. The one normalisation:
// causal is window right = 0 (with any left), which validation already writes; repeated here so that the masked
// kernels never depend on it.
void fill_params(const detail::AttnParams& p, FwdParams& f);

}  // namespace flashtile::cuda
