// Linear memory: no allocation that grows with Sq x Sk. The heap probe (src/probe) replaces operator
// new in this test binary and sees every allocation the library makes during a call.
#include <gtest/gtest.h>

#include "probe/alloc_probe.h"
#include "support.h"

namespace ft_test {
namespace {

struct Peaks {
  std::int64_t fwd, bwd;
};

Peaks measure(std::int64_t s, bool causal) {
  std::mt19937_64 rng(run_seed());
  Case c;
  c.sq = c.sk = s;
  c.hq = c.hkv = 2;
  c.d = c.dv = 32;
  c.causal = causal;
  Problem p(c, rng);
  flashtile::Options o = p.options();
  o.num_threads = 2;
  // An unmeasured call first: when an earlier test ran a larger OpenMP team (OMP_NUM_THREADS=16 on the GPU
  // machine's host), the first 2-thread region ends the surplus threads, and the thread-local decode scratch they
  // free inside the measured window hid this call's own scratch (S=1024: 280 B extra seen).
  flashtile::forward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.lse.view(), o);
  flashtile::probe::reset_peak();
  flashtile::forward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.lse.view(), o);
  const std::int64_t fwd = flashtile::probe::peak_extra_bytes();
  flashtile::probe::reset_peak();
  flashtile::backward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.dout.view(), p.lse.view(), p.dq.view(),
                      p.dk.view(), p.dv.view(), o);
  const std::int64_t bwd = flashtile::probe::peak_extra_bytes();
  return {fwd, bwd};
}

TEST(Memory, ProbeSeesAllocations) {
  flashtile::probe::reset_peak();
  { std::vector<char> big(1 << 20); big[5] = 1; }
  EXPECT_GE(flashtile::probe::peak_extra_bytes(), 1 << 20);
}

TEST(Memory, ForwardExtraMemoryIsLinearInSequenceLength) {
  for (bool causal : {false, true}) {
    const Peaks a = measure(1024, causal), b = measure(4096, causal);
    // Per thread: one tile set plus a float copy of one KV head's K and V (2 · Sk · D floats).
    EXPECT_LE(b.fwd, 4 * a.fwd + (1 << 16)) << "S=1024: " << a.fwd << " B, S=4096: " << b.fwd << " B";
    const std::int64_t s = 4096, d = 32, threads = 2;
    EXPECT_LE(b.fwd, threads * 2 * s * d * 4 + (1 << 20));
    // A score matrix for one head at S=4096 would be 64 MiB in float32.
    EXPECT_LT(b.fwd, s * s * 4 / 16);
  }
}

TEST(Memory, BackwardExtraMemoryIsLinearInSequenceLength) {
  const Peaks a = measure(1024, true), b = measure(4096, true);
  // Linear: 4x the rows, at most ~4x the bytes (plus constant per-thread scratch); quadratic would be 16x.
  EXPECT_LE(b.bwd, 4 * a.bwd + (1 << 20)) << "S=1024: " << a.bwd << " B, S=4096: " << b.bwd << " B";
  // dQ accumulators and row statistics: a few floats per row and head-dim element, far below S^2.
  const std::int64_t s = 4096, heads = 2, d = 32;
  EXPECT_LE(b.bwd, 8 * heads * s * d * 4 + (1 << 20));
  EXPECT_LT(b.bwd, heads * s * s * 4 / 16);
}

}  // namespace
}  // namespace ft_test
