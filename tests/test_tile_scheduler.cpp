// The sm90 forward's tile order (cuda/common/scheduler.h), checked on the host: every tile is dealt exactly once,
// the length order takes each section's longest blocks first, and a sectioned wave holds enough tiles per
// (head, sequence) pair to share its K and V in L2. The kernels' results cannot show a wrong order (it changes
// only speed) except by a tile visited twice or never, which this test finds without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/common/scheduler.h"

namespace ft_test {
namespace {

using flashtile::cuda::StaticTileScheduler;

TEST(TileScheduler, DealsEveryTileOnceInEitherOrder) {
  for (int blocks : {1, 2, 3, 4, 8, 13, 64})
    for (int heads : {1, 3, 8})
      for (int batch : {1, 2, 5, 16})
        for (int grid : {1, 7, 132})
          for (bool by_length : {false, true}) {
            const StaticTileScheduler s = StaticTileScheduler::make(blocks, heads, batch, by_length, grid);
            std::set<std::tuple<int, int, int>> seen;
            for (int t = 0; t < s.count(); ++t) {
              const auto c = s.at(t);
              ASSERT_TRUE(c.block >= 0 && c.block < blocks && c.head >= 0 && c.head < heads && c.batch >= 0 &&
                          c.batch < batch)
                  << "tile " << t << " of blocks=" << blocks << " heads=" << heads << " batch=" << batch;
              seen.emplace(c.block, c.head, c.batch);
            }
            EXPECT_EQ(static_cast<int>(seen.size()), s.count())
                << "blocks=" << blocks << " heads=" << heads << " batch=" << batch << " grid=" << grid
                << " section=" << s.section;
          }
}

TEST(TileScheduler, LengthOrderIsLongestFirstWithinEachSection) {
  // hdim 256, 1k tokens, 16 sequences x 8 heads, 128-row blocks, 132 SMs: the case that ran without L2 reuse.
  const StaticTileScheduler s = StaticTileScheduler::make(8, 8, 16, true, 132);
  ASSERT_EQ(s.section, 33);  // lcm(8, 264) = 264 tiles: two waves
  const int per_section = s.section * s.blocks;
  for (int t = 1; t < s.count(); ++t) {
    if (t % per_section != 0) {
      EXPECT_LE(s.at(t).block, s.at(t - 1).block) << "tile " << t;
    }
  }
  // The first wave holds blocks 7..4 of 33 pairs (4 tiles of each), not one tile of each of 128 pairs.
  std::set<std::pair<int, int>> pairs;
  for (int t = 0; t < 132; ++t) pairs.emplace(s.at(t).head, s.at(t).batch);
  EXPECT_EQ(pairs.size(), 33u);
}

// Causal work per CTA as the kernel deals it (the snake of scheduler.h's tile()): the key tiles of query block i
// are ceil((i + 1) block_m / block_n) (whole sequence lengths, as the bench's cells). The most loaded CTA stays
// within 6 % of the mean, where sections of ceil(grid / 8) pairs left it 1.25x (hdim 256) and 1.48x (hdim 128)
// above at 1k.
TEST(TileScheduler, SectionsKeepTheCausalWorkBalanced) {
  struct Cell { int seqlen, block_m, block_n, heads; };
  for (const Cell c : {Cell{512, 128, 80, 8}, Cell{1024, 128, 80, 8}, Cell{2048, 128, 80, 8}, Cell{1024, 128, 128, 16},
                       Cell{2048, 128, 128, 16}, Cell{4096, 128, 128, 16}, Cell{1024, 192, 128, 32},
                       Cell{2048, 192, 128, 32}}) {
    const int grid = 132, blocks = (c.seqlen + c.block_m - 1) / c.block_m, batch = 16384 / c.seqlen;
    const StaticTileScheduler s = StaticTileScheduler::make(blocks, c.heads, batch, true, grid);
    std::vector<double> load(grid, 0.0);
    for (int k = 0;; ++k) {
      bool any = false;
      for (int cta = 0; cta < grid; ++cta) {
        const int t = k * grid + ((k & 1) != 0 ? grid - 1 - cta : cta);
        if (t >= s.count()) continue;
        const int rows_end = std::min(c.seqlen, (s.at(t).block + 1) * c.block_m);
        load[cta] += (rows_end + c.block_n - 1) / c.block_n;
        any = true;
      }
      if (!any) break;
    }
    double mean = 0, most = 0;
    for (double l : load) mean += l / grid, most = std::max(most, l);
    EXPECT_LE(most / mean, 1.06) << "seqlen " << c.seqlen << " block " << c.block_m << "x" << c.block_n
                                 << " section " << s.section;
  }
}

TEST(TileScheduler, FewPairsKeepThePlainLengthOrder) {
  // 16k tokens at hdim 128: one sequence, 16 heads, 128 blocks: a wave already holds ~8 tiles per pair.
  const StaticTileScheduler s = StaticTileScheduler::make(128, 16, 1, true, 132);
  EXPECT_EQ(s.section, 0);
  for (int t = 0; t < 16; ++t) EXPECT_EQ(s.at(t).block, 127) << "tile " << t;
  EXPECT_EQ(StaticTileScheduler::make(8, 8, 16, false, 132).section, 0);  // equal lengths: blocks fastest
}

}  // namespace
}  // namespace ft_test
