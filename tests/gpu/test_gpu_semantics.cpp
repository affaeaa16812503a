// The non-finite semantics on the CUDA backend (docs/semantics.md, the same definition the CPU backends and the
// oracle follow): a query row whose visible scores are all -inf gets O = 0, LSE = -inf and zero gradients, and
// adds nothing to dK and dV; a NaN or +inf score makes that row's O and LSE NaN; every other row is unaffected.
//
// Each test poisons one query row of a random problem and compares the other rows with the float64 oracle of the
// clean problem (whose dout is zero on the poisoned row, so that its gradients leave that row out), with the
// suite's tolerance (ft_test::expect_close: tied to standard attention in the same precision).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "device.h"
#include "support.h"

namespace ft_gpu {
namespace {

using ft_test::Case;
using ft_test::DType;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Case semantics_case(DType dtype, bool causal) {
  Case c;
  c.b = 2;
  c.sq = 70;
  c.sk = 90;
  c.hq = 4;
  c.hkv = 2;
  c.d = c.dv = 64;
  c.dtype = dtype;
  c.causal = causal;
  return c;
}

// The poisoned row: batch 0, query 40 (it sees keys in causal mode too), head 0.
constexpr std::int64_t kRow = 40;

std::int64_t q_flat(const Case& c, std::int64_t s, std::int64_t d) { return (s * c.hq + 0) * c.d + d; }

// Keys strictly positive, so that q = ±inf gives a score of exactly ±inf (no inf - inf).
void make_keys_positive(ft_test::Problem& p) {
  for (std::int64_t i = 0; i < p.k.numel(); ++i) p.k.set(i, std::fabs(p.k.get(i)) + 0.125);
}

// Elements of a row-major [B, S, H, X] vector (X = last dim) outside (b = 0, s = row, h = 0).
std::vector<double> without_row(const std::vector<double>& x, const Case& c, std::int64_t seqlen, std::int64_t heads,
                                std::int64_t row) {
  const std::int64_t width = static_cast<std::int64_t>(x.size()) / (c.b * seqlen * heads);
  std::vector<double> r;
  r.reserve(x.size());
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(x.size()); ++i) {
    const std::int64_t h = (i / width) % heads, s = (i / width / heads) % seqlen, b = i / width / heads / seqlen;
    if (!(b == 0 && s == row && h == 0)) r.push_back(x[static_cast<std::size_t>(i)]);
  }
  return r;
}

// The elements of (b = 0, s = row, h = 0) of a row-major [B, S, H, width] vector.
std::vector<double> row_of(const std::vector<double>& x, std::int64_t heads, std::int64_t row, std::int64_t width) {
  const auto start = static_cast<std::ptrdiff_t>(row * heads * width);
  return {x.begin() + start, x.begin() + start + width};
}

// Batch b's part of a row-major vector with `batches` equal parts.
std::vector<double> batch_of(const std::vector<double>& x, std::int64_t batches, std::int64_t b) {
  const auto n = static_cast<std::ptrdiff_t>(x.size()) / batches;
  return {x.begin() + b * n, x.begin() + (b + 1) * n};
}

// Forward and backward of p on the GPU (strict, the backend under test); results in logical order.
ft_test::Results run_gpu(ft_test::Problem& p) {
  DevProblem d(p);
  flashtile::forward(d.q.view(), d.k.view(), d.v.view(), d.out.view(), d.lse.view(), cuda_options(p.c));
  flashtile::backward(d.q.view(), d.k.view(), d.v.view(), d.out.view(), d.dout.view(), d.lse.view(), d.dq.view(),
                      d.dk.view(), d.dv.view(), cuda_options_bwd(p.c));
  if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("cudaDeviceSynchronize failed");
  d.out.download(p.out);
  d.lse.download(p.lse);
  d.dq.download(p.dq);
  d.dk.download(p.dk);
  d.dv.download(p.dv);
  return {p.out.to_double(), p.lse.to_double(), p.dq.to_double(), p.dk.to_double(), p.dv.to_double()};
}

class GpuSemantics : public ::testing::TestWithParam<std::tuple<DType, bool>> {};

// A query row of -inf against positive keys: every visible score is -inf.
TEST_P(GpuSemantics, AllScoresMinusInfRowIsEmpty) {
  FT_REQUIRE_GPU();
  const auto [dtype, causal] = GetParam();
  auto rng = ft_test::test_rng();
  ft_test::Problem p(semantics_case(dtype, causal), rng);
  const Case& c = p.c;
  make_keys_positive(p);
  for (std::int64_t i = 0; i < c.dv; ++i) p.dout.set(kRow * c.hq * c.dv + i, 0.0);  // dout (0, kRow, 0, :)
  {
    DevProblem probe(p);
    if (const std::string why = refusal(probe, c); !why.empty()) GTEST_SKIP() << why;
  }
  const ft_test::Results ref = ft_test::oracle(p, true), standard = ft_test::standard_attention(p, true);
  for (std::int64_t i = 0; i < c.d; ++i) p.q.set(q_flat(c, kRow, i), -kInf);
  const ft_test::Results got = run_gpu(p);

  for (double x : row_of(got.out, c.hq, kRow, c.dv)) EXPECT_EQ(x, 0.0);
  EXPECT_EQ(got.lse[static_cast<std::size_t>(kRow)], -kInf);  // lse [B, Hq, Sq]: (0, 0, kRow)
  for (double x : row_of(got.dq, c.hq, kRow, c.d)) EXPECT_EQ(x, 0.0);

  ft_test::expect_close("out (other rows)", without_row(got.out, c, c.sq, c.hq, kRow),
                        without_row(standard.out, c, c.sq, c.hq, kRow), without_row(ref.out, c, c.sq, c.hq, kRow), dtype);
  const double mag = ft_test::backward_magnitude(ref);
  ft_test::expect_close("dq (other rows)", without_row(got.dq, c, c.sq, c.hq, kRow),
                        without_row(standard.dq, c, c.sq, c.hq, kRow), without_row(ref.dq, c, c.sq, c.hq, kRow), dtype, mag);
  // dK of the poisoned row's KV head: its dS = 0 meets q = -inf in dS·Q, which IEEE makes NaN (docs/semantics.md).
  ft_test::expect_close("dk (batch 1)", batch_of(got.dk, c.b, 1), batch_of(standard.dk, c.b, 1), batch_of(ref.dk, c.b, 1), dtype, mag);
  ft_test::expect_close("dv", got.dv, standard.dv, ref.dv, dtype, mag);
}

// A NaN in one query row (every score of the row NaN), or +inf against positive keys (scores +inf): that row's O
// and LSE are NaN; the other rows' forward results are untouched.
TEST_P(GpuSemantics, NanOrPlusInfScoreRowIsNan) {
  FT_REQUIRE_GPU();
  const auto [dtype, causal] = GetParam();
  for (const double poison : {kNaN, kInf}) {
    auto rng = ft_test::test_rng();
    ft_test::Problem p(semantics_case(dtype, causal), rng);
    const Case& c = p.c;
    make_keys_positive(p);
    {
      DevProblem probe(p);
      if (const std::string why = refusal(probe, c); !why.empty()) GTEST_SKIP() << why;
    }
    const ft_test::Results ref = ft_test::oracle(p, false), standard = ft_test::standard_attention(p, false);
    for (std::int64_t i = 0; i < c.d; ++i) p.q.set(q_flat(c, kRow, i), poison);
    const ft_test::Results got = run_gpu(p);
    for (double x : row_of(got.out, c.hq, kRow, c.dv)) EXPECT_TRUE(std::isnan(x)) << "poison " << poison;
    EXPECT_TRUE(std::isnan(got.lse[static_cast<std::size_t>(kRow)])) << "poison " << poison;
    for (double x : row_of(got.dq, c.hq, kRow, c.d)) EXPECT_TRUE(std::isnan(x)) << "poison " << poison;
    ft_test::expect_close("out (other rows)", without_row(got.out, c, c.sq, c.hq, kRow),
                          without_row(standard.out, c, c.sq, c.hq, kRow), without_row(ref.out, c, c.sq, c.hq, kRow), dtype);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuSemantics,
                         ::testing::Combine(::testing::Values(DType::bfloat16, DType::float16), ::testing::Bool()),
                         [](const auto& param_info) {
                           return std::string(flashtile::dtype_name(std::get<0>(param_info.param))) +
                                  (std::get<1>(param_info.param) ? "_causal" : "_full");
                         });

}  // namespace
}  // namespace ft_gpu
