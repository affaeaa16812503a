// Defined behaviour at the edges: rows with no visible key, empty sizes, NaN and Inf inputs,
// repeatability, custom scales.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "support.h"

namespace ft_test {
namespace {

using flashtile::Options;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

void run_fwd(Problem& p, const Options& o) {
  flashtile::forward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.lse.view(), o);
}
void run_bwd(Problem& p, const Options& o) {
  flashtile::backward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.dout.view(), p.lse.view(), p.dq.view(),
                      p.dk.view(), p.dv.view(), o);
}

TEST(Edge, CausalRowsWithoutKeysGiveZeroOutputAndMinusInfLse) {
  auto rng = test_rng();
  for (DType t : {DType::float32, DType::float16, DType::bfloat16}) {
    Case c;
    c.sq = 70;
    c.sk = 20;  // bottom-right aligned: rows 0..49 see no key
    c.hq = 2;
    c.d = c.dv = 32;
    c.causal = true;
    c.dtype = t;
    Problem p(c, rng);
    run_fwd(p, p.options());
    run_bwd(p, p.options());
    const auto out = p.out.to_double(), lse = p.lse.to_double(), dq = p.dq.to_double();
    for (std::int64_t h = 0; h < c.hq; ++h)
      for (std::int64_t i = 0; i < c.sq; ++i) {
        const bool empty = i < c.sq - c.sk;
        const double l = lse[static_cast<std::size_t>(h * c.sq + i)];
        if (empty) {
          EXPECT_EQ(l, -std::numeric_limits<double>::infinity()) << "row " << i;
        } else {
          EXPECT_TRUE(std::isfinite(l)) << "row " << i;
        }
        for (std::int64_t e = 0; e < c.dv && empty; ++e) EXPECT_EQ(out[static_cast<std::size_t>((i * c.hq + h) * c.dv + e)], 0.0);
        for (std::int64_t e = 0; e < c.d && empty; ++e) EXPECT_EQ(dq[static_cast<std::size_t>((i * c.hq + h) * c.d + e)], 0.0);
      }
    for (double x : p.out.to_double()) ASSERT_FALSE(std::isnan(x));
    for (double x : p.dk.to_double()) ASSERT_FALSE(std::isnan(x));
  }
}

TEST(Edge, EmptySizesAreValidAndDoNothing) {
  auto rng = test_rng();
  for (auto [b, sq, sk] : {std::tuple{0, 5, 5}, std::tuple{2, 0, 5}, std::tuple{2, 5, 0}, std::tuple{1, 0, 0}}) {
    Case c;
    c.b = b;
    c.sq = sq;
    c.sk = sk;
    c.d = c.dv = 16;
    Problem p(c, rng);
    EXPECT_NO_THROW(run_fwd(p, p.options()));
    EXPECT_NO_THROW(run_bwd(p, p.options()));
    if (b > 0 && sq == 0 && sk > 0) {  // no queries: the keys get zero gradients, still written
      for (double x : p.dk.to_double()) EXPECT_EQ(x, 0.0);
      for (double x : p.dv.to_double()) EXPECT_EQ(x, 0.0);
    }
    if (b > 0 && sq > 0 && sk == 0) {  // no keys at all: every row is defined as empty
      for (double x : p.out.to_double()) EXPECT_EQ(x, 0.0);
      for (double x : p.lse.to_double()) EXPECT_EQ(x, -std::numeric_limits<double>::infinity());
      for (double x : p.dq.to_double()) EXPECT_EQ(x, 0.0);
    }
  }
}

TEST(Edge, EmptyTensorsMayHaveAnyStrides) {
  // numpy exports empty arrays with all-zero strides; there is no layout to check.
  auto rng = test_rng();
  Case c;
  c.sq = 0;
  c.sk = 4;
  c.d = c.dv = 8;
  Problem p(c, rng);
  TensorView q = p.q.view(), out = p.out.view(), lse = p.lse.view();
  q.stride = {0, 0, 0, 0};
  out.stride = {0, 0, 0, 0};
  lse.stride = {0, 0, 0, 0};
  EXPECT_NO_THROW(flashtile::forward(q, p.k.view(), p.v.view(), out, lse, p.options()));
}

TEST(Edge, NaNInOneQueryRowStaysInThatRow) {
  auto rng = test_rng();
  Case c;
  c.sq = c.sk = 40;
  c.hq = 2;
  c.d = c.dv = 16;
  Problem p(c, rng);
  p.q.set((7 * c.hq + 1) * c.d + 3, kNaN);  // row 7, head 1
  run_fwd(p, p.options());
  const auto out = p.out.to_double();
  for (std::int64_t i = 0; i < c.sq; ++i)
    for (std::int64_t h = 0; h < c.hq; ++h) {
      const bool hit = i == 7 && h == 1;
      for (std::int64_t e = 0; e < c.dv; ++e)
        EXPECT_EQ(std::isnan(out[static_cast<std::size_t>((i * c.hq + h) * c.dv + e)]), hit) << i << "," << h;
    }
  EXPECT_TRUE(std::isnan(p.lse.to_double()[static_cast<std::size_t>(1 * c.sq + 7)]));
}

// The semantics shared by every backend (reference.cpp, softmax_row): a NaN or +inf visible score makes the
// row NaN; a row whose visible scores are all -inf is empty (O = 0, LSE = -inf, no gradient anywhere); keys a
// row does not see never affect it. Each problem is compared with the oracle, which implements the definition
// on its own, through expect_close: NaN and Inf must sit exactly where the oracle has them (max_abs_error is
// infinite otherwise) and finite values within the usual tolerance; the named facts are asserted directly too.
// Every dtype, causal and not, on whichever ISA path the run forces (the suite runs once per path).
std::size_t row_at(const Case& c, std::int64_t i, std::int64_t h, std::int64_t dim, std::int64_t e) {
  return static_cast<std::size_t>((i * c.hq + h) * dim + e);
}

Case semantics_case(DType t, bool causal) {
  Case c;
  c.sq = 70;
  c.sk = 90;  // causal: row i sees keys j <= i + 20
  c.hq = 2;
  c.hkv = 1;
  c.d = c.dv = 24;
  c.causal = causal;
  c.dtype = t;
  return c;
}

TEST(Edge, RowWithOnlyMinusInfScoresIsEmpty) {
  auto rng = test_rng();
  const double inf = std::numeric_limits<double>::infinity();
  for (DType t : {DType::float32, DType::float16, DType::bfloat16})
    for (bool causal : {false, true}) {
      const Case c = semantics_case(t, causal);
      SCOPED_TRACE(c.name());
      Problem p(c, rng);
      const std::int64_t row = 40;  // head 0: q[0] = -inf against k[0] = 1 for every key: all scores -inf
      for (std::int64_t j = 0; j < c.sk; ++j) p.k.set(j * c.d, 1.0);
      p.q.set(static_cast<std::int64_t>(row_at(c, row, 0, c.d, 0)), -inf);
      for (std::int64_t e = 0; e < c.dv; ++e)  // its gradient must reach nothing (not even as 0 · NaN)
        p.dout.set(static_cast<std::int64_t>(row_at(c, row, 0, c.dv, e)), kNaN);
      run_fwd(p, p.options());
      run_bwd(p, p.options());
      compare_with_oracle(p);
      const auto out = p.out.to_double(), lse = p.lse.to_double(), dq = p.dq.to_double();
      for (std::int64_t e = 0; e < c.dv; ++e) EXPECT_EQ(out[row_at(c, row, 0, c.dv, e)], 0.0);
      for (std::int64_t e = 0; e < c.d; ++e) EXPECT_EQ(dq[row_at(c, row, 0, c.d, e)], 0.0);
      EXPECT_EQ(lse[static_cast<std::size_t>(row)], -inf);
      EXPECT_TRUE(std::isfinite(lse[static_cast<std::size_t>(c.sq + row)]));  // head 1, same row: normal
      for (double x : p.dk.to_double()) ASSERT_TRUE(std::isfinite(x));
      for (double x : p.dv.to_double()) ASSERT_TRUE(std::isfinite(x));
    }
}

TEST(Edge, NaNAndPlusInfScoresGiveNaNRowsAndHiddenValuesStayOut) {
  auto rng = test_rng();
  const double inf = std::numeric_limits<double>::infinity();
  for (DType t : {DType::float32, DType::float16, DType::bfloat16})
    for (bool causal : {false, true}) {
      const Case c = semantics_case(t, causal);
      SCOPED_TRACE(c.name());
      Problem p(c, rng);
      p.q.set(static_cast<std::int64_t>(row_at(c, 7, 1, c.d, 3)), kNaN);  // row 7, head 1: NaN scores
      // Row 50, head 0: q[1] = -inf against k[1] = 1, except key 10 with k[1] = -1: one +inf score among -inf.
      for (std::int64_t j = 0; j < c.sk; ++j) p.k.set(j * c.d + 1, j == 10 ? -1.0 : 1.0);
      p.q.set(static_cast<std::int64_t>(row_at(c, 50, 0, c.d, 1)), -inf);
      const std::int64_t hidden = 85;  // causal: seen by rows >= 65 only
      if (causal) p.v.set(hidden * c.dv + 2, kNaN);
      run_fwd(p, p.options());
      run_bwd(p, p.options());
      compare_with_oracle(p);
      const auto out = p.out.to_double(), lse = p.lse.to_double(), dq = p.dq.to_double();
      for (std::int64_t i = 0; i < c.sq; ++i)
        for (std::int64_t h = 0; h < c.hq; ++h) {
          const bool nan_row = (i == 7 && h == 1) || (i == 50 && h == 0);
          EXPECT_EQ(std::isnan(lse[static_cast<std::size_t>(h * c.sq + i)]), nan_row) << i << "," << h;
          for (std::int64_t e = 0; e < c.dv; ++e)
            EXPECT_EQ(std::isnan(out[row_at(c, i, h, c.dv, e)]), nan_row || (causal && i >= 65 && e == 2))
                << i << "," << h << "," << e;
          EXPECT_EQ(std::isnan(dq[row_at(c, i, h, c.d, 0)]), nan_row || (causal && i >= 65)) << i << "," << h;
        }
    }
}

// Scores that rise from key tile to key tile, and non-finite scores in a later tile, after finite ones. Sk = 384:
// three 128-key tiles, six of 64. Rising: q[0] = 1 and k_j[0] = slope · j add 0.125 · slope · j (scale 1/8), so
// slope 3 rises 24 (64 keys) or 48 (128) a tile, each tile's rescale of the earlier ones e^-24 or less, and slope 0.3
// by 2.4 or 4.8. Non-finite: k_300[1] = +inf against q[1] = -1 (a −inf score) in every row but row 50 of head 0,
// whose q[1] = 1 gives +inf: that row NaN, the others finite; a NaN in k_200 makes every row NaN. (These guarded a
// forward that took a tile's exponentials against the running max of earlier tiles in the Q·Kᵀ product's epilogue,
// redoing rows whose max passed it by more than ln 256: it ran 1.00x on the AVX2 set and 1.005-1.013x on AVX-512
// (bench/cpu_ab.py, 2 threads, S = 2048 / 4096, D = 64 / 128, the AVX-512 EPYC) and was not kept.)
TEST(Edge, RisingScoresAndLateNonFiniteScoresMatchTheOracle) {
  auto rng = test_rng();
  const double inf = std::numeric_limits<double>::infinity();
  for (DType t : {DType::float32, DType::float16, DType::bfloat16}) {
    Case c = semantics_case(t, false);
    c.sk = 384;
    c.d = c.dv = 64;
    // 70 query rows take the tiled forward kernel, 5 the decode kernel (decode_plan.h forward_on_decode): the
    // backward's P = exp(S − LSE) holds only if both formed S as it does (decode_plan.h matrix_rows).
    for (std::int64_t sq : {70, 5}) {
      for (double slope : {3.0, 0.3}) {
        c.sq = sq;
        SCOPED_TRACE(c.name() + " slope " + std::to_string(slope));
        Problem p(c, rng);
        for (std::int64_t i = 0; i < c.sq * c.hq; ++i) p.q.set(i * c.d, 1.0);
        for (std::int64_t j = 0; j < c.sk; ++j) p.k.set(j * c.d, slope * static_cast<double>(j));
        run_fwd(p, p.options());
        run_bwd(p, p.options());
        compare_with_oracle(p);
      }
    }
    c.sq = 70;
    {
      SCOPED_TRACE(c.name() + " +inf score in row 50");
      Problem p(c, rng);
      for (std::int64_t i = 0; i < c.sq; ++i)
        for (std::int64_t h = 0; h < c.hq; ++h)
          p.q.set(static_cast<std::int64_t>(row_at(c, i, h, c.d, 1)), i == 50 && h == 0 ? 1.0 : -1.0);
      p.k.set(300 * c.d + 1, inf);
      run_fwd(p, p.options());
      run_bwd(p, p.options());
      compare_with_oracle(p);
      const auto lse = p.lse.to_double();
      for (std::int64_t i = 0; i < c.sq; ++i)
        for (std::int64_t h = 0; h < c.hq; ++h)
          EXPECT_EQ(std::isnan(lse[static_cast<std::size_t>(h * c.sq + i)]), i == 50 && h == 0) << i << "," << h;
    }
    {
      SCOPED_TRACE(c.name() + " NaN in key 200");
      Problem p(c, rng);
      p.k.set(200 * c.d + 5, kNaN);
      run_fwd(p, p.options());
      for (double x : p.lse.to_double()) EXPECT_TRUE(std::isnan(x));
      for (double x : p.out.to_double()) ASSERT_TRUE(std::isnan(x));
    }
  }
}

TEST(Edge, NonPositiveSoftmaxScalesAreHonoured) {
  // A masked score is -inf whatever the scale: kernels that scale after masking would make it +inf (scale < 0)
  // or NaN (scale = 0).
  auto rng = test_rng();
  for (float scale : {-0.35f, 0.0f})
    for (DType t : {DType::float32, DType::float16, DType::bfloat16})
      for (bool causal : {false, true}) {
        Case c = semantics_case(t, causal);
        c.d = c.dv = 41;  // an odd head dim: the bf16 pair kernels' zero-padded last pair
        c.softmax_scale = scale;
        SCOPED_TRACE(c.name() + " scale " + std::to_string(scale));
        Problem p(c, rng);
        run_fwd(p, p.options());
        run_bwd(p, p.options());
        compare_with_oracle(p);
      }
}

TEST(Edge, NaNInAKeyReachesExactlyTheRowsThatSeeIt) {
  auto rng = test_rng();
  for (DType t : {DType::float32, DType::bfloat16}) {
    Case c;
    c.sq = c.sk = 100;
    c.d = c.dv = 24;
    c.causal = true;
    c.dtype = t;
    Problem p(c, rng);
    const std::int64_t bad = 60;
    p.k.set(bad * c.d + 5, kNaN);
    run_fwd(p, p.options());
    run_bwd(p, p.options());
    const auto out = p.out.to_double(), dq = p.dq.to_double(), dk = p.dk.to_double();
    for (std::int64_t i = 0; i < c.sq; ++i) {
      EXPECT_EQ(std::isnan(out[static_cast<std::size_t>(i * c.dv)]), i >= bad) << "out row " << i;
      EXPECT_EQ(std::isnan(dq[static_cast<std::size_t>(i * c.d)]), i >= bad) << "dq row " << i;
    }
    // Keys before `bad` are seen by rows that also see the NaN key, so their gradients are NaN too;
    // keys after it are seen only by rows >= bad as well. No crash, no silent finite garbage:
    EXPECT_TRUE(std::isnan(dk[static_cast<std::size_t>(bad * c.d)]));
  }
}

TEST(Edge, NaNInAValueOrGradientRowReachesOnlyRowsThatSeeIt) {
  auto rng = test_rng();
  // bf16 too: on the bf16 dot-product paths, keys are multiplied in pairs and an odd row end must not pair
  // the last visible key with the NaN one.
  for (DType t : {DType::float32, DType::bfloat16}) {
    Case c;
    c.sq = c.sk = 100;
    c.d = c.dv = 24;
    c.causal = true;
    c.dtype = t;
    Problem p(c, rng);
    // Value row 61: rows >= 61 see it. Row 60 sees 61 keys, an odd count: a pair kernel that rounded its
    // pairs up would multiply the NaN by P = 0 there.
    const std::int64_t bad = 61;
    p.v.set(bad * c.dv + 2, kNaN);
    p.dout.set(30 * c.dv + 1, kNaN);   // gradient of query row 30: keys <= 30 are seen by it
    run_fwd(p, p.options());
    run_bwd(p, p.options());
    const auto out = p.out.to_double(), dv = p.dv.to_double();
    for (std::int64_t i = 0; i < c.sq; ++i)
      EXPECT_EQ(std::isnan(out[static_cast<std::size_t>(i * c.dv + 2)]), i >= bad) << i << " " << dtype_name(t);
    for (std::int64_t j = 0; j < c.sk; ++j)
      EXPECT_EQ(std::isnan(dv[static_cast<std::size_t>(j * c.dv + 1)]), j <= 30) << j << " " << dtype_name(t);
  }
}

// Kernels that multiply whole blocks of keys (the AMX path steps over 32) also multiply keys a row does not
// see, with P = 0. Here a thread's K/V cache already holds keys past a query tile's last visible key when it
// gets to that tile: one thread, two query heads sharing one KV head, so head 1's first tile (keys < 94)
// comes after head 0's last (keys < 100), and the NaN value of key 95 sits in the same 32-key block as key 93.
TEST(Edge, NaNInAValueBeyondATilesKeysStaysOut) {
  auto rng = test_rng();
  for (DType t : {DType::float32, DType::bfloat16}) {
    Case c;
    c.sq = 70;
    c.sk = 100;
    c.hq = 2;
    c.hkv = 1;
    c.d = c.dv = 24;
    c.causal = true;
    c.dtype = t;
    Problem p(c, rng);
    const std::int64_t bad = 95;  // seen by query rows i with i + sk - sq >= bad: i >= 65
    p.v.set(bad * c.dv + 2, kNaN);
    flashtile::Options o = p.options();
    o.num_threads = 1;
    run_fwd(p, o);
    const auto out = p.out.to_double();
    for (std::int64_t i = 0; i < c.sq; ++i)
      for (std::int64_t h = 0; h < c.hq; ++h)
        EXPECT_EQ(std::isnan(out[static_cast<std::size_t>((i * c.hq + h) * c.dv + 2)]), i >= 65)
            << "row " << i << " head " << h << " " << dtype_name(t);
  }
}

TEST(Edge, InfiniteInputGivesNaNNotGarbage) {
  auto rng = test_rng();
  Case c;
  c.sq = c.sk = 16;
  c.d = c.dv = 8;
  Problem p(c, rng);
  for (std::int64_t e = 0; e < c.d; ++e) p.q.set(3 * c.d + e, std::numeric_limits<double>::infinity());
  run_fwd(p, p.options());
  const auto out = p.out.to_double();
  EXPECT_TRUE(std::isnan(out[static_cast<std::size_t>(3 * c.dv)]));
  EXPECT_FALSE(std::isnan(out[static_cast<std::size_t>(4 * c.dv)]));
}

TEST(Edge, RepeatedCallsAreBitwiseIdentical) {
  auto rng = test_rng();
  Case c;
  c.sq = 150;
  c.sk = 190;
  c.hq = 4;
  c.hkv = 2;
  c.d = c.dv = 64;
  c.causal = true;
  c.dtype = DType::bfloat16;
  Problem p(c, rng);
  run_fwd(p, p.options());
  run_bwd(p, p.options());
  const auto out = p.out.to_double(), lse = p.lse.to_double(), dq = p.dq.to_double(), dk = p.dk.to_double(),
             dv = p.dv.to_double();
  for (int rep = 0; rep < 3; ++rep) {
    p.out.fill(kNaN);
    p.dq.fill(kNaN);
    p.dk.fill(kNaN);
    p.dv.fill(kNaN);
    run_fwd(p, p.options());
    run_bwd(p, p.options());
    EXPECT_EQ(p.out.to_double(), out);
    EXPECT_EQ(p.lse.to_double(), lse);
    EXPECT_EQ(p.dq.to_double(), dq);
    EXPECT_EQ(p.dk.to_double(), dk);
    EXPECT_EQ(p.dv.to_double(), dv);
  }
}

TEST(Edge, SoftmaxScaleIsHonoured) {
  auto rng = test_rng();
  Case c;
  c.sq = c.sk = 33;
  c.d = c.dv = 16;
  Problem p(c, rng);
  Options o = p.options();
  o.softmax_scale = 0.9f;
  run_fwd(p, o);
  const auto ref = flashtile::reference::forward(p.q.view(), p.k.view(), p.v.view(), o);
  EXPECT_LE(max_abs_error(p.out.to_double(), ref.out), 1e-5);
  o.softmax_scale = 0.25f;  // a different scale must change the result
  const auto other = flashtile::reference::forward(p.q.view(), p.k.view(), p.v.view(), o);
  EXPECT_GT(max_abs_error(p.out.to_double(), other.out), 1e-3);
}

TEST(Edge, EveryIsaPathThisCpuRunsAgreesWithTheOracle) {
  auto rng = test_rng();
  ScopedCpuIsa forced(nullptr);
  // bf16 reaches the dot-product pair kernels of avx512-bf16 and avx2-bf16emu; d = 41 gives them an odd
  // head dim (a zero-padded last pair) and Sk = 91 an odd last key tile.
  for (DType t : {DType::float16, DType::bfloat16}) {
    Case c;
    c.sq = 77;
    c.sk = 91;
    c.hq = 4;
    c.hkv = 2;
    c.d = c.dv = t == DType::float16 ? 40 : 41;
    c.causal = true;
    c.dtype = t;
    Problem p(c, rng);
    const Results ref = oracle(p, true);
    const Results std_attn = standard_attention(p, true);
    for (const char* isa : {"scalar", "avx2", "avx512", "avx2-bf16emu", "avx512-bf16"}) {
      forced.set(isa);
      const auto plan = flashtile::explain_forward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.lse.view(),
                                                   p.options());
      if (plan.ran.backend != "cpu-flash") continue;  // this CPU cannot execute that path
      EXPECT_EQ(plan.ran.isa, isa);
      p.out.fill(kNaN);
      run_fwd(p, p.options());
      run_bwd(p, p.options());
      SCOPED_TRACE(isa);
      expect_close("out", p.out.to_double(), std_attn.out, ref.out, c.dtype, 0.0, std_attn.out_score_sensitivity);
      const double mag = backward_magnitude(ref);
      expect_close("dq", p.dq.to_double(), std_attn.dq, ref.dq, c.dtype, mag);
      expect_close("dk", p.dk.to_double(), std_attn.dk, ref.dk, c.dtype, mag);
    }
  }
}

}  // namespace
}  // namespace ft_test
