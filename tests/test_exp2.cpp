// Accuracy of the vector-friendly exp2 used in the CPU softmax.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "cpu/exp2.h"

namespace {

TEST(Exp2, RelativeErrorWithinFourUlpsOnTheSoftmaxRange) {
  double worst = 0.0;
  for (float x = -126.0f; x <= 0.0f; x += 0.000977f) {
    const double want = std::exp2(static_cast<double>(x));
    const double got = flashtile::cpu::exp2_fast(x);
    worst = std::max(worst, std::abs(got - want) / want);
  }
  EXPECT_LE(worst, 4.0 * std::ldexp(1.0, -24)) << "worst relative error " << worst;
  EXPECT_GT(worst, 0.0);  // it is an approximation; exactness would mean the test is not looking
}

// The degree-4 polynomial of the bf16 forwards' P (exp2.h kExp2Bf16Poly, which simd.h exp2_scalef<true> evaluates
// with FMAs): within 4e-6 of 2^f over its interval, far below bf16's 2^-9. This test is the one that guards it: the
// end-to-end bf16 tests do not see far larger errors either (a 1.4 % wrong ln 2 coefficient, 0.5 % in P, passed
// all of them).
TEST(Exp2, Bf16PolynomialRelativeError) {
  using flashtile::cpu::kExp2Bf16Poly;
  double worst = 0.0;
  for (float f = -0.5f; f <= 0.5f; f += 0.0001f) {
    float p = kExp2Bf16Poly[4];
    for (int i = 3; i >= 0; --i) p = std::fma(p, f, kExp2Bf16Poly[i]);
    const double want = std::exp2(static_cast<double>(f));
    worst = std::max(worst, std::abs(p - want) / want);
  }
  EXPECT_LE(worst, 4e-6) << "worst relative error " << worst;
  EXPECT_GE(worst, 1e-6);  // degree 4: an exact fit would mean the loop is not evaluating the polynomial
}

TEST(Exp2, EdgeValues) {
  using flashtile::cpu::exp2_fast;
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(exp2_fast(-inf), 0.0f);
  EXPECT_EQ(exp2_fast(-1000.0f), 0.0f);
  EXPECT_EQ(exp2_fast(0.0f), 1.0f);
  EXPECT_TRUE(std::isnan(exp2_fast(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(exp2_fast(inf), inf);
  EXPECT_NEAR(exp2_fast(10.5f), std::exp2(10.5), 1e-6 * std::exp2(10.5));
}

}  // namespace

// The softcap's tanh (cpu/score_row.h): within a few float ulps of tanh over the range a capped score takes,
// including the switch between the polynomial (|x| < 0.625) and the exp2 form; the edge values exact.
#include "cpu/score_row.h"

namespace {

TEST(TanhFast, RelativeErrorWithinEightUlpsAndEdgeValues) {
  using flashtile::cpu::tanh_fast;
  double worst = 0.0;
  for (float x = -20.0f; x <= 20.0f; x += 0.00037f) {
    const double want = std::tanh(static_cast<double>(x));
    if (want == 0.0) continue;
    worst = std::max(worst, std::abs(tanh_fast(x) - want) / std::abs(want));
  }
  for (float x = 1e-30f; x < 1.0f; x *= 1.37f)  // tiny arguments: tanh x = x to the last bit matters relatively
    worst = std::max(worst, std::abs(tanh_fast(x) - std::tanh(static_cast<double>(x))) / std::tanh(static_cast<double>(x)));
  EXPECT_LE(worst, 8.0 * std::ldexp(1.0, -24)) << "worst relative error " << worst;
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(tanh_fast(inf), 1.0f);
  EXPECT_EQ(tanh_fast(-inf), -1.0f);
  EXPECT_EQ(tanh_fast(0.0f), 0.0f);
  EXPECT_EQ(tanh_fast(100.0f), 1.0f);
  EXPECT_TRUE(std::isnan(tanh_fast(std::numeric_limits<float>::quiet_NaN())));
}

}  // namespace
