// The backward's varlen workspace layout (src/cuda/common/params.h): each sequence's slots start block-aligned at
// ws_row0(b, h), hold its rows rounded up to block_m, do not overlap the next sequence's, and stay inside the
// head's varlen_ws_rows() slots. Host arithmetic only: runs without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

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

}  // namespace
}  // namespace ft_gpu
