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
