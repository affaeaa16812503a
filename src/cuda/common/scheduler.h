// The tile scheduler of the persistent kernels: which (block, head, sequence) tiles a CTA computes, and in which
// order, so that a kernel asks for its work instead of reading blockIdx. Static: the tiles are numbered in one
// linear order and dealt in waves of G (the grid): in wave k, CTA c takes tile kG + c, or kG + G - 1 - c in odd
// waves (a snake, so the CTA that got the longest tile of one wave gets the shortest of the next). Every role of
// the CTA (producer, consumers) walks the same list without talking to the others, and the host sizes the grid
// to the GPU (min(tiles, SMs)).
//
// Orders, last block first:
// - equal-length tiles (no mask): blocks fastest, then heads, then sequences; neighbouring tiles share their
//   head's K and V in L2.
// - by length (causal, window: the last query blocks see the most keys): blocks slowest, so every wave holds
//   tiles of nearly one length and the longest start first. Dealt blocks-fastest instead, with 132 CTAs and 128
//   blocks per head CTA 0 took blocks 127, 123, ..., 67 and CTA 64 blocks 63, ..., 3: the forward at 16k tokens,
//   causal, ran at 0.64x cuDNN (measured on the H200, 2026-12-01).
#pragma once

#include <cute/config.hpp>

namespace flashtile::cuda {

struct TileCoord {
  int block = 0, head = 0, batch = 0;
};

struct StaticTileScheduler {
  int blocks = 0, heads = 0, batch = 0;
  bool by_length = false;  // blocks slowest (tiles of unequal length), else fastest

  CUTE_HOST_DEVICE int count() const { return blocks * heads * batch; }
  CUTE_HOST_DEVICE TileCoord at(int t) const {
    if (by_length) {
      const int r = t % (heads * batch);
      return {blocks - 1 - t / (heads * batch), r % heads, r / heads};
    }
    return {blocks - 1 - t % blocks, t / blocks % heads, t / (blocks * heads)};
  }
  // This CTA's k-th tile (it has one while the result is below count()).
  CUTE_DEVICE int tile(int k) const {
    const int g = static_cast<int>(gridDim.x), c = static_cast<int>(blockIdx.x);
    return k * g + ((k & 1) != 0 ? g - 1 - c : c);
  }
};

}  // namespace flashtile::cuda
