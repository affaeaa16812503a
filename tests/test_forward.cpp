// cpu-flash forward against the float64 oracle over the shape sweep, with a tolerance tied to the error
// of standard attention in the same precision.
#include <gtest/gtest.h>

#include <cmath>

#include "cases.h"
#include "support.h"

namespace ft_test {
namespace {

class Forward : public ::testing::TestWithParam<Case> {};

TEST_P(Forward, MatchesReference) {
  auto rng = test_rng();
  Problem p(GetParam(), rng);
  const auto report = flashtile::forward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.lse.view(), p.options());
  EXPECT_EQ(report.ran.backend, "cpu-flash");
  const Results ref = oracle(p, false);
  const Results std_attn = standard_attention(p, false);
  expect_close("out", p.out.to_double(), std_attn.out, ref.out, p.c.dtype, 0.0, std_attn.out_score_sensitivity);
  expect_close("lse", p.lse.to_double(), std_attn.lse, ref.lse, p.c.dtype, score_magnitude(p));
}

TEST_P(Forward, ReferenceBackendMatchesOracle) {
  // The cpu-reference backend writes the oracle's result in the call's dtype: one rounding only.
  auto rng = test_rng();
  const Case c = GetParam();
  if (c.sq * c.sk * c.hq > 300000) GTEST_SKIP() << "large case covered by MatchesReference";
  Problem p(c, rng);
  flashtile::forward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.lse.view(), p.options("cpu-reference"));
  const Results ref = oracle(p, false);
  const auto got = p.out.to_double();
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], ref.out[i], eps(c.dtype) * std::max(1.0, std::abs(ref.out[i]))) << "element " << i;
}

INSTANTIATE_TEST_SUITE_P(Sweep, Forward, ::testing::ValuesIn(sweep_cases()),
                         [](const auto& param_info) { return param_info.param.name(); });

}  // namespace
}  // namespace ft_test
