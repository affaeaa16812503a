// The kernel-side parameter blocks. The call's AttnParams (core/params.h) travels whole, as `a`: the kernels
// read its pointers, int64 strides, sequence arrays, window, score-hook and sink fields directly, and ask
// core/params.h's sequence(), core/mask.h's MaskPolicy and core/score.h's ScoreHook for the rules. Only what
// a CUDA launch adds (folded constants, the backward's workspace) lives here. No CuTe, so host .cpp files
// include it. Common to every CUDA architecture (the sm80 path today, sm90 next).
#pragma once

#include <cstdint>

#include "core/params.h"

namespace flashtile::cuda {

struct FwdParams {
  detail::AttnParams a;
  float scale_log2 = 1.f;  // softmax_scale * log2(e): the plain kernels fold the scale into the exponent
  int group = 1;           // heads_q / heads_kv, folded on the host (kernels would keep the quotient in a register)
};

struct BwdParams : FwdParams {
  // Workspace (allocated by the host, cleared by the launcher's preprocess kernel). One float row slot per
  // (query head, query row), in blocks of block_m rows: sequence b's rows of head h start at
  // ws_row0(b, h) (below), and its last block is padded to block_m rows (the padding has lse_log2 = +inf, so
  // P = 0 there).
  float* dq_accum = nullptr;    // [slots, hdim_pad] fp32 dQ accumulated across key blocks
  float* dsum = nullptr;        // [slots] rowsum(dO * O)
  float* lse_log2 = nullptr;    // [slots] lse * log2(e); +inf for rows with lse = -inf and padding rows
  float* sink_terms = nullptr;  // [slots] exp(sink - lse) * dsum per row (with sinks only; summed per head)
  int* dq_semaphore = nullptr;  // deterministic mode: one counter per block of slots; null otherwise
  // Slot layout. Batch mode: [B, Hq, seqlen_q_pad], ws_batch = Hq * seqlen_q_pad, ws_head = seqlen_q_pad.
  // Varlen: [Hq, ws_rows] with sequence b at the block-aligned row (cu_seqlens_q[b] + block_m * b) rounded
  // down to block_m (FlashAttention's packed-with-padding layout: each sequence gets at least its rows
  // rounded up to block_m, and the total stays below total_q + block_m * B); ws_head = that total.
  std::int64_t ws_batch = 0, ws_head = 0;
  std::int64_t ws_slots = 0;  // slots in all (a multiple of block_m)
  int seqlen_q_pad = 0;  // max_seqlen_q rounded up to block_m
  int block_m = 0;       // the backward kernel's query block (slot blocks)
  int hdim_pad = 0;      // the head-dim bucket
  bool large_smem = false;  // use the tile table's large-shared-memory entry (sm80/tile_table.h)
};

// Slots per query head of the varlen layout (ws_head): every sequence b fits at ws_row0(b, h) with its rows
// rounded up to block_m (tests/gpu/test_gpu_workspace.cpp checks it).
FT_HOST_DEVICE std::int64_t varlen_ws_rows(std::int64_t total_q, std::int64_t batch, std::int64_t block_m) {
  return (total_q + block_m * batch) / block_m * block_m;
}

// First workspace slot of sequence b, head h (a multiple of block_m).
FT_HOST_DEVICE std::int64_t ws_row0(const BwdParams& p, std::int64_t b, std::int64_t h) {
  if (p.a.cu_seqlens_q != nullptr)
    return (p.a.cu_seqlens_q[b] + p.block_m * b) / p.block_m * p.block_m + h * p.ws_head;
  return b * p.ws_batch + h * p.ws_head;
}

}  // namespace flashtile::cuda
