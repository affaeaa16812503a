// Mask policies. A policy answers three questions for the mainloops: which key blocks a query block
// visits (trip counts), whether one (query block, key block) tile needs element masking at all, and how to
// mask an accumulator tile. Causal is bottom-right aligned: query i sees keys j <= i + Sk - Sq.
// Both policies also mask keys >= Sk (the zero-filled tail of the last key block).
#pragma once

#include <cute/tensor.hpp>

namespace flashtile::cuda {

struct NoMask {
  static constexpr bool kCausal = false;
};

struct CausalMask {
  static constexpr bool kCausal = true;
};

template <class Mask>
struct MaskOps {
  static constexpr bool kCausal = Mask::kCausal;

  // Key blocks [0, n_block_max) hold every key visible to some row of the query block at m0.
  CUTE_HOST_DEVICE static int n_block_max(int m0, int block_m, int block_n, int sq, int sk) {
    int end = sk;
    if constexpr (kCausal) {
      const int last_row = (m0 + block_m < sq ? m0 + block_m : sq) - 1;
      end = last_row + 1 + sk - sq;
      end = end < sk ? end : sk;
    }
    return end <= 0 ? 0 : (end + block_n - 1) / block_n;
  }

  // The first query block that sees any key of the key block at n0 (backward trip count). Consistent
  // with n_block_max: block m visits block n iff m >= m_block_min(n).
  CUTE_HOST_DEVICE static int m_block_min(int n0, int block_m, int sq, int sk) {
    if constexpr (kCausal) {
      const int x = n0 - sk + sq;  // the first row that sees key n0
      return x > 0 ? x / block_m : 0;
    } else {
      return 0;
    }
  }

  // True when some element of the tile is invisible to its row: a key beyond Sk, or (causal) above the
  // diagonal. Uniform across the CTA, so the mainloop branches once per tile.
  CUTE_HOST_DEVICE static bool tile_needs_mask(int m0, int n0, int block_n, int sq, int sk) {
    if (n0 + block_n > sk) return true;
    if constexpr (kCausal) return n0 + block_n - 1 > m0 + sk - sq;
    return false;
  }

  // acc_rc: an accumulator in (row, col) view; coord_rc: the same view of the tile's identity tensor.
  template <class Acc, class Coord>
  CUTE_DEVICE static void apply(Acc& acc_rc, Coord const& coord_rc, int m0, int n0, int sq, int sk) {
    CUTE_UNROLL
    for (int mi = 0; mi < cute::size<0>(acc_rc); ++mi) {
      const int row = m0 + cute::get<0>(coord_rc(mi, 0));
      int limit = sk;
      if constexpr (kCausal) {
        const int c = row + 1 + sk - sq;
        limit = c < sk ? c : sk;
      }
      CUTE_UNROLL
      for (int ni = 0; ni < cute::size<1>(acc_rc); ++ni) {
        if (n0 + cute::get<1>(coord_rc(mi, ni)) >= limit) acc_rc(mi, ni) = -INFINITY;
      }
    }
  }
};

}  // namespace flashtile::cuda
