// The CUDA backend under test (device.h: gpu_backend()) forward and backward against the float64 oracle over the CPU tests' shape sweep (fp16 and bf16;
// the sweep's float32 cases run as fp16/bf16 here), with the same tolerance rule: twice the error of
// standard attention in the same precision. Inputs are fresh random data per run; every output starts as NaN.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "cases.h"
#include "device.h"
#include "support.h"

namespace ft_gpu {
namespace {

using ft_test::Case;
using ft_test::DType;

std::vector<Case> gpu_cases() {
  std::vector<Case> out;
  int i = 0;
  for (Case c : ft_test::sweep_cases()) {
    if (c.dtype == DType::float32) c.dtype = (i % 2 == 0) ? DType::bfloat16 : DType::float16;
    ++i;
    out.push_back(c);
  }
  // Every head-dim bucket in both dtypes at a size that spans several query and key blocks.
  for (std::int64_t d : {32, 64, 96, 128, 160, 192, 224, 256}) {
    for (DType t : {DType::float16, DType::bfloat16}) {
      Case c;
      c.b = 2;
      c.sq = 257;
      c.sk = 300;
      c.hq = 4;
      c.hkv = 2;
      c.d = c.dv = d;
      c.dtype = t;
      c.causal = (d / 32 + (t == DType::float16)) % 2 == 0;
      c.layout = ft_test::Layout::heads_major;
      out.push_back(c);
    }
  }
  return out;
}

class GpuForward : public ::testing::TestWithParam<Case> {};
class GpuBackward : public ::testing::TestWithParam<Case> {};

TEST_P(GpuForward, MatchesReference) {
  FT_REQUIRE_GPU();
  auto rng = ft_test::test_rng();
  ft_test::Problem p(GetParam(), rng);
  DevProblem d(p);
  if (const std::string why = refusal(d, p.c); !why.empty()) GTEST_SKIP() << why;
  const auto report = flashtile::forward(d.q.view(), d.k.view(), d.v.view(), d.out.view(), d.lse.view(),
                                         cuda_options(p.c));
  FT_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(report.ran.backend, gpu_backend());
  d.out.download(p.out);
  d.lse.download(p.lse);
  const ft_test::Results ref = ft_test::oracle(p, false);
  const ft_test::Results std_attn = ft_test::standard_attention(p, false);
  ft_test::expect_close("out", p.out.to_double(), std_attn.out, ref.out, p.c.dtype, 0.0, std_attn.out_score_sensitivity);
  ft_test::expect_close("lse", p.lse.to_double(), std_attn.lse, ref.lse, p.c.dtype);
}

TEST_P(GpuBackward, MatchesReference) {
  FT_REQUIRE_GPU();
  auto rng = ft_test::test_rng();
  ft_test::Problem p(GetParam(), rng);
  DevProblem d(p);
  if (const std::string why = refusal(d, p.c); !why.empty()) GTEST_SKIP() << why;
  flashtile::forward(d.q.view(), d.k.view(), d.v.view(), d.out.view(), d.lse.view(), cuda_options(p.c));
  const auto report = flashtile::backward(d.q.view(), d.k.view(), d.v.view(), d.out.view(), d.dout.view(),
                                          d.lse.view(), d.dq.view(), d.dk.view(), d.dv.view(), cuda_options_bwd(p.c));
  FT_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(report.ran.backend, gpu_backend());
  d.dq.download(p.dq);
  d.dk.download(p.dk);
  d.dv.download(p.dv);
  const ft_test::Results ref = ft_test::oracle(p, true);
  const ft_test::Results std_attn = ft_test::standard_attention(p, true);
  const double mag = std::max({ft_test::max_abs(ref.dq), ft_test::max_abs(ref.dk), ft_test::max_abs(ref.dv)});
  ft_test::expect_close("dq", p.dq.to_double(), std_attn.dq, ref.dq, p.c.dtype, mag);
  ft_test::expect_close("dk", p.dk.to_double(), std_attn.dk, ref.dk, p.c.dtype, mag);
  ft_test::expect_close("dv", p.dv.to_double(), std_attn.dv, ref.dv, p.c.dtype, mag);

  // Deterministic mode: same gradients within tolerance, and bitwise identical on a second run (on the backend
  // that runs it: a subset build may lack its kernel).
  if (const std::string why = refusal_bwd(d, p.c, true); !why.empty()) GTEST_SKIP() << "deterministic: " << why;
  const auto od = cuda_options_bwd(p.c, true);
  d.poison_grads(p);
  flashtile::backward(d.q.view(), d.k.view(), d.v.view(), d.out.view(), d.dout.view(), d.lse.view(), d.dq.view(),
                      d.dk.view(), d.dv.view(), od);
  FT_CUDA_OK(cudaDeviceSynchronize());
  d.dq.download(p.dq);
  d.dk.download(p.dk);
  d.dv.download(p.dv);
  const auto dq1 = p.dq.to_double(), dk1 = p.dk.to_double(), dv1 = p.dv.to_double();
  ft_test::expect_close("dq (deterministic)", dq1, std_attn.dq, ref.dq, p.c.dtype, mag);
  d.poison_grads(p);
  flashtile::backward(d.q.view(), d.k.view(), d.v.view(), d.out.view(), d.dout.view(), d.lse.view(), d.dq.view(),
                      d.dk.view(), d.dv.view(), od);
  FT_CUDA_OK(cudaDeviceSynchronize());
  d.dq.download(p.dq);
  d.dk.download(p.dk);
  d.dv.download(p.dv);
  EXPECT_TRUE(p.dq.to_double() == dq1) << "deterministic dq differs between runs";
  EXPECT_TRUE(p.dk.to_double() == dk1) << "deterministic dk differs between runs";
  EXPECT_TRUE(p.dv.to_double() == dv1) << "deterministic dv differs between runs";
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) { return info.param.name(); }

INSTANTIATE_TEST_SUITE_P(Sweep, GpuForward, ::testing::ValuesIn(gpu_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Sweep, GpuBackward, ::testing::ValuesIn(gpu_cases()), case_name);

// Small shapes for compute-sanitizer (memcheck, racecheck): tails, GQA, causal with Sq != Sk both ways.
std::vector<Case> small_cases() {
  std::vector<Case> out;
  const std::int64_t lens[][2] = {{17, 65}, {65, 17}, {130, 130}};
  int n = 0;
  for (const auto& l : lens) {
    for (std::int64_t d : {64, 136, 256}) {
      Case c;
      c.sq = l[0];
      c.sk = l[1];
      c.hq = 4;
      c.hkv = 2;
      c.d = c.dv = d;
      c.causal = n % 2 == 0;
      c.dtype = n % 3 == 0 ? DType::float16 : DType::bfloat16;
      c.layout = n % 2 ? ft_test::Layout::padded : ft_test::Layout::contiguous;
      ++n;
      out.push_back(c);
    }
  }
  return out;
}
INSTANTIATE_TEST_SUITE_P(Small, GpuForward, ::testing::ValuesIn(small_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Small, GpuBackward, ::testing::ValuesIn(small_cases()), case_name);

}  // namespace
}  // namespace ft_gpu
