// The tile scheduler of the persistent kernels: which (block, head, sequence) tiles a CTA computes, and in which
// order, so that a kernel asks for its work instead of reading blockIdx. Static: CTA c of a grid of G takes tiles
// c, c + G, c + 2G, ... of one linear order, so every role of the CTA (producer, consumers) walks the same list
// without talking to the others, and the host sizes the grid to the GPU (min(tiles, SMs x CTAs per SM)).
//
// The order is the one a grid of one CTA per tile ran in: blocks fastest, last block first (under a causal mask the
// last query blocks see the most keys: the longest tiles start first), then heads, then sequences; neighbouring
// tiles share their head's K and V in L2.
#pragma once

#include <cute/config.hpp>

namespace flashtile::cuda {

struct TileCoord {
  int block = 0, head = 0, batch = 0;
};

struct StaticTileScheduler {
  int blocks = 0, heads = 0, batch = 0;

  CUTE_HOST_DEVICE int count() const { return blocks * heads * batch; }
  CUTE_HOST_DEVICE TileCoord at(int t) const {
    return {blocks - 1 - t % blocks, t / blocks % heads, t / (blocks * heads)};
  }
  // This CTA's first tile and the step to its next (t < count() while there is one).
  CUTE_DEVICE int first() const { return static_cast<int>(blockIdx.x); }
  CUTE_DEVICE int stride() const { return static_cast<int>(gridDim.x); }
};

}  // namespace flashtile::cuda
