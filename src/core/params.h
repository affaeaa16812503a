// The one plain struct that crosses every internal boundary (validation -> dispatch -> kernels).
// Pointers, int64 element strides and shapes; no framework types. Filled by validate.cpp only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashtile/options.h"
#include "flashtile/types.h"

namespace flashtile::detail {

// Element strides of a [B, S, H, D] tensor (D stride is 1) or of lse [B, H, S] (S stride is 1).
struct Strides {
  std::int64_t batch = 0;
  std::int64_t row = 0;   // along the sequence
  std::int64_t head = 0;
};

struct AttnParams {
  // Forward operands.
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* lse = nullptr;
  Strides q_stride, k_stride, v_stride, out_stride, lse_stride;

  // Backward operands (null in a forward call). `out` and `lse` are inputs there.
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  Strides dout_stride, dq_stride, dk_stride, dv_stride;

  DType dtype = DType::float32;
  Device device = Device::cpu;
  int device_index = 0;

  std::int64_t batch = 0, seqlen_q = 0, seqlen_k = 0, heads_q = 0, heads_kv = 0, hdim = 0, hdim_v = 0;

  bool backward = false;  // set by validate_backward(); pointers of empty tensors may be null

  // CUDA stream (cudaStream_t) to launch on; null = the legacy default stream.
  void* cuda_stream = nullptr;
  // Caller-provided backward scratch (Options::workspace); null = the backend's own pool.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  void* (*workspace_alloc)(std::size_t, void*) = nullptr;  // Options::workspace_alloc
  void* workspace_alloc_context = nullptr;
  bool device_pointers_checked = false;

  float softmax_scale = 1.0f;
  bool causal = false;
  bool deterministic = false;
  int num_threads = 0;

  bool is_backward() const noexcept { return backward; }
  std::int64_t group() const noexcept { return heads_kv > 0 ? heads_q / heads_kv : 0; }
  // No output element exists. A backward without query rows or query heads (Sq = 0 or Hq = 0) still writes
  // dK = dV = 0 for every key of every KV head.
  bool empty() const noexcept {
    const bool no_rows = batch == 0 || heads_q == 0 || seqlen_q == 0;
    return no_rows && (!backward || batch == 0 || heads_kv == 0 || seqlen_k == 0);
  }

  // Visible keys of query row i are [key_begin(i), key_end(i)); empty when begin >= end. The CPU kernels and
  // the reference ask these two; the CUDA kernels have their own mask policy (cuda/common/mask.h), which a
  // sliding window has to change too until one policy serves both (issue 12).
  std::int64_t key_begin(std::int64_t /*i*/) const noexcept { return 0; }
  // Bottom-right aligned causal: query i sees keys j <= i + Sk - Sq.
  std::int64_t key_end(std::int64_t i) const noexcept {
    if (!causal) return seqlen_k;
    const std::int64_t e = i + seqlen_k - seqlen_q + 1;
    return e < 0 ? 0 : (e > seqlen_k ? seqlen_k : e);
  }
};

}  // namespace flashtile::detail
