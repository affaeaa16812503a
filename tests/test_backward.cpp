// cpu-flash backward against the float64 oracle over the shape sweep.
#include <gtest/gtest.h>

#include <algorithm>

#include "cases.h"
#include "support.h"

namespace ft_test {
namespace {

class Backward : public ::testing::TestWithParam<Case> {};

TEST_P(Backward, MatchesReference) {
  auto rng = test_rng();
  Problem p(GetParam(), rng);
  const auto o = p.options();
  flashtile::forward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.lse.view(), o);
  const auto report = flashtile::backward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.dout.view(),
                                          p.lse.view(), p.dq.view(), p.dk.view(), p.dv.view(), o);
  EXPECT_EQ(report.ran.kernel, "cpu_flash_bwd");
  const Results ref = oracle(p, true);
  const Results std_attn = standard_attention(p, true);
  const double mag = backward_magnitude(ref);
  expect_close("dq", p.dq.to_double(), std_attn.dq, ref.dq, p.c.dtype, mag);
  expect_close("dk", p.dk.to_double(), std_attn.dk, ref.dk, p.c.dtype, mag);
  expect_close("dv", p.dv.to_double(), std_attn.dv, ref.dv, p.c.dtype, mag);
}

INSTANTIATE_TEST_SUITE_P(Sweep, Backward, ::testing::ValuesIn(sweep_cases()),
                         [](const auto& param_info) { return param_info.param.name(); });

}  // namespace
}  // namespace ft_test
