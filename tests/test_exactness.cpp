// Exactness where keeping scores in log2 units lost it (issue 11): with one key dominating every row
// (p ≈ 0.99 after 1023 small scores) the float32 backward recomputes P = e^(s − LSE) with s ≈ LSE ≈ 11.5.
// Folding log2(e) into both terms rounded each at its own magnitude, an error of eps·|s| in the exponent that
// does not cancel: dV was off by 3.9e-6 of max|dV| against 2.8e-7 for standard attention in float32.
//
// The tolerance for dV is the plain one of expect_close: 2 × standard attention's error in the same run plus
// 8·eps times the largest gradient, without the (1 + max|LSE|) allowance the sweep grants for recomputation
// (backward_magnitude); the log2-unit kernels failed it (dV error 1.4-1.6 × this tolerance, seeds 1-3). What remains of that cost here is LSE's own float32 rounding, at most half an ulp of
// 11.5 (8·2^-24 = 4.8e-7) in the exponent, a relative error of about that in P, inside the 8·eps = 9.5e-7 floor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "support.h"

namespace ft_test {
namespace {

TEST(Exactness, DominantKeyBackwardIsAsExactAsStandardAttention) {
  auto rng = test_rng();
  Case c;
  c.sq = 64;
  c.sk = 1024;
  c.d = c.dv = 64;
  Problem p(c, rng);
  std::normal_distribution<double> nd(0.0, 1.0);
  // q_i = u + 0.5·noise (orthogonal to u), and the dominant key k_j0 = β·u with scale·β·|u|² = 11.5: s_ij0 ≈ 11.5 for every row,
  // the other keys 0.1·N(0, 1): |s_ij| ≈ 0.1. p_ij0 = e^11.5 / (e^11.5 + ~1023) ≈ 0.99.
  std::vector<double> u(static_cast<std::size_t>(c.d));
  double norm2 = 0.0;
  for (double& x : u) {
    x = nd(rng);
    norm2 += x * x;
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  const double beta = 11.5 / (scale * norm2);
  const std::int64_t j0 = std::uniform_int_distribution<std::int64_t>(0, c.sk - 1)(rng);
  for (std::int64_t i = 0; i < c.sq; ++i) {  // the noise is made orthogonal to u, so q_i · u = |u|² in every row
    std::vector<double> noise(u.size());
    double along = 0.0;
    for (std::size_t e = 0; e < u.size(); ++e) along += (noise[e] = 0.5 * nd(rng)) * u[e];
    for (std::size_t e = 0; e < u.size(); ++e)
      p.q.set(i * c.d + static_cast<std::int64_t>(e), u[e] + noise[e] - along / norm2 * u[e]);
  }
  for (std::int64_t j = 0; j < c.sk; ++j)
    for (std::int64_t e = 0; e < c.d; ++e) p.k.set(j * c.d + e, j == j0 ? beta * u[static_cast<std::size_t>(e)] : 0.1 * nd(rng));

  const auto o = p.options();
  flashtile::forward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.lse.view(), o);
  flashtile::backward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.dout.view(), p.lse.view(), p.dq.view(),
                      p.dk.view(), p.dv.view(), o);
  const Results ref = oracle(p, true);
  const Results st = standard_attention(p, true);

  // The case is the one described: the dominant key's probability, e^(s_ij0 − LSE_i), near 0.99 in every row.
  const auto q = p.q.to_double(), k = p.k.to_double();
  for (std::int64_t i = 0; i < c.sq; ++i) {
    double s = 0.0;
    for (std::int64_t e = 0; e < c.d; ++e) s += q[static_cast<std::size_t>(i * c.d + e)] * k[static_cast<std::size_t>(j0 * c.d + e)];
    const double pd = std::exp(scale * s - ref.lse[static_cast<std::size_t>(i)]);
    ASSERT_GT(pd, 0.95) << "row " << i;
    ASSERT_LT(pd, 0.999) << "row " << i;
  }
  const double mag = std::max({max_abs(ref.dq), max_abs(ref.dk), max_abs(ref.dv)});
  expect_close("dv", p.dv.to_double(), st.dv, ref.dv, c.dtype, mag);
  // dQ and dK go through dS = P ∘ (dP − D), which cancels for the dominant key (dP_ij0 ≈ D_i when p ≈ 1) and
  // so magnifies the rounding of O and dP about 100-fold in both implementations; every row shares the dominant
  // key, so those errors add coherently over rows into dK_j0. The tight floor is no bound there (FlashTile's dK
  // error reached 0.67 of it in 150 seeds, 4x standard attention's in that run): they get the sweep's allowance.
  const double sweep_mag = backward_magnitude(ref);
  expect_close("dq", p.dq.to_double(), st.dq, ref.dq, c.dtype, sweep_mag);
  expect_close("dk", p.dk.to_double(), st.dk, ref.dk, c.dtype, sweep_mag);
  expect_close("out", p.out.to_double(), st.out, ref.out, c.dtype, 0.0, st.out_score_sensitivity);
  expect_close("lse", p.lse.to_double(), st.lse, ref.lse, c.dtype);
}

}  // namespace
}  // namespace ft_test
