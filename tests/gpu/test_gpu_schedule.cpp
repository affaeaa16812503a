// The forward's tile order does not change its result. The cuda-sm90 forward deals a causal call's tiles in L2
// sections of (head, sequence) pairs once there are more pairs than a section holds (common/scheduler.h); the
// suite's other shapes have too few pairs for that. Each tile is computed the same whatever CTA takes it and
// whenever, so the batched call (sections on) must give bitwise the outputs of one call per sequence (8 pairs:
// the plain length order). A tile dealt twice or never would show as a difference or as the NaN poison.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "device.h"
#include "support.h"

namespace ft_gpu {
namespace {

using ft_test::Case;
using ft_test::DType;

// The view of sequence `b` of a batch-major view.
flashtile::TensorView sequence(flashtile::TensorView v, std::int64_t b) {
  v.data = static_cast<char*>(v.data) + b * v.stride[0] * static_cast<std::int64_t>(flashtile::dtype_size(v.dtype));
  v.shape[0] = 1;
  return v;
}

// 12 sequences x 8 heads = 96 pairs, causal: at 384 tokens the 128-row kernels (hdim 128, 256) take sections of 88.
Case batched_causal(std::int64_t d) {
  Case c;
  c.b = 12;
  c.sq = c.sk = 384;
  c.hq = 8;
  c.hkv = 2;
  c.d = c.dv = d;
  c.dtype = DType::bfloat16;
  c.causal = true;
  return c;
}

class GpuSchedule : public ::testing::TestWithParam<std::int64_t> {};

TEST_P(GpuSchedule, BatchedCausalForwardEqualsOneCallPerSequence) {
  FT_REQUIRE_GPU();
  const Case c = batched_causal(GetParam());
  auto rng = ft_test::test_rng();
  ft_test::Problem p(c, rng);
  DevProblem d(p);
  const std::string why = refusal(d, c);
  if (!why.empty()) GTEST_SKIP() << why;
  const flashtile::DispatchReport batched =
      flashtile::forward(d.q.view(), d.k.view(), d.v.view(), d.out.view(), d.lse.view(), cuda_options(c));
  if (gpu_backend() == "cuda-sm90") {
    EXPECT_NE(batched.to_string().find("L2 sections"), std::string::npos) << batched.to_string();
  }
  FT_CUDA_OK(cudaDeviceSynchronize());
  d.out.download(p.out);
  d.lse.download(p.lse);
  const std::vector<double> out_all = p.out.to_double(), lse_all = p.lse.to_double();

  DevTensor out1(DevProblem::poisoned(p.out)), lse1(DevProblem::poisoned(p.lse));
  for (std::int64_t b = 0; b < c.b; ++b) {
    const flashtile::DispatchReport one =
        flashtile::forward(sequence(d.q.view(), b), sequence(d.k.view(), b), sequence(d.v.view(), b),
                           sequence(out1.view(), b), sequence(lse1.view(), b), cuda_options(c));
    EXPECT_EQ(one.to_string().find("L2 sections"), std::string::npos) << one.to_string();
  }
  FT_CUDA_OK(cudaDeviceSynchronize());
  out1.download(p.out);
  lse1.download(p.lse);
  const std::vector<double> out_seq = p.out.to_double(), lse_seq = p.lse.to_double();
  ASSERT_EQ(out_all.size(), out_seq.size());
  std::int64_t differ = 0, nan = 0;
  for (std::size_t i = 0; i < out_all.size(); ++i) {
    nan += std::isnan(out_all[i]) ? 1 : 0;
    differ += std::memcmp(&out_all[i], &out_seq[i], sizeof(double)) != 0 ? 1 : 0;
  }
  for (std::size_t i = 0; i < lse_all.size(); ++i) {
    nan += std::isnan(lse_all[i]) ? 1 : 0;
    differ += std::memcmp(&lse_all[i], &lse_seq[i], sizeof(double)) != 0 ? 1 : 0;
  }
  EXPECT_EQ(nan, 0) << "elements left unwritten (the NaN poison) by the batched call";
  EXPECT_EQ(differ, 0) << "elements of O and LSE that differ between the batched call and one call per sequence";
}

INSTANTIATE_TEST_SUITE_P(Hdims, GpuSchedule, ::testing::Values(128, 256),
                         [](const ::testing::TestParamInfo<std::int64_t>& i) { return std::to_string(i.param); });

// Options::sm_margin: cuda-sm90's persistent forward on fewer SMs deals the same tiles to fewer CTAs (here 5: each
// walks ~20 tiles, where the full grid gives most one or two), so its O and LSE are bitwise those of the full grid,
// and the report says how many SMs it took. cuda-sm80 launches a CTA per tile and says the margin changes nothing
// there. A margin of every SM is refused, naming the argument and the SM count.
TEST(GpuSmMargin, ForwardOnFewerSmsEqualsTheFullGrid) {
  FT_REQUIRE_GPU();
  const Case c = batched_causal(128);
  auto rng = ft_test::test_rng();
  ft_test::Problem p(c, rng);
  DevProblem d(p);
  const std::string why = refusal(d, c);
  if (!why.empty()) GTEST_SKIP() << why;
  int dev = 0, sms = 0;
  FT_CUDA_OK(cudaGetDevice(&dev));
  FT_CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  ASSERT_GT(sms, 5);
  std::vector<double> want_out, want_lse;
  for (int margin : {0, sms / 2, sms - 5}) {
    SCOPED_TRACE("sm_margin " + std::to_string(margin));
    DevTensor out(DevProblem::poisoned(p.out)), lse(DevProblem::poisoned(p.lse));
    flashtile::Options o = cuda_options(c);
    o.sm_margin = margin;
    const flashtile::DispatchReport r =
        flashtile::forward(d.q.view(), d.k.view(), d.v.view(), out.view(), lse.view(), o);
    FT_CUDA_OK(cudaDeviceSynchronize());
    const std::string text = r.to_string();
    if (margin > 0) {
      const std::string said = gpu_backend() == "cuda-sm90"
                                   ? "on " + std::to_string(sms - margin) + " of " + std::to_string(sms) + " SMs"
                                   : "sm_margin: no effect";
      EXPECT_NE(text.find(said), std::string::npos) << text;
    }
    out.download(p.out);
    lse.download(p.lse);
    const std::vector<double> got_out = p.out.to_double(), got_lse = p.lse.to_double();
    EXPECT_EQ(std::count_if(got_out.begin(), got_out.end(), [](double x) { return std::isnan(x); }), 0);
    if (margin == 0) {
      want_out = got_out;
      want_lse = got_lse;
      continue;
    }
    EXPECT_EQ(std::memcmp(got_out.data(), want_out.data(), got_out.size() * sizeof(double)), 0);
    EXPECT_EQ(std::memcmp(got_lse.data(), want_lse.data(), got_lse.size() * sizeof(double)), 0);
  }
  flashtile::Options all = cuda_options(c);
  all.sm_margin = sms;
  try {
    flashtile::forward(d.q.view(), d.k.view(), d.v.view(), d.out.view(), d.lse.view(), all);
    ADD_FAILURE() << "sm_margin = every SM was not refused";
  } catch (const flashtile::Error& e) {
    EXPECT_NE(std::string(e.what()).find("sm_margin = " + std::to_string(sms)), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ft_gpu
