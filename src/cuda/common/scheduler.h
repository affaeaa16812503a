// The tile scheduler of the persistent kernels: which (block, head, sequence) tiles a CTA computes, and in which
// order, so that a kernel asks for its work instead of reading blockIdx. Static: the tiles are numbered in one
// linear order and dealt in waves of G (the grid): in wave k, CTA c takes tile kG + c, or kG + G - 1 - c in odd
// waves (a snake, so the CTA that got the longest tile of one wave gets the shortest of the next). Every role of
// the CTA (producer, consumers) walks the same list without talking to the others; make() sizes the grid to the
// GPU (min(tiles, SMs)) and the launcher launches that many CTAs.
//
// Orders, last block first:
// - equal-length tiles (no mask): blocks fastest, then heads, then sequences; neighbouring tiles share their
//   head's K and V in L2.
// - by length (causal, window: the last query blocks see the most keys): blocks slowest within a section of
//   (head, sequence) pairs, so every wave holds tiles of nearly one length and the longest start first, and enough
//   tiles of each pair to share its K and V in L2. Dealt blocks-fastest instead, with 132 CTAs and 128
//   blocks per head CTA 0 took blocks 127, 123, ..., 67 and CTA 64 blocks 63, ..., 3: the forward at 16k tokens,
//   causal, ran at 0.64x cuDNN (measured on the H200, 2026-12-01).
#pragma once

#include <numeric>

#include "core/host_device.h"

namespace flashtile::cuda {

struct TileCoord {
  int block = 0, head = 0, batch = 0;
};

struct StaticTileScheduler {
  int blocks = 0, heads = 0, batch = 0;
  bool by_length = false;  // blocks slowest (tiles of unequal length), else fastest
  // Under the length order: the (head, sequence) pairs are taken `section` at a time (0: all at once), each
  // section's tiles longest first. With every pair in one section, a wave of 132 tiles over 128 pairs (hdim 256,
  // 1k tokens, 16 sequences x 8 heads, causal) held one tile per pair, so no two CTAs read the same K and V at once:
  // the kernel took 240 us against cuDNN's 151 (ncu, 2026-12-03), as long as the unmasked call (its 0.64 GB of K and
  // V reads over 240 us are 2.7 TB/s if none came from L2).
  int section = 0;
  int grid = 0;  // CTAs: one per SM, at most one per tile

  // The scheduler of a persistent kernel on `sms` SMs, and its grid. A section holds lcm(blocks, 2 grid) tiles: a
  // whole number of wave pairs, so the snake deals each CTA one tile of a wave's longest and one of the next wave's
  // shortest, as without sections (the most loaded CTA 1.00-1.05x the mean, simulated for the bench's causal cells),
  // and a wave holds gcd(blocks, 2 grid) / 2 tiles of each of its pairs (4 at 1k-4k with 128-row blocks), which share
  // K and V in L2. Sections of ceil(grid / 8) pairs instead (8 tiles per pair and wave) left CTAs up to 1.25-1.48x the
  // mean at 1k-2k. Where a section would hold every pair (long sequences), the order is the plain length order.
  static StaticTileScheduler make(int blocks, int heads, int batch, bool by_length, int sms) {
    StaticTileScheduler s{blocks, heads, batch, by_length, 0, 0};
    s.grid = s.count() < sms ? s.count() : sms;
    if (by_length && blocks > 0 && s.grid > 0) {
      const int pairs = 2 * s.grid / std::gcd(blocks, 2 * s.grid);
      if (pairs < heads * batch) s.section = pairs;
    }
    return s;
  }

  FT_HOST_DEVICE int count() const { return blocks * heads * batch; }
  FT_HOST_DEVICE TileCoord at(int t) const {
    if (by_length) {
      const int pairs = heads * batch;
      const int size = section > 0 ? section : pairs;
      const int first = t / (size * blocks) * size;  // this section's first pair
      const int i = t - first * blocks;              // the tile within the section
      const int here = pairs - first < size ? pairs - first : size;  // the last section may be short
      const int pair = first + i % here;
      return {blocks - 1 - i / here, pair % heads, pair / heads};
    }
    return {blocks - 1 - t % blocks, t / blocks % heads, t / (blocks * heads)};
  }
#ifdef __CUDACC__
  // This CTA's k-th tile (it has one while the result is below count()).
  __device__ __forceinline__ int tile(int k) const {
    const int g = static_cast<int>(gridDim.x), c = static_cast<int>(blockIdx.x);
    return k * g + ((k & 1) != 0 ? g - 1 - c : c);
  }
#endif
};

}  // namespace flashtile::cuda
