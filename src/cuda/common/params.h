// The kernel-side parameter block: plain pointers, int64 element strides and int shapes, filled on the
// host from core/params.h's AttnParams (src/cuda/backend.cpp). No CuTe here, so host .cpp files include it.
#pragma once

#include <cstdint>

namespace flashtile::cuda {

struct BshdStrides {  // [B, S, H, D] in elements; D is contiguous
  std::int64_t batch = 0, row = 0, head = 0;
};

struct FwdParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* lse = nullptr;
  BshdStrides q_stride, k_stride, v_stride, out_stride;
  std::int64_t lse_batch = 0, lse_head = 0, lse_row = 0;

  int batch = 0, seqlen_q = 0, seqlen_k = 0, heads_q = 0, heads_kv = 0, group = 1;
  int hdim = 0, hdim_v = 0;  // actual sizes; the kernel's bucket is >= both
  float scale = 1.f;         // softmax_scale
  float scale_log2 = 1.f;    // softmax_scale * log2(e)
};

struct BwdParams : FwdParams {
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  BshdStrides dout_stride, dq_stride, dk_stride, dv_stride;

  // Workspace, [B, Hq, seqlen_q_pad(, hdim_pad)] contiguous, allocated by the launcher.
  float* dq_accum = nullptr;   // fp32 dQ accumulated across key blocks
  float* dsum = nullptr;       // rowsum(dO * O)
  float* lse_log2 = nullptr;   // lse * log2(e); +inf for rows with no visible key and padding rows
  int* dq_semaphore = nullptr; // deterministic mode: one counter per (b, h, query block); null otherwise
  int seqlen_q_pad = 0;        // seqlen_q rounded up to the backward kernel's block_q
  int hdim_pad = 0;            // the head-dim bucket
  bool deterministic = false;
  bool large_smem = false;     // use the tile table's large-shared-memory entry (sm80/tile_table.h)
};

}  // namespace flashtile::cuda
