// Host-side facts the CUDA kernels rely on; arithmetic only, so they run without a GPU.
//  - The backward's varlen workspace layout (src/cuda/common/params.h): each sequence's slots start block-aligned
//    at ws_row0(b, h), hold its rows rounded up to block_m, do not overlap the next sequence's, and stay inside
//    the head's varlen_ws_rows() slots.
//  - The tile visits of core/mask.h's policy are one relation seen from both sides: the forward's query block
//    visits key tile n (key_tiles) iff the backward's key tile n visits that query block (query_tiles) iff some
//    row of the block sees some key of the tile (brute force). The deterministic backward numbers a query
//    block's dQ turns from its first key tile, so a key tile outside that range would deadlock it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "core/mask.h"
#include "cuda/common/params.h"
#include "support.h"

namespace ft_gpu {
namespace {

TEST(GpuWorkspace, VarlenSlotsAreDisjointAndInside) {
  auto rng = ft_test::test_rng();
  std::uniform_int_distribution<int> batch_of(1, 40), len_of(0, 700), zero_of(0, 3);
  for (int trial = 0; trial < 2000; ++trial) {
    for (int block_m : {64, 128}) {
      const int batch = batch_of(rng);
      std::vector<std::int32_t> cu{0};
      for (int b = 0; b < batch; ++b) cu.push_back(cu.back() + (zero_of(rng) == 0 ? 0 : len_of(rng)));
      flashtile::cuda::BwdParams p;
      p.a.cu_seqlens_q = cu.data();
      p.a.batch = batch;
      p.block_m = block_m;
      p.ws_head = flashtile::cuda::varlen_ws_rows(cu.back(), batch, block_m);
      ASSERT_EQ(p.ws_head % block_m, 0);
      for (std::int64_t h : {0, 3}) {
        std::int64_t end = h * p.ws_head;  // first slot not yet used
        for (int b = 0; b < batch; ++b) {
          const std::int64_t start = flashtile::cuda::ws_row0(p, b, h);
          const std::int64_t len = cu[static_cast<std::size_t>(b) + 1] - cu[static_cast<std::size_t>(b)];
          const std::int64_t padded = (len + block_m - 1) / block_m * block_m;
          ASSERT_EQ(start % block_m, 0) << "b " << b;
          ASSERT_GE(start, end) << "sequence " << b << " overlaps the previous one (block_m " << block_m << ")";
          end = start + padded;
        }
        ASSERT_LE(end, (h + 1) * p.ws_head) << "the last sequence leaves the head's slots";
      }
    }
  }
}

TEST(GpuTiles, VisitRelationIsExactAndSymmetric) {
  using flashtile::detail::MaskPolicy;
  using flashtile::detail::Range;
  long pairs = 0;
  for (std::int64_t sq = 1; sq < 150; sq += 7)
    for (std::int64_t sk = 1; sk < 150; sk += 5)
      for (std::int64_t left = -1; left < 70; left += 9)
        for (std::int64_t right = -1; right < 70; right += 11)
          for (std::int64_t bm : {64, 128})
            for (std::int64_t bn : {64, 128}) {
              flashtile::detail::AttnParams p;
              p.window_left = left;
              p.window_right = right;
              flashtile::detail::SeqInfo s;
              s.seqlen_q = sq;
              s.seqlen_k = sk;
              const MaskPolicy pol = MaskPolicy::make(p, s);
              for (std::int64_t mb = 0; mb * bm < sq; ++mb) {
                const Range kt = pol.key_tiles(mb * bm, std::min(bm, sq - mb * bm), bn);
                for (std::int64_t nb = 0; nb * bn < sk; ++nb) {
                  const Range qt = pol.query_tiles(nb * bn, std::min(bn, sk - nb * bn), bm);
                  bool seen = false;
                  for (std::int64_t i = mb * bm; i < std::min(sq, (mb + 1) * bm) && !seen; ++i)
                    for (std::int64_t j = nb * bn; j < std::min(sk, (nb + 1) * bn); ++j)
                      if (j >= pol.key_begin(i) && j < pol.key_end(i)) seen = true;
                  const bool fwd = nb >= kt.begin && nb < kt.end, bwd = mb >= qt.begin && mb < qt.end;
                  ++pairs;
                  ASSERT_TRUE(fwd == seen && bwd == seen)
                      << "Sq " << sq << " Sk " << sk << " window (" << left << ", " << right << ") blocks " << bm
                      << "x" << bn << " query block " << mb << " key tile " << nb << ": key_tiles " << fwd
                      << ", query_tiles " << bwd << ", brute force " << seen;
                }
              }
            }
  EXPECT_GT(pairs, 100000);
}

}  // namespace
}  // namespace ft_gpu
