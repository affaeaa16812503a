// Tile sizes of the sm90 (wgmma + TMA) path, one entry per head-dim bucket, with the reason for each. Host
// and device code read the same table: plan() reports it, the kernels are built from it.
//
// Budget: H100/H200 give a block up to 227 KB of shared memory; a consumer warpgroup (64 query rows) holds
// O (64 x hdim / 128 threads = hdim / 2 floats) and S (block_n / 2 floats) in its 240 registers per thread.
#pragma once

namespace flashtile::cuda::sm90 {

struct FwdTile {
  int hdim, block_m, block_n, stages;
  int block_n_plain;  // keys per tile of the kernel without mask or score hooks (0: block_n)
  const char* why;
};

inline constexpr FwdTile kFwdTiles[] = {
    {64, 192, 128, 2, 0, "3 consumer warpgroups of 160 regs (O 32 + S 64); Q 24 KB + K/V 2 x 2 x 16 KB"},
    {96, 128, 128, 2, 0, "O 48 + S 64 regs; 120 KB smem"},
    {128, 128, 128, 2, 160,
     "O 64 + S 64 regs; Q 32 KB + K/V 2 x 2 x 32 KB = 160 KB smem. Without mask 160 keys: S 80 regs, 192 KB + "
     "O's staging 34 KB = 226 KB; 1.01-1.05x the 128-key tile at 2k-32k, 0.98x at 1k (A/B in one H200 run); 176 "
     "keys (FlashAttention-3's) leave no room for the staging: 0.94-1.00x"},
    {192, 128, 112, 2, 0, "O 96 + S 56 regs; block_n 112 keeps smem at 132 KB"},
    {256, 128, 80, 2, 0, "O 128 + S 40 regs; block_n 80: Q 64 KB + K/V 2 x 2 x 40 KB = 224 KB smem"},
};

inline constexpr int kHdimBuckets[] = {64, 96, 128, 192, 256};

// The backward's tiles, one entry per kernel head dim. `wide`: bwd_wide_kernel.h (dK, dV transposed, the consumer
// warpgroups splitting the head dim), else bwd_kernel.h (the keys are the rows of every accumulator, 64 per
// consumer, each holding dK and dV over the whole head dim: 2 x 64 x hdim / 128 floats, 256 registers at 256).
struct BwdTile {
  int hdim, block_m, block_n;
  bool wide;
  int stages_do;  // the wide kernel's dO ring (bwd_kernel.h loads dO in Q's 2-stage ring)
  const char* why;
};

inline constexpr BwdTile kBwdTiles[] = {
    {64, 128, 128, false, 2,
     "128 query rows per step: dK, dV 2 x 32 regs + S^T, dP^T 2 x 64 + dQ 32 (ptxas: 32 B spilled); against 64 rows, "
     "backward 1.00-1.10x cuDNN instead of 0.94-1.05x (A/B in one run, 2k-16k)"},
    {96, 64, 128, false, 2, "dK, dV 2 x 48 regs + S^T, dP^T 2 x 32"},
    {128, 64, 128, false, 2, "dK, dV 2 x 64 regs + S^T, dP^T 2 x 32; 160 KB smem with dQ's staging"},
    {256, 64, 64, true, 2,
     "dK^T, dV^T 2 x 64 regs + dQ 64; K, V 2 x 32 KB + Q, dO 2 x 2 x 32 KB + P, dS 2 x 2 x 8 KB = 224 KB smem. 80 keys "
     "(FlashAttention-3's; dO in one stage, 216 KB): dK^T, dV^T 2 x 80 regs, ptxas serialised the wgmmas and spilled "
     "324 B, 0.65-0.87x cuDNN against 0.94-1.08x (A/B in one run)"},
};

// The backward kernel's head dim for a forward bucket: 192 runs the 256 kernel, padded (TMA reads zeros past
// the head dim, the stores stop at it): with two consumer warpgroups the head dim splits in 64-row wgmma blocks,
// and 192 has three.
constexpr int bwd_hdim(int bucket) { return bucket == 192 ? 256 : bucket; }

constexpr BwdTile bwd_tile(int hdim) {
  for (const BwdTile& t : kBwdTiles)
    if (t.hdim == hdim) return t;
  return {0, 0, 0, false, 0, nullptr};
}

constexpr bool has_bwd(int bucket) { return bwd_tile(bwd_hdim(bucket)).hdim != 0; }

// The smallest bucket that holds d (d <= 256), or 0.
constexpr int hdim_bucket(int d) {
  for (int b : kHdimBuckets)
    if (d <= b) return b;
  return 0;
}

constexpr FwdTile fwd_tile(int hdim) {
  for (const FwdTile& t : kFwdTiles)
    if (t.hdim == hdim) return t;
  return {0, 0, 0, 0, 0, nullptr};
}

// Keys per tile of a forward kernel; `plain`: the variant without mask or score hooks.
constexpr int fwd_block_n(int hdim, bool plain) {
  const FwdTile t = fwd_tile(hdim);
  return plain && t.block_n_plain != 0 ? t.block_n_plain : t.block_n;
}

// Query rows per CTA of a forward kernel: the table's, except that the score-hook variant (softcap, ALiBi) keeps
// two consumer warpgroups (128 rows) where the table has three: at hdim 64 with three of 160 registers its kernel
// spilled 112 bytes (ptxas), the plain and masked ones 0 and 8.
constexpr int fwd_block_m(int hdim, bool hooks) {
  const FwdTile t = fwd_tile(hdim);
  return hooks && t.block_m > 128 ? 128 : t.block_m;
}

// setmaxnreg's split of the SM's 64K registers (multiples of 8): the producer warpgroup keeps 24 per thread, the
// consumers 240 each with two warpgroups, 160 with three (128 x 24 + 384 x 160 = 64512).
inline constexpr int kProducerRegs = 24;
constexpr int consumer_regs(int consumers) { return consumers == 3 ? 160 : 240; }

// Shared memory of the forward (a bound; traits.h has the exact size): Q, the K and V rings and the barriers, and
// O's staging buffer (traits.h: block_m rows of hdim elements in Q's swizzled layout, which the TMA store reads)
// where it fits beside them, except in the score-hook variant, whose kernel spilled 68 bytes with O staged against
// 8 from registers. The one rule for where O is staged: traits.h sizes the buffer by it, fwd_kernel.h's epilogue
// and the plan's report follow it.
constexpr int fwd_core_smem_bytes(int hdim, bool plain, bool hooks) {
  return (fwd_block_m(hdim, hooks) + 2 * fwd_tile(hdim).stages * fwd_block_n(hdim, plain)) * hdim * 2 + 1024;
}
constexpr int fwd_staged_o_bytes(int hdim, bool hooks) { return fwd_block_m(hdim, hooks) * hdim * 2; }
constexpr bool fwd_stages_o(int hdim, bool plain, bool hooks) {
  return !hooks && fwd_core_smem_bytes(hdim, plain, hooks) + fwd_staged_o_bytes(hdim, hooks) <= 227 * 1024;
}
constexpr int fwd_smem_bytes(int hdim, bool plain, bool hooks) {
  return fwd_core_smem_bytes(hdim, plain, hooks) +
         (fwd_stages_o(hdim, plain, hooks) ? fwd_staged_o_bytes(hdim, hooks) : 0);
}

static_assert(fwd_smem_bytes(256, false, false) <= 227 * 1024);
static_assert(fwd_smem_bytes(128, true, false) <= 227 * 1024);

}  // namespace flashtile::cuda::sm90
