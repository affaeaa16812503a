// The dispatch report: what ran, why others were refused, strict mode, explain().
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "support.h"

namespace ft_test {
namespace {

Problem small(std::mt19937_64& rng, DType dtype = DType::float32) {
  Case c;
  c.sq = 9;
  c.sk = 12;
  c.d = c.dv = 16;
  c.dtype = dtype;
  return Problem(c, rng);
}

// The forward kernel FLASHTILE_CPU_FORWARD forces (the test script runs the suite under tiles and decode), or ""
// when the automatic rule decides (decode_plan.h forward_on_decode).
std::string forced_forward_kernel() {
  const char* v = std::getenv("FLASHTILE_CPU_FORWARD");
  return v == nullptr ? "" : v;
}

TEST(Dispatch, AutoRunsCpuFlashAndSaysSo) {
  auto rng = test_rng();
  Case c = small(rng).c;
  c.sq = 70;  // more query rows than one decode tile: the tiled forward kernel
  Problem p(c, rng);
  const auto r = flashtile::forward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.lse.view(), p.options());
  const std::string kernel = forced_forward_kernel() == "decode" ? "cpu_flash_decode" : "cpu_flash_fwd";
  EXPECT_EQ(r.ran.backend, "cpu-flash");
  EXPECT_EQ(r.ran.kernel, kernel);
  EXPECT_FALSE(r.ran.isa.empty());
  EXPECT_GT(r.ran.block_q, 0);
  EXPECT_GT(r.ran.block_k, 0);
  EXPECT_GE(r.ran.threads, 1);
  EXPECT_FALSE(r.fell_back);
  // The oracle is listed with its reason, so the report accounts for every backend.
  bool listed = false;
  for (const auto& ref : r.refused) listed = listed || ref.backend == "cpu-reference";
  EXPECT_TRUE(listed) << r.to_string();
  EXPECT_EQ(flashtile::last_dispatch().ran.kernel, kernel);
  EXPECT_NE(r.to_string().find("cpu-flash"), std::string::npos);
}

// A forward with few query rows per KV head runs on the decode kernel, and the report says why; one whose rows do
// not fit a decode tile, a varlen batch and a backward keep their kernels. An unknown FLASHTILE_CPU_FORWARD is
// refused by name.
TEST(Dispatch, FewQueryRowsPerKvHeadRunOnTheDecodeKernel) {
  if (!forced_forward_kernel().empty()) GTEST_SKIP() << "FLASHTILE_CPU_FORWARD overrides the rule";
  auto rng = test_rng();
  Case c;
  c.sq = 3;
  c.sk = 700;
  c.hq = 8;
  c.hkv = 2;  // G·Sq = 12 rows per KV head
  c.d = c.dv = 32;
  c.causal = true;
  Problem p(c, rng);
  const auto r = flashtile::forward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.lse.view(), p.options());
  EXPECT_EQ(r.ran.kernel, "cpu_flash_decode");
  EXPECT_GE(r.ran.splits, 1);
  EXPECT_NE(r.ran.detail.find("12 query rows per KV head fit one decode tile"), std::string::npos) << r.ran.detail;
  const auto back = flashtile::backward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.dout.view(),
                                        p.lse.view(), p.dq.view(), p.dk.view(), p.dv.view(), p.options());
  EXPECT_EQ(back.ran.kernel, "cpu_flash_bwd");
  compare_with_oracle(p);

  c.sq = 40;  // 160 rows per KV head
  Problem wide(c, rng);
  EXPECT_EQ(flashtile::forward(wide.q.view(), wide.k.view(), wide.v.view(), wide.out.view(), wide.lse.view(),
                               wide.options())
                .ran.kernel,
            "cpu_flash_fwd");

  // Without GQA, 16 float32 rows: the tiled forward below 4096 keys, this kernel from there (decode_plan.h
  // kMatrixKeysWithoutGqa).
  Case mha = c;
  mha.sq = 16;
  mha.hq = mha.hkv = 1;
  for (const std::int64_t sk : {std::int64_t{700}, std::int64_t{4096}}) {
    mha.sk = sk;
    Problem m(mha, rng);
    EXPECT_EQ(flashtile::forward(m.q.view(), m.k.view(), m.v.view(), m.out.view(), m.lse.view(), m.options())
                  .ran.kernel,
              sk < 4096 ? "cpu_flash_fwd" : "cpu_flash_decode")
        << sk;
  }

  ::setenv("FLASHTILE_CPU_FORWARD", "fast", 1);
  EXPECT_THROW(
      {
        try {
          flashtile::forward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.lse.view(), p.options("cpu-flash"));
        } catch (const flashtile::Error& e) {
          EXPECT_NE(std::string(e.what()).find("FLASHTILE_CPU_FORWARD=fast"), std::string::npos) << e.what();
          throw;
        }
      },
      flashtile::Error);
  ::unsetenv("FLASHTILE_CPU_FORWARD");
}

// Keys too few to split across the threads: the decode kernel splits the row tile's heads instead, so 8 heads of
// one query row over 300 keys are 4 tasks for 2 threads, not one task on one thread; the result (and the
// backward's, which needs the forward's LSE) still matches.
TEST(Dispatch, ShortKeysSplitTheHeadsAcrossThreads) {
  if (forced_forward_kernel() == "tiles") GTEST_SKIP() << "FLASHTILE_CPU_FORWARD=tiles: no decode kernel";
  auto rng = test_rng();
  Case c;
  c.sk = 300;
  c.hq = c.hkv = 8;
  c.d = c.dv = 32;
  Problem p(c, rng);
  flashtile::Options o = p.options();
  o.num_threads = 2;
  const auto r = flashtile::forward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.lse.view(), o);
  ASSERT_EQ(r.ran.kernel, "cpu_flash_decode");
  EXPECT_EQ(r.ran.splits, 1);
  EXPECT_NE(r.ran.detail.find("auto: 4 (sequence, row tile) tasks (2 KV heads per row tile) for 2 threads"),
            std::string::npos)
      << r.ran.detail;
  flashtile::backward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.dout.view(), p.lse.view(), p.dq.view(),
                      p.dk.view(), p.dv.view(), o);
  compare_with_oracle(p);
}

// Speculative decoding's shape without a KV-cache API (16 tokens x G 4 = 64 rows per KV head, 8 KV heads): the
// decode kernel packs all 8 heads into one 512-row tile (decode_plan.h kDecodeTileRows), so that a key block reads
// each key's heads as one stretch of memory, and splits the keys for the 2 threads; the result (and the backward's,
// which needs the forward's LSE) still matches.
TEST(Dispatch, SeveralKvHeadsShareOneRowTile) {
  if (forced_forward_kernel() == "tiles") GTEST_SKIP() << "FLASHTILE_CPU_FORWARD=tiles: no decode kernel";
  auto rng = test_rng();
  Problem p(Case{.sq = 16, .sk = 2048, .hq = 32, .hkv = 8, .causal = true, .softmax_scale = {}}, rng);  // d = dv = 64
  flashtile::Options o = p.options();
  o.num_threads = 2;
  const auto r = flashtile::forward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.lse.view(), o);
  ASSERT_EQ(r.ran.kernel, "cpu_flash_decode");
  EXPECT_EQ(r.ran.splits, 4);  // 2 tasks per thread
  EXPECT_NE(r.ran.detail.find("auto: 1 (sequence, row tile) tasks (8 KV heads per row tile)"), std::string::npos)
      << r.ran.detail;
  flashtile::backward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.dout.view(), p.lse.view(), p.dq.view(),
                      p.dk.view(), p.dv.view(), o);
  compare_with_oracle(p);
}

TEST(Dispatch, NamedBackendRuns) {
  auto rng = test_rng();
  Problem p = small(rng);
  const auto r = flashtile::forward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.lse.view(),
                                    p.options("cpu-reference"));
  EXPECT_EQ(r.ran.backend, "cpu-reference");
  EXPECT_EQ(r.requested, "cpu-reference");
}

TEST(Dispatch, NamedBackendThatCannotRunFallsBackLoudlyOrFailsWhenStrict) {
  // A GPU backend asked for host tensors: without strict the call runs on cpu-flash and says it fell
  // back (with the GPU backend's reasons); with strict it is an error. Needs a build with a GPU backend.
  const auto names = flashtile::backend_names();
  const auto gpu = std::find_if(names.begin(), names.end(), [](const std::string& n) { return n.rfind("cuda", 0) == 0; });
  if (gpu == names.end()) GTEST_SKIP() << "no GPU backend in this build";
  auto rng = test_rng();
  Problem p = small(rng);
  flashtile::Options o = p.options(*gpu);
  const auto r = flashtile::forward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.lse.view(), o);
  EXPECT_EQ(r.ran.backend, "cpu-flash");
  EXPECT_TRUE(r.fell_back);
  ASSERT_FALSE(r.refused.empty());
  EXPECT_EQ(r.refused.front().backend, *gpu);
  o.strict = true;
  EXPECT_THROW(flashtile::forward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.lse.view(), o),
               flashtile::UnsupportedError);
}

TEST(Dispatch, NamedBackendWithNoFallbackIsAnErrorListingEveryReason) {
  auto rng = test_rng();
  Problem p = small(rng);
  const ScopedCpuIsa forced("no-such-isa");
  try {
    flashtile::forward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.lse.view(), p.options("cpu-flash"));
    ADD_FAILURE() << "ran although no backend can";
  } catch (const flashtile::UnsupportedError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("no-such-isa"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cpu-reference"), std::string::npos) << msg;
  }
}

TEST(Dispatch, StrictRefusalListsTheReasons) {
  auto rng = test_rng();
  Problem p = small(rng);
  const ScopedCpuIsa forced("avx512");
  const auto plan = flashtile::explain_forward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.lse.view(),
                                               p.options());
  if (plan.ran.backend == "cpu-flash") {
    GTEST_SKIP() << "this CPU runs AVX-512, so no refusal can be provoked this way";
  }
  EXPECT_TRUE(plan.ran.backend.empty());
  flashtile::Options o = p.options("cpu-flash");
  o.strict = true;
  try {
    flashtile::forward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.lse.view(), o);
    ADD_FAILURE() << "strict mode ran a backend that cannot run";
  } catch (const flashtile::UnsupportedError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("strict"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cpu-flash"), std::string::npos) << msg;
    EXPECT_NE(msg.find("avx512"), std::string::npos) << msg;
  }
}

// avx2-bf16emu and avx2-amxemu (test paths) run only when FLASHTILE_CPU_ISA names them; avx512-bf16 is chosen by
// itself only on AMD CPUs (src/cpu/isa.cpp bf16_dots_pay: vdpbf16ps at twice the FMA rate there, half on the Intel
// Xeons measured, with AMX or without); left to itself the dispatch picks a float32 kernel set, avx512-bf16 there,
// or AMX.
TEST(Dispatch, OptInIsaPathsAreNeverChosenByThemselves) {
  auto rng = test_rng();
  Problem p = small(rng, DType::bfloat16);
  const ScopedCpuIsa cleared(nullptr);
  const auto plan = flashtile::explain_forward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.lse.view(),
                                               p.options("cpu-flash"));
  ASSERT_EQ(plan.ran.backend, "cpu-flash");
  EXPECT_TRUE(plan.ran.isa == "scalar" || plan.ran.isa == "avx2" || plan.ran.isa == "avx512" ||
              plan.ran.isa == "avx512-bf16" || plan.ran.isa == "avx512-amx")
      << plan.ran.isa;
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool dots = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
  const bool amx = dots && __builtin_cpu_supports("amx-bf16") && __builtin_cpu_supports("amx-tile");
  const bool dots_pay = dots && __builtin_cpu_is("amd") && !amx;
  EXPECT_EQ(plan.ran.isa == "avx512-bf16", dots_pay) << plan.ran.isa;
#endif
}

// The report of a bf16 call names what its products run on, per kernel set (src/cpu/isa.cpp kSets), and a float32
// call's says nothing of it.
TEST(Dispatch, ReportNamesTheBf16Products) {
  auto rng = test_rng();
  Problem p = small(rng, DType::bfloat16);
  Problem f = small(rng);
  ScopedCpuIsa forced(nullptr);
  int ran = 0;
  for (const char* isa : {"scalar", "avx2", "avx512", "avx2-bf16emu", "avx2-amxemu", "avx512-bf16", "avx512-amx"}) {
    const std::string products = bf16_products_of(isa);
    forced.set(isa);
    const auto bwd = flashtile::explain_backward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.dout.view(),
                                                 p.lse.view(), p.dq.view(), p.dk.view(), p.dv.view(), p.options());
    if (bwd.ran.backend != "cpu-flash") continue;  // this CPU cannot execute that path
    ++ran;
    SCOPED_TRACE(isa);
    EXPECT_NE(bwd.ran.detail.find("bf16 products: " + products), std::string::npos) << bwd.to_string();
    const auto fwd = flashtile::explain_forward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.lse.view(),
                                                p.options());
    EXPECT_NE(fwd.ran.detail.find("bf16 products: " + products), std::string::npos) << fwd.to_string();
    const auto f32 = flashtile::explain_forward(f.q.view(), f.k.view(), f.v.view(), f.out.view(), f.lse.view(),
                                                f.options());
    EXPECT_EQ(f32.ran.detail.find("bf16 products"), std::string::npos) << f32.to_string();
  }
  EXPECT_GE(ran, 2);  // scalar and, on every x86-64 CI machine, avx2 and its two emulations
}

TEST(Dispatch, ExplainTouchesNoData) {
  auto rng = test_rng();
  Problem p = small(rng);
  p.out.fill(-7.0);
  const auto r = flashtile::explain_backward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.dout.view(),
                                             p.lse.view(), p.dq.view(), p.dk.view(), p.dv.view(), p.options());
  EXPECT_EQ(r.ran.kernel, "cpu_flash_bwd");
  for (double x : p.out.to_double()) ASSERT_EQ(x, -7.0);
}

TEST(Dispatch, BackendNamesListEveryBackend) {
  const auto names = flashtile::backend_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "cpu-flash"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "cpu-reference"), names.end());
}

}  // namespace
}  // namespace ft_test
