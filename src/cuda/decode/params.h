// The KV-cache decode path of cuda-sm80 and cuda-sm90 (issue 14): what the host hands its kernels, without CuTe so that
// backend.cpp includes it. The call's AttnParams travel whole inside FwdParams (common/params.h); sequence(),
// kv_row(), MaskPolicy and ScoreHook (core/) stay the rules the kernels ask.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/params.h"

namespace flashtile::cuda::decode {

// Packed query rows per CTA: 16 (one m16 MMA row block; the four warps split each key tile) while the G · Sq
// rows of a KV head fit, else 64 (the four warps split the rows, as the forward kernel's do), so that
// speculative decoding (Sq = 16, G = 4) still reads each K and V row once. Keys per pipeline stage: 64.
inline constexpr int kRowsPerTile = 16;
inline constexpr int kRowsPerTileTall = 64;
inline constexpr int kBlockN = 64;
constexpr int rows_per_tile(std::int64_t packed_rows) {
  return packed_rows > kRowsPerTile ? kRowsPerTileTall : kRowsPerTile;
}
inline constexpr int kThreads = 128;
// The products of the decode kernel: mma.sync (decode/kernel.h: every cuda-sm80 call, and cuda-sm90's of up to 16
// packed rows) or wgmma (decode/kernel_sm90.h: cuda-sm90's 64-row tiles).
enum class DecodeMma { mma_sync, wgmma };
// The wgmma kernel's CTA: the consumer warpgroup and a producer warp that fills the K/V ring.
inline constexpr int kWgmmaThreads = kThreads + 32;
// The tile height cuda-sm90's wgmma kernel needs: more than 16 packed rows (G · Sq) per KV head.
constexpr bool wgmma_tile(std::int64_t packed_rows) { return rows_per_tile(packed_rows) == kRowsPerTileTall; }
// Head-dim buckets with a decode kernel (scripts/generate_cuda_instances.py DECODE_HDIMS).
inline constexpr int kDecodeBuckets[] = {64, 128};
inline constexpr int kMaxSplits = 128;

// The decode bucket of head dim d = max(D, Dv): the smallest that holds it (columns past d are zero-filled), or 0.
constexpr int decode_bucket(std::int64_t d) {
  for (int b : kDecodeBuckets)
    if (d <= b) return b;
  return 0;
}
// Ring stages of K and V (decode/kernel.h and kernel_sm90.h Traits, which assert the shared-memory size against
// this). The 16-row kernel at hdim 128 keeps two, 64 KB per CTA (about what cuDNN's decode kernel can hold): the
// DRAM reads faster with fewer requests outstanding (H100, 2026-12-07, bench/results/h200-decode-ab.md: two stages
// 0.6-1.3 % faster than three at batch 8 and 16, six 0.5-1.5 % slower, and 15 % slower with one split).
constexpr int decode_stages(int bucket, int rows) { return bucket <= 64 ? 4 : rows == kRowsPerTile ? 2 : 3; }
constexpr int decode_smem_bytes(int bucket, int rows) {
  return (rows * bucket + 2 * decode_stages(bucket, rows) * kBlockN * bucket) * 2;
}

// The device-side index check: one (sequence, block-table column) pair per entry (one per sequence when
// contiguous). Up to kOneCtaMaxChecks entries one CTA checks them in one launch; beyond, a memset and a grid-wide
// kernel do (decode/aux.cu).
inline constexpr std::int64_t kOneCtaMaxChecks = 16 * 1024;
FT_HOST_DEVICE std::int64_t check_count(const detail::AttnParams& a) {
  return a.batch * (a.page_table != nullptr ? a.max_pages : 1);
}
FT_HOST_DEVICE bool check_in_one_cta(const detail::AttnParams& a) { return check_count(a) <= kOneCtaMaxChecks; }

// The device-side index check's verdict, in the workspace's first bytes. It starts at first_bad = ~0, longest = -1
// (prepare_kernel's own reset, or a memset of 0xff before the grid-wide check) and the check lowers first_bad
// (atomicMin) to the first bad index in the CPU validation's order (sequence b, then its cache_seqlens before its
// block-table entries t) and raises longest (atomicMax) to the longest L_b. Good: first_bad = ~0 and longest <= seqlen_k (the max_seqlen_k bound).
enum Code : unsigned {
  kSeqlenNegative = 1,  // cache_seqlens[b] < 0
  kSeqlenTooLong = 2,   // cache_seqlens[b] + Snew > the cache's rows
  kPageOutOfRange = 3,  // block_table[b][t] outside [0, num_pages)
  kSlotOutOfRange = 4,  // cache_batch_idx[b] outside [0, slots)
};
struct Status {
  unsigned long long first_bad;  // b << 35 | t << 3 | code
  int longest;
  unsigned ticket;  // the host's copy (Readback): the call's number, written last, once the verdict is there
};
FT_HOST_DEVICE unsigned long long bad_key(std::int64_t b, std::int64_t t, unsigned code) {
  return static_cast<unsigned long long>(b) << 35 | static_cast<unsigned long long>(t) << 3 | code;
}
FT_HOST_DEVICE bool status_bad(const Status& s, std::int64_t bound) {
  return s.first_bad != ~0ull || s.longest > bound;
}

struct DecodeParams : FwdParams {
  Status* status = nullptr;   // workspace: the check kernel's verdict; the decode kernel does nothing when bad
  int* split_counts = nullptr;  // workspace, splits > 1: [B, Hkv, row_tiles] splits done, zeroed by the check
  float* o_part = nullptr;    // workspace, splits > 1: [splits, B, Hq, Sq, Dv] fp32, normalised per split
  float* lse_part = nullptr;  // workspace, splits > 1: [splits, B, Hq, Sq] fp32 (natural log)
  int splits = 1;
  int rows_per_tile = kRowsPerTile;  // rows_per_tile(G · Sq)
  int row_tiles = 1;          // ceil(G · Sq / rows_per_tile) per KV head
  std::int64_t num_slots = 0; // pages (paged) or cache slots (contiguous): AttnParams::cache_slots
  bool nan_on_bad = false;    // capturing or async_index_check: a bad status leaves NaN in out / lse (no read-back)
  // Eager calls: the verdict is published to pinned host memory (mapped) with this call's ticket, for the host to
  // wait on without a stream operation between the check and the decode; null otherwise.
  Status* host_status = nullptr;
  unsigned ticket = 0;
  bool decode_publishes = false;  // the grid-wide check: the decode kernel's first CTA publishes its verdict
  bool dependent_launch = false;  // compute capability >= 9.0: the decode launched programmatically after the check
};

// The (sequence, KV head, row tile) groups whose splits merge into one tile of rows: one split count each (the
// host's count for the workspace; the kernels index the counts with DecodeParams' row_tiles, the same value).
inline std::int64_t split_groups(const detail::AttnParams& p) {
  const std::int64_t rows = p.group() * p.seqlen_q, tile = rows_per_tile(rows), tiles = (rows + tile - 1) / tile;
  return p.batch * p.heads_kv * (tiles > 1 ? tiles : 1);
}

// Workspace layout: Status (256 bytes), then, when splits > 1, split_counts, o_part and lse_part (each 256-byte
// aligned; workspace_parts gives their offsets).
struct WorkspaceParts {
  std::size_t counts = 0, o_part = 0, lse_part = 0, bytes = 256;
};
inline WorkspaceParts workspace_parts(const detail::AttnParams& p, int splits) {
  auto round = [](std::size_t x) { return (x + 255) / 256 * 256; };
  WorkspaceParts w;
  if (splits > 1) {
    const auto rows = static_cast<std::size_t>(splits) * static_cast<std::size_t>(p.batch * p.heads_q * p.seqlen_q);
    w.counts = w.bytes;
    w.o_part = w.counts + round(static_cast<std::size_t>(split_groups(p)) * 4);
    w.lse_part = w.o_part + round(rows * static_cast<std::size_t>(p.hdim_v) * 4);
    w.bytes = w.lse_part + round(rows * 4);
  }
  return w;
}
inline std::size_t workspace_bytes(const detail::AttnParams& p, int splits) { return workspace_parts(p, splits).bytes; }

}  // namespace flashtile::cuda::decode
