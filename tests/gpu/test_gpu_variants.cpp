// The CUDA backend under test (device.h: gpu_backend()) on the variants of issue 12 (varlen, sliding window, softcap, ALiBi, sinks, and their combinations)
// against the cpu-reference backend (float64) through the public API: the same Options on float32 host copies of
// the GPU's inputs (exact: the inputs are rounded to the dtype first). Tolerance: the suite's rule
// (ft_test::expect_close), with a standard attention in the test's precision written out densely from the
// semantics (variant_problem.h: it shares no code with core/mask.h or core/score.h). Forward (out, lse) and
// backward (dq, dk, dv, dsinks), fp16 and bf16, hdim 64 and 128; deterministic mode must give bitwise equal
// gradients twice.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "device.h"
#include "support.h"
#include "variant_problem.h"

namespace ft_gpu {
namespace {

std::vector<VCase> variant_cases() {
  std::vector<VCase> v;
  auto add = [&v](VCase c) { v.push_back(std::move(c)); };
  {  // the training combination: packed sequences, causal sliding window, GQA, softcap
    VCase c;
    c.name = "VarlenCausalWindowGqaSoftcap";
    c.lens_q = c.lens_k = {37, 130, 0, 211, 1};
    c.varlen = true;
    c.hq = 8;
    c.hkv = 2;
    c.causal = true;
    c.left = 48;
    c.softcap = 1.5f;
    add(c);
  }
  {  // ALiBi (per sequence and head) with a two-sided window
    VCase c;
    c.name = "AlibiWindow";
    c.lens_q = c.lens_k = {200, 200};
    c.left = 64;
    c.right = 16;
    c.alibi = 2;
    add(c);
  }
  {  // sinks with a causal mask
    VCase c;
    c.name = "SinksCausal";
    c.lens_q = c.lens_k = {150, 150};
    c.causal = true;
    c.sinks = true;
    add(c);
  }
  {  // Sq > Sk causal: the first Sq - Sk rows see nothing (O = 0, LSE = -inf), whole query blocks included
    VCase c;
    c.name = "SqGreaterSkCausal";
    c.lens_q = {260, 260};
    c.lens_k = {70, 70};
    c.causal = true;
    add(c);
  }
  {  // the same rows with a sink: O = 0, LSE = sink, and they contribute to dsinks
    VCase c;
    c.name = "SqGreaterSkCausalSinks";
    c.lens_q = {260};
    c.lens_k = {70};
    c.causal = true;
    c.sinks = true;
    c.hq = 2;
    c.hkv = 1;
    add(c);
  }
  {  // a window that leaves rows empty (their window lies before key 0) and skips whole key tiles
    VCase c;
    c.name = "WindowEmptyRows";
    c.lens_q = {260};
    c.lens_k = {300};
    c.left = 8;
    c.right = 4;
    add(c);
  }
  {  // empty sequences inside a varlen batch: no queries, no keys, neither; Sq != Sk per sequence; ALiBi [Hq]
    VCase c;
    c.name = "VarlenEmptySequencesAlibi";
    c.lens_q = {0, 64, 0, 129, 17};
    c.lens_k = {50, 0, 0, 300, 17};
    c.varlen = true;
    c.alibi = 1;
    add(c);
  }
  {  // varlen, no mask and no hook: the plain kernels on packed sequences
    VCase c;
    c.name = "VarlenPlain";
    c.lens_q = {100, 257, 1};
    c.lens_k = {130, 64, 300};
    c.varlen = true;
    add(c);
  }
  {  // varlen causal with sinks and Sq != Sk per sequence
    VCase c;
    c.name = "VarlenCausalSinks";
    c.lens_q = {90, 3, 200};
    c.lens_k = {120, 80, 150};
    c.varlen = true;
    c.causal = true;
    c.sinks = true;
    add(c);
  }
  {  // a right-bounded window only (left unbounded), not causal
    VCase c;
    c.name = "WindowRightOnly";
    c.lens_q = c.lens_k = {190, 190};
    c.right = 8;
    add(c);
  }
  {  // softcap alone (the hook kernels without a mask), MQA
    VCase c;
    c.name = "SoftcapMqa";
    c.lens_q = {140, 140};
    c.lens_k = {333, 333};
    c.hq = 4;
    c.hkv = 1;
    c.softcap = 2.0f;
    add(c);
  }
  {  // seqused_k (the KV-cache form) on a padded batch with a causal mask: keys past the used ones are ignored
    VCase c;
    c.name = "SequsedKCausal";
    c.lens_q = {64, 64, 64};
    c.lens_k = {200, 200, 200};
    c.used_k = {150, 37, 0};
    c.causal = true;
    add(c);
  }
  {  // seqused_k with packed sequences and sinks
    VCase c;
    c.name = "VarlenSequsedKSinks";
    c.lens_q = {40, 100};
    c.lens_k = {90, 260};
    c.used_k = {90, 130};
    c.varlen = true;
    c.sinks = true;
    add(c);
  }
  {  // everything at once
    VCase c;
    c.name = "VarlenAll";
    c.lens_q = {70, 0, 180};
    c.lens_k = {90, 40, 160};
    c.varlen = true;
    c.causal = true;
    c.left = 33;
    c.softcap = 1.5f;
    c.alibi = 2;
    c.sinks = true;
    add(c);
  }
  std::vector<VCase> out;
  for (const VCase& base : v)
    for (DType t : {DType::bfloat16, DType::float16})
      for (std::int64_t d : {64, 128}) {
        VCase c = base;
        c.dtype = t;
        c.d = d;
        c.name += std::string("_") + (t == DType::float16 ? "fp16" : "bf16") + "_d" + std::to_string(d);
        out.push_back(c);
      }
  return out;
}

class GpuVariants : public ::testing::TestWithParam<VCase> {};

TEST_P(GpuVariants, MatchesReference) {
  FT_REQUIRE_GPU();
  const VCase& c = GetParam();
  if ((c.varlen || !c.used_k.empty()) && !kHasInt32<DType>)
    GTEST_SKIP() << "DType::int32 (cu_seqlens, seqused_k) is not in this build yet";
  auto rng = ft_test::test_rng();
  const Host p = make_host(c, rng);

  Call gpu(p, flashtile::Device::cuda, c.dtype, gpu_backend());
  // A subset build (FLASHTILE_CUDA_KERNELS) may lack this dtype / head dim: that is a skip, anything else runs.
  try {
    const auto r = flashtile::explain_forward(gpu.q->view(), gpu.k->view(), gpu.v->view(), gpu.out->view(),
                                              gpu.lse->view(), gpu.o);
    if (r.ran.backend.empty() && r.to_string().find("kernel not built") != std::string::npos)
      GTEST_SKIP() << r.to_string();
  } catch (const flashtile::Error&) {
    // the real call below reports it
  }
  const auto fwd = gpu.forward();
  EXPECT_EQ(fwd.ran.backend, gpu_backend());
  EXPECT_NE(fwd.ran.kernel.find(expected_variant(c)), std::string::npos) << fwd.ran.kernel;
  // A forward-only subset build (e.g. FLASHTILE_CUDA_KERNELS=sm90_fwd_bf16_hdim128) checks the forward, then skips.
  std::string bwd_missing;
  {
    const auto r = flashtile::explain_backward(gpu.q->view(), gpu.k->view(), gpu.v->view(), gpu.out->view(),
                                               gpu.dout->view(), gpu.lse->view(), gpu.dq->view(), gpu.dk->view(),
                                               gpu.dv->view(), gpu.o);
    if (r.ran.backend.empty() && r.to_string().find("kernel not built") != std::string::npos) bwd_missing = r.to_string();
  }
  if (bwd_missing.empty()) {
    const auto bwd = gpu.backward(false);
    EXPECT_NE(bwd.ran.kernel.find(expected_variant(c)), std::string::npos) << bwd.ran.kernel;
  }
  FT_CUDA_OK(cudaDeviceSynchronize());
  const Out got = gpu.results();

  Call ref_call(p, flashtile::Device::cpu, DType::float32, "cpu-reference");
  ref_call.forward();
  ref_call.backward(false);
  const Out ref = ref_call.results();
  const Out std_attn = standard_attention(p);

  const DType t = c.dtype;
  ft_test::expect_close("out", got.out, std_attn.out, ref.out, t);
  ft_test::expect_close("lse", got.lse, std_attn.lse, ref.lse, t, lse_magnitude(p));
  if (!bwd_missing.empty()) GTEST_SKIP() << "forward checked; backward: " << bwd_missing;
  const double mag = std::max({ft_test::max_abs(ref.dq), ft_test::max_abs(ref.dk), ft_test::max_abs(ref.dv)});
  ft_test::expect_close("dq", got.dq, std_attn.dq, ref.dq, t, mag);
  ft_test::expect_close("dk", got.dk, std_attn.dk, ref.dk, t, mag);
  ft_test::expect_close("dv", got.dv, std_attn.dv, ref.dv, t, mag);
  if (c.sinks) ft_test::expect_close("dsinks", got.dsinks, std_attn.dsinks, ref.dsinks, t, dsink_magnitude(p, ref));

  // Deterministic mode: within tolerance, and bitwise equal on a second run (dsinks included).
  std::vector<std::vector<unsigned char>> first;
  for (int run = 0; run < 2; ++run) {
    Call det(p, flashtile::Device::cuda, c.dtype, gpu_backend());
    det.forward();
    det.backward(true);
    FT_CUDA_OK(cudaDeviceSynchronize());
    std::vector<std::vector<unsigned char>> now{det.dq->bytes(), det.dk->bytes(), det.dv->bytes()};
    if (det.dsinks) now.push_back(det.dsinks->bytes());
    if (run == 0) {
      const Out d = det.results();
      ft_test::expect_close("dq (deterministic)", d.dq, std_attn.dq, ref.dq, t, mag);
      first = now;
    } else {
      EXPECT_TRUE(now == first) << "deterministic gradients differ between runs";
    }
  }
}

std::string case_name(const ::testing::TestParamInfo<VCase>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(Variants, GpuVariants, ::testing::ValuesIn(variant_cases()), case_name);

}  // namespace
}  // namespace ft_gpu
