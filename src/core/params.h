// The one plain struct that crosses every internal boundary (validation -> dispatch -> kernels).
// Pointers, int64 element strides and shapes; no framework types. Filled by validate.cpp only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/host_device.h"
#include "flashtile/options.h"
#include "flashtile/types.h"

namespace flashtile::detail {

// The largest head dim D and Dv a call may have (validation refuses more; kernels may size buffers by it).
inline constexpr std::int64_t kMaxHeadDim = 256;

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

  // --- Variable-length batches (flash_attn_varlen_func). With cu_seqlens_q, q / out / dout / dq hold the
  // batch's sequences packed along the row dimension: sequence b owns rows [cu_seqlens_q[b], cu_seqlens_q[b+1])
  // and the batch strides are 0; likewise k / v / dk / dv with cu_seqlens_k; lse is [Hq, total_q]. The arrays
  // are int32 [batch + 1] in memory of the operands' device (kernels read them there). seqused_k [batch], when
  // given, is the number of keys of sequence b that are used (the rest of its rows are ignored). seqlen_q and
  // seqlen_k hold the maxima (max_seqlen_q / max_seqlen_k), which size grids and tiles. sequence() below is the
  // one place that turns these into a sequence's rows.
  const std::int32_t* cu_seqlens_q = nullptr;
  const std::int32_t* cu_seqlens_k = nullptr;
  const std::int32_t* seqused_k = nullptr;
  std::int64_t total_q = 0, total_k = 0;  // packed row counts (varlen), else batch * seqlen

  // --- Mask (core/mask.h is the one rule). Key j is visible to query i iff
  // i + Sk - Sq - window_left <= j <= i + Sk - Sq + window_right, -1 = unbounded on that side. Validation
  // writes causal as window_right = 0 (and keeps `causal` for reports).
  bool causal = false;
  std::int64_t window_left = -1, window_right = -1;
  // Tests only: shifts the policy's left window edge by this many keys, so that a test can prove the float64
  // oracle (which never reads the policy) catches a wrong mask. Always 0 outside that test.
  std::int64_t test_window_bias = 0;

  // --- Score hook (core/score.h is the one rule): s = softmax_scale · q·k; softcap c > 0: s = c·tanh(s / c);
  // ALiBi: s -= slope[b][h] · |i + Sk - Sq - j|.
  float softmax_scale = 1.0f;
  float softcap = 0.0f;                  // 0 = off
  const float* alibi_slopes = nullptr;   // [Hq] or [B, Hq] float32, operands' device; null = off
  std::int64_t alibi_batch_stride = 0;   // 0 for [Hq]
  // Attention sinks: one float32 logit per query head that takes probability mass and adds no value:
  // lse_i = log(exp(sink_h) + Σ_j exp(s_ij)). dsinks (backward output) receives dL/dsink_h.
  const float* sinks = nullptr;          // [Hq] float32, operands' device; null = off
  float* dsinks = nullptr;               // [Hq] float32 (backward, required with sinks)

  // --- KV cache (forward_kvcache, include/flashtile/kvcache.h). k / v are the caches: [B_cache, capacity, Hkv, D]
  // with k_stride.batch the slot stride, or paged [num_pages, page_size, Hkv, D] with k_stride.batch the page
  // stride and sequence b's key j in page page_table[b * page_table_batch_stride + j / page_size]. Sequence b
  // holds cache_seqlens[b] keys before the call; k_new / v_new [B, seqlen_new, Hkv, D] are written after them, so
  // it attends to cache_seqlens[b] + seqlen_new keys (sequence() applies this). seqlen_k is the bound on that
  // length (capacity, pages · page_size, or the caller's max_seqlen_k). kv_row() is the one place that turns
  // (sequence, key) into a cache row.
  bool kvcache = false;
  const std::int32_t* cache_seqlens = nullptr;   // [B]; null: every sequence holds seqlen_k keys
  const std::int32_t* cache_batch_idx = nullptr; // [B]; null: slot b
  const std::int32_t* page_table = nullptr;      // [B, max_pages]; null: contiguous
  std::int64_t page_table_batch_stride = 0;
  std::int64_t page_size = 0, max_pages = 0, capacity = 0;  // capacity: rows per slot (contiguous)
  std::int64_t cache_slots = 0;  // k_cache's first extent: pages (paged) or slots (contiguous), for index checks
  bool async_index_check = false;  // KVCache::async_index_check
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  Strides k_new_stride, v_new_stride;
  std::int64_t seqlen_new = 0;
  int num_splits = 0;                    // split-KV: 0 = the backend picks

  bool deterministic = false;
  int num_threads = 0;
  int sm_margin = 0;  // Options::sm_margin

  bool is_backward() const noexcept { return backward; }
  bool is_varlen() const noexcept { return cu_seqlens_q != nullptr; }
  bool has_window() const noexcept { return window_left >= 0 || window_right >= 0; }
  bool has_score_hook() const noexcept { return softcap > 0.0f || alibi_slopes != nullptr; }
  std::int64_t group() const noexcept { return heads_kv > 0 ? heads_q / heads_kv : 0; }
  // No output element exists. A backward without query rows or query heads (Sq = 0 or Hq = 0) still writes
  // dK = dV = 0 for every key of every KV head, and dsinks = 0 for every query head (also with B = 0).
  bool empty() const noexcept {
    const bool no_rows = batch == 0 || heads_q == 0 || seqlen_q == 0;
    if (backward && dsinks != nullptr && heads_q > 0) return false;
    return no_rows && (!backward || batch == 0 || heads_kv == 0 || seqlen_k == 0);
  }
};

// One sequence of the batch: its first row in the (packed) row dimension of q and of k, and its lengths. Rows
// of sequence b are at  base + b * stride.batch + (row0 + i) * stride.row  for every operand (varlen: batch
// strides are 0; lse: stride.row = 1, so row0 + i indexes [Hq, total_q] too).
struct SeqInfo {
  std::int64_t q_row0 = 0, k_row0 = 0;
  std::int64_t seqlen_q = 0, seqlen_k = 0;
};

FT_HOST_DEVICE SeqInfo sequence(const AttnParams& p, std::int64_t b) {
  SeqInfo s;
  s.seqlen_q = p.seqlen_q;
  s.seqlen_k = p.seqlen_k;
  if (p.cu_seqlens_q != nullptr) {
    s.q_row0 = p.cu_seqlens_q[b];
    s.seqlen_q = p.cu_seqlens_q[b + 1] - s.q_row0;
  }
  if (p.cu_seqlens_k != nullptr) {
    s.k_row0 = p.cu_seqlens_k[b];
    s.seqlen_k = p.cu_seqlens_k[b + 1] - s.k_row0;
  }
  if (p.seqused_k != nullptr) s.seqlen_k = p.seqused_k[b];
  if (p.cache_seqlens != nullptr) s.seqlen_k = p.cache_seqlens[b] + p.seqlen_new;
  return s;
}

// KV cache: where sequence b's key j lives (j < sequence(p, b).seqlen_k): the slot of k's and v's first extent
// (a page, or a cache entry) and the row in it. kv_place reads the index tensors (on the GPU a dependent global
// load, which the decode kernel issues a key tile ahead of the rows' copies); kv_offsets turns a place into element
// offsets in k and in v (head 0); kv_row is the two together.
struct KvPlace {
  std::int64_t slot = 0, row = 0;
};
struct KvRow {
  std::int64_t k = 0, v = 0;
};
// Key j of a paged sequence lies in the page of its block-table column j / page_size, at row j % page_size.
FT_HOST_DEVICE KvPlace paged_place(const AttnParams& p, std::int64_t page, std::int64_t j) {
  return {page, j % p.page_size};
}
FT_HOST_DEVICE KvPlace kv_place(const AttnParams& p, std::int64_t b, std::int64_t j) {
  if (p.page_table != nullptr) return paged_place(p, p.page_table[b * p.page_table_batch_stride + j / p.page_size], j);
  return {p.cache_batch_idx != nullptr ? p.cache_batch_idx[b] : b, j};
}
FT_HOST_DEVICE KvRow kv_offsets(const AttnParams& p, KvPlace at) {
  return {at.slot * p.k_stride.batch + at.row * p.k_stride.row, at.slot * p.v_stride.batch + at.row * p.v_stride.row};
}
FT_HOST_DEVICE KvRow kv_row(const AttnParams& p, std::int64_t b, std::int64_t j) {
  return kv_offsets(p, kv_place(p, b, j));
}

}  // namespace flashtile::detail
