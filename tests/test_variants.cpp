// The variants of issue 12 (varlen, window, softcap, ALiBi, sinks) and the combinations that matter, forward and
// gradients (dq, dk, dv, dsinks), cpu-flash against the float64 oracle with tolerances tied to standard attention
// in the same precision (variants.h). Shapes are small but cross the CPU tiles' boundaries (64-row query tiles,
// 64- and 128-key tiles); scripts/test.sh runs this binary once per CPU ISA path.
#include <gtest/gtest.h>

#include <cmath>

#include "variants.h"

namespace ft_test {
namespace {

const DType kDtypes[] = {DType::float32, DType::float16, DType::bfloat16};

std::vector<VarCase> variant_cases() {
  std::vector<VarCase> base;
  auto add = [&](VarCase c) { base.push_back(std::move(c)); };
  {  // varlen + causal + window + GQA + softcap, one sequence longer than a tile, Sq > Sk and Sq < Sk ones
    VarCase c;
    c.label = "varlen_causal_window_gqa_softcap";
    c.lens_q = {70, 1, 130, 9};
    c.lens_k = {70, 40, 150, 3};
    c.hq = 4;
    c.hkv = 2;
    c.causal = true;
    c.window = {33, -1};
    c.softcap = 5.0f;
    c.data_scale = 2.0;
    add(c);
  }
  {  // ALiBi [B, Hq] + a two-sided window, Sk > Sq
    VarCase c;
    c.label = "alibi_window";
    c.b = 2;
    c.sq = 100;
    c.sk = 140;
    c.hq = 2;
    c.window = {40, 20};
    c.alibi = 2;
    c.d = c.dv = 48;
    add(c);
  }
  {  // ALiBi [Hq], no mask
    VarCase c;
    c.label = "alibi_full";
    c.sq = 65;
    c.sk = 130;
    c.hq = 3;
    c.alibi = 1;
    c.dv = 40;
    add(c);
  }
  {  // sinks + causal
    VarCase c;
    c.label = "sinks_causal";
    c.b = 2;
    c.sq = 90;
    c.sk = 90;
    c.hq = 2;
    c.causal = true;
    c.sinks = true;
    add(c);
  }
  {  // Sq > Sk: the first Sq − Sk rows see nothing (O = 0, LSE = −inf), and with a sink (LSE = sink)
    VarCase c;
    c.label = "causal_sq_gt_sk";
    c.sq = 150;
    c.sk = 40;
    c.hq = 2;
    c.hkv = 1;
    c.causal = true;
    add(c);
    c.label = "causal_sq_gt_sk_sinks";
    c.sinks = true;
    add(c);
  }
  {  // a window that leaves the first 35 rows empty (i + Sk − Sq + 3 < 0) and rows that see 1..8 keys
    VarCase c;
    c.label = "window_empty_rows";
    c.sq = 130;
    c.sk = 70;
    c.window = {4, 3};
    c.hq = 2;
    c.layout = Layout::padded;
    add(c);
    c.label = "window_zero_zero";
    c.sq = 70;
    c.sk = 129;
    c.window = {0, 0};
    add(c);
  }
  {  // empty sequences inside a varlen batch: no queries, no keys, both
    VarCase c;
    c.label = "varlen_empty_sequences";
    c.lens_q = {3, 0, 65, 0, 17};
    c.lens_k = {0, 4, 70, 0, 17};
    c.hq = 2;
    c.causal = true;
    add(c);
  }
  {  // few query rows per KV head (G·Sq <= 64): the forward runs on the decode kernel (decode_plan.h
     // forward_on_decode), which then addresses packed rows and drops a shorter sequence's missing ones
    VarCase c;
    c.label = "varlen_few_rows_decode_kernel";
    c.lens_q = {1, 3, 0, 2};
    c.lens_k = {300, 5, 40, 0};
    c.hq = 8;
    c.hkv = 2;
    c.causal = true;
    c.window = {100, 0};
    c.sinks = true;
    add(c);
  }
  {  // seqused_k: a varlen batch and a batched call that use fewer keys than they hold
    VarCase c;
    c.label = "varlen_seqused_k_window";
    c.lens_q = {20, 66, 5};
    c.lens_k = {30, 140, 9};
    c.seqused_k = {30, 101, 0};
    c.window = {50, 10};
    c.hq = 2;
    add(c);
    VarCase d;
    d.label = "batched_seqused_k_causal";
    d.b = 3;
    d.sq = 10;
    d.sk = 80;
    d.seqused_k = {80, 33, 5};
    d.causal = true;
    d.hq = 2;
    add(d);
  }
  {  // softcap with scores well past the cap, no mask, D = 128 (two 64-key tiles, 128-key backward tiles)
    VarCase c;
    c.label = "softcap_full_d128";
    c.sq = 70;
    c.sk = 200;
    c.d = c.dv = 128;
    c.softcap = 3.0f;
    c.data_scale = 3.0;
    add(c);
  }
  {  // long windowed and causal sequences, D = 128 and 64: the float32 forward's grouped query tiles
     // (tile_config.h group_q) each see their own key tiles, some of the group's tiles none of a key tile
    VarCase c;
    c.label = "long_window_d128";
    c.sq = 700;
    c.sk = 650;
    c.d = c.dv = 128;
    c.window = {90, 30};
    add(c);
    c.label = "long_varlen_causal_window_d64";
    c.lens_q = {600, 300};
    c.lens_k = {620, 290};
    c.d = c.dv = 64;
    c.causal = true;
    c.window = {150, -1};
    add(c);
  }
  {  // everything at once
    VarCase c;
    c.label = "varlen_window_softcap_alibi_sinks_gqa";
    c.lens_q = {64, 0, 129, 7};
    c.lens_k = {64, 5, 100, 20};
    c.hq = 4;
    c.hkv = 1;
    c.window = {17, 9};
    c.softcap = 8.0f;
    c.alibi = 2;
    c.sinks = true;
    c.data_scale = 1.5;
    c.layout = Layout::padded;
    add(c);
  }
  std::vector<VarCase> cases;
  for (const VarCase& c : base)
    for (DType t : kDtypes) {
      VarCase x = c;
      x.dtype = t;
      x.label = c.label + "_" + std::string(flashtile::dtype_name(t));
      cases.push_back(x);
    }
  return cases;
}

class Variants : public ::testing::TestWithParam<VarCase> {};

TEST_P(Variants, ForwardMatchesOracle) {
  auto rng = test_rng();
  VarProblem p(GetParam(), rng);
  p.forward();
  expect_var_close(p, var_oracle(p, false), var_standard(p, false), false);
}

TEST_P(Variants, GradientsMatchOracle) {
  auto rng = test_rng();
  VarProblem p(GetParam(), rng);
  p.forward();
  p.dq->fill(7.0);  // every element is written, unused keys' rows included
  p.dk->fill(7.0);
  p.dv->fill(7.0);
  if (p.dsinks) p.dsinks->fill(7.0);
  p.backward();
  expect_var_close(p, var_oracle(p, true), var_standard(p, true), true);
}

INSTANTIATE_TEST_SUITE_P(Issue12, Variants, ::testing::ValuesIn(variant_cases()),
                         [](const auto& param_info) { return param_info.param.label; });

// The cpu-reference backend writes the oracle's varlen results into packed tensors (one rounding to the dtype).
TEST(VariantsReference, BackendWritesPackedResults) {
  auto rng = test_rng();
  VarCase c;
  c.lens_q = {5, 0, 70};
  c.lens_k = {9, 3, 66};
  c.hq = 2;
  c.window = {10, 2};
  c.sinks = true;
  c.alibi = 1;
  VarProblem p(c, rng);
  p.forward("cpu-reference");
  p.backward("cpu-reference");
  const VarResults ref = var_oracle(p, true);
  const auto check = [](const char* what, const std::vector<double>& got, const std::vector<double>& want) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (std::size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], eps(DType::float32) * std::max(1.0, std::abs(want[i]))) << what << " " << i;
  };
  check("out", p.out->to_double(), ref.out);
  check("dq", p.dq->to_double(), ref.dq);
  check("dk", p.dk->to_double(), ref.dk);
  check("dsinks", p.dsinks->to_double(), ref.dsinks);
  const auto lse = p.lse->to_double();
  for (std::size_t i = 0; i < lse.size(); ++i)
    if (std::isfinite(ref.lse[i])) {
      ASSERT_NEAR(lse[i], ref.lse[i], 1e-6 * std::max(1.0, std::abs(ref.lse[i])));
    } else {
      ASSERT_EQ(lse[i], ref.lse[i]);
    }
}

// Sinks semantics at the edges: a row that sees no key has O = 0 and LSE = sink; dsinks gets nothing from it.
TEST(VariantsSinks, RowWithoutKeysHasLseSinkAndZeroOutput) {
  auto rng = test_rng();
  VarCase c;
  c.sq = 6;
  c.sk = 2;
  c.causal = true;  // rows 0..3 see nothing
  c.sinks = true;
  c.hq = 2;
  VarProblem p(c, rng);
  p.forward();
  const auto out = p.out->to_double(), lse = p.lse->to_double(), sinks = p.sinks->to_double();
  for (std::int64_t h = 0; h < 2; ++h)
    for (std::int64_t i = 0; i < 4; ++i) {
      EXPECT_EQ(lse[static_cast<std::size_t>(h * 6 + i)], sinks[static_cast<std::size_t>(h)]);
      for (std::int64_t e = 0; e < c.dv; ++e) EXPECT_EQ(out[static_cast<std::size_t>((i * 2 + h) * c.dv + e)], 0.0);
    }
}

}  // namespace
}  // namespace ft_test

namespace ft_test {
namespace {

// The dispatch report names the mask and the score hooks the kernel ran with.
TEST(VariantsReport, NamesMaskAndScoreHooks) {
  auto rng = test_rng();
  const auto report_of = [&](const VarCase& c) {
    VarProblem p(c, rng);
    return flashtile::forward(p.q->view(), p.k->view(), p.v->view(), p.out->view(), p.lse->view(), p.options()).ran;
  };
  VarCase plain;
  plain.sq = plain.sk = 4;
  EXPECT_EQ(report_of(plain).mask, "none");
  EXPECT_TRUE(report_of(plain).score_hooks.empty());
  VarCase causal = plain;
  causal.causal = true;
  EXPECT_EQ(report_of(causal).mask, "causal");
  VarCase sliding = causal;
  sliding.window = {2, -1};
  EXPECT_EQ(report_of(sliding).mask, "window(2, 0)");
  VarCase varlen = plain;
  varlen.lens_q = {2, 3};
  varlen.lens_k = {4, 1};
  varlen.window = {1, 1};
  varlen.softcap = 30.0f;
  varlen.alibi = 1;
  varlen.sinks = true;
  const flashtile::KernelInfo k = report_of(varlen);
  EXPECT_EQ(k.mask, "varlen+window(1, 1)");
  EXPECT_EQ(k.score_hooks, (std::vector<std::string>{"softcap(30)", "alibi", "sinks"}));
  VarProblem p(varlen, rng);
  const std::string text =
      flashtile::forward(p.q->view(), p.k->view(), p.v->view(), p.out->view(), p.lse->view(), p.options()).to_string();
  EXPECT_NE(text.find("mask=varlen+window(1, 1) hooks=softcap(30),alibi,sinks"), std::string::npos) << text;
}

}  // namespace
}  // namespace ft_test

namespace ft_test {
namespace {

// dsinks is an output of every backward with sinks: written (0) even when the batch has no rows or no sequences.
TEST(VariantsSinks, EmptyBackwardWritesZeroDsinks) {
  for (std::int64_t b : {0, 2}) {
    auto rng = test_rng();
    VarCase c;
    c.b = b;
    c.sq = 0;
    c.sk = 3;
    c.hq = 3;
    c.hkv = 1;
    c.sinks = true;
    VarProblem p(c, rng);
    p.dsinks->fill(7.0);
    p.backward();
    for (double x : p.dsinks->to_double()) EXPECT_EQ(x, 0.0) << "B = " << b;
  }
}

}  // namespace
}  // namespace ft_test
