// Tile sizes of the sm80 (mma.sync) path, one entry per head-dim bucket, with the reason for each.
// Host and device code read the same table: plan() reports it, the kernels are built from it.
//
// Budget: the path runs on every sm80+ GPU, so each entry fits A100's 163 KB of shared memory per block
// (H100/H200 have 227 KB) and 255 registers per thread without spilling.
#pragma once

namespace flashtile::cuda::sm80 {

struct FwdTile {
  int hdim, block_m, block_n, warps;
  const char* why;
};

struct BwdTile {
  int hdim, block_m, block_n, warps;
  int atom_m_sdp;  // warps along the query rows in S = Q K^T and dP = dO V^T (the rest along keys)
  int atom_n_dkv;  // warps along the key rows in dK, dV (the rest along the head dim)
  int atom_m_dq;   // warps along the query rows in dQ (the rest along the head dim)
  int stages_q;    // shared-memory buffers for Q and dO (2: the next block loads during this one)
  const char* why;
};

// Forward: K and V have one buffer each; V_j loads while Q K_j^T runs and K_{j+1} loads while the softmax and
// P V_j run, so two loads are always in flight. O accumulates in registers: block_m * hdim / threads floats.
inline constexpr FwdTile kFwdTiles[] = {
    {32, 128, 64, 4, "128x128 (FA2's choice) spilled here (S alone is 128 regs/thread); 16 KB smem"},
    {64, 128, 64, 4, "128x128 spilled 272 B with nvcc 13 (S 128 + acc_o 64 regs); 128x64 does not; 32 KB"},
    {96, 128, 64, 4, "block_n 64: S (64 regs) + acc_o (96 regs) fit 255 regs; 40 KB smem"},
    {128, 128, 64, 4, "acc_o 128 regs + S 64 regs; block_n 128 spilled in FA2's measurements on A100"},
    {160, 128, 64, 8, "8 warps (16 rows each): acc_o 80 regs; 4 warps would need 160 regs for acc_o"},
    {192, 128, 64, 8, "8 warps keep acc_o at 96 regs; 96 KB smem"},
    {224, 128, 64, 8, "8 warps keep acc_o at 112 regs; 112 KB smem"},
    {256, 128, 64, 8, "8 warps keep acc_o at 128 regs; 128 KB smem fits A100's 163 KB"},
};

// Backward: one CTA per key block (and KV head; it loops over the query heads of its group); dK and dV
// accumulate in registers: 2 * block_n * hdim / threads floats.
inline constexpr BwdTile kBwdTiles[] = {
    {32, 64, 128, 8, 2, 4, 4, 2, "dK+dV 32 regs; 64x128 S/dP tiles at 32 regs each"},
    {64, 128, 128, 8, 4, 4, 4, 2, "128 query rows per step halve the dQ reductions per FLOP; 160 KB smem (FA2's choice)"},
    {96, 64, 128, 8, 2, 4, 4, 2, "dK+dV 96 regs; 128 KB smem"},
    {128, 64, 128, 8, 2, 4, 2, 2, "dK+dV 128 regs (FA2's A100 choice); dQ 2x4 warps; 160 KB smem just fits A100"},
    {160, 64, 64, 8, 4, 4, 4, 2, "block_n 64 to keep dK+dV at 80 regs; 144 KB smem"},
    {192, 64, 64, 8, 4, 4, 4, 2, "dK+dV 96 regs; 160 KB smem with double-buffered Q/dO"},
    {224, 64, 64, 8, 4, 4, 4, 1, "single Q/dO buffer: double buffering would need 184 KB (> A100)"},
    {256, 64, 64, 8, 4, 4, 4, 1, "single Q/dO buffer: double buffering would need 208 KB (> A100)"},
};

// Backward entries for GPUs that let a block opt into more shared memory than these need (H100/H200: 227 KB),
// chosen at run time over the entry above; only head dims whose best tile differs are listed.
inline constexpr BwdTile kBwdTilesLarge[] = {
    {224, 64, 64, 8, 4, 4, 4, 2, "Q/dO double-buffered: 184 KB smem (Hopper)"},
    {256, 64, 64, 8, 4, 2, 2, 2, "Q/dO double-buffered: 208 KB smem (Hopper); dK/dV and dQ warps as FA2 on H100"},
};

inline constexpr int kHdimBuckets[] = {32, 64, 96, 128, 160, 192, 224, 256};

// The smallest bucket that holds d (d <= 256), or 0.
constexpr int hdim_bucket(int d) {
  for (int b : kHdimBuckets)
    if (d <= b) return b;
  return 0;
}

constexpr FwdTile fwd_tile(int hdim) {
  for (const FwdTile& t : kFwdTiles)
    if (t.hdim == hdim) return t;
  return {0, 0, 0, 0, nullptr};
}

// large: the entry of kBwdTilesLarge when it has one for hdim (else the regular entry).
constexpr BwdTile bwd_tile(int hdim, bool large = false) {
  if (large)
    for (const BwdTile& t : kBwdTilesLarge)
      if (t.hdim == hdim) return t;
  for (const BwdTile& t : kBwdTiles)
    if (t.hdim == hdim) return t;
  return {0, 0, 0, 0, 0, 0, 0, 0, nullptr};
}

constexpr bool has_large_bwd_tile(int hdim) {
  for (const BwdTile& t : kBwdTilesLarge)
    if (t.hdim == hdim) return true;
  return false;
}

constexpr int fwd_smem_bytes(int hdim) {
  const FwdTile t = fwd_tile(hdim);
  return (t.block_m + 2 * t.block_n) * hdim * 2;
}

constexpr int bwd_smem_bytes(int hdim, bool large = false) {
  const BwdTile t = bwd_tile(hdim, large);
  return (2 * t.stages_q * t.block_m * hdim + 2 * t.block_n * hdim + 2 * t.block_m * t.block_n) * 2;
}

static_assert(bwd_smem_bytes(64) <= 163 * 1024 && bwd_smem_bytes(128) <= 163 * 1024 &&
              bwd_smem_bytes(192) <= 163 * 1024 && bwd_smem_bytes(256) <= 163 * 1024 &&
              bwd_smem_bytes(224) <= 163 * 1024);
static_assert(bwd_smem_bytes(224, true) <= 227 * 1024 && bwd_smem_bytes(256, true) <= 227 * 1024);
static_assert(fwd_smem_bytes(256) <= 163 * 1024);

}  // namespace flashtile::cuda::sm80
