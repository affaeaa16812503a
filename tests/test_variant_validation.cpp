// Every bad variant input (issue 12: window, softcap, ALiBi, sinks, dsinks, varlen, seqused_k, int32 operands) is a
// typed error naming the argument and the value, in forward and in backward.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "variants.h"

namespace ft_test {
namespace {

using flashtile::Error;
using flashtile::Options;
using flashtile::TensorView;

enum class Kind { invalid, dtype, device };

struct Call {
  TensorView q, k, v, out, lse, dout, dq, dk, dv;
  Options o;
};

struct Bad {
  const char* name;
  std::function<void(Call&)> mutate;
  Kind kind;
  std::vector<std::string> must_mention;
  bool backward_only = false;
};

void check(VarProblem& p, const Bad& bad) {
  for (bool backward : {false, true}) {
    if (bad.backward_only && !backward) continue;
    Call c{p.q->view(), p.k->view(), p.v->view(), p.out->view(), p.lse->view(), p.dout->view(), p.dq->view(),
           p.dk->view(), p.dv->view(), p.options("auto", backward)};
    bad.mutate(c);
    SCOPED_TRACE(std::string(bad.name) + (backward ? " / backward" : " / forward"));
    try {
      if (backward) {
        flashtile::backward(c.q, c.k, c.v, c.out, c.dout, c.lse, c.dq, c.dk, c.dv, c.o);
      } else {
        flashtile::forward(c.q, c.k, c.v, c.out, c.lse, c.o);
      }
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      switch (bad.kind) {
        case Kind::invalid: EXPECT_TRUE(dynamic_cast<const flashtile::InvalidArgument*>(&e) != nullptr) << msg; break;
        case Kind::dtype: EXPECT_TRUE(dynamic_cast<const flashtile::DTypeError*>(&e) != nullptr) << msg; break;
        case Kind::device: EXPECT_TRUE(dynamic_cast<const flashtile::DeviceError*>(&e) != nullptr) << msg; break;
      }
      for (const std::string& w : bad.must_mention) EXPECT_NE(msg.find(w), std::string::npos) << "'" << w << "' not in: " << msg;
    }
  }
}

// A batched call with every option set: B = 2, Sq = 5, Sk = 7, Hq = 4, Hkv = 2.
VarCase batched_case() {
  VarCase c;
  c.b = 2;
  c.sq = 5;
  c.sk = 7;
  c.hq = 4;
  c.hkv = 2;
  c.d = c.dv = 16;
  c.alibi = 2;
  c.sinks = true;
  c.seqused_k = {7, 3};
  return c;
}

// A varlen call: sequences of 3, 0, 6 queries and 4, 2, 6 keys.
VarCase varlen_case() {
  VarCase c;
  c.lens_q = {3, 0, 6};
  c.lens_k = {4, 2, 6};
  c.hq = 2;
  c.d = c.dv = 16;
  c.seqused_k = {4, 1, 6};
  return c;
}

TEST(VariantValidation, OptionsAndVectorsOfABatchedCall) {
  auto rng = test_rng();
  VarProblem p(batched_case(), rng);
  float f16_buf[8] = {};
  const std::vector<Bad> cases = {
      {"window left", [](Call& c) { c.o.window_size = {-2, 0}; }, Kind::invalid, {"window_size", "left", "-2"}},
      {"window right", [](Call& c) { c.o.window_size = {3, -7}; }, Kind::invalid, {"window_size", "right", "-7"}},
      {"softcap negative", [](Call& c) { c.o.softcap = -1.0f; }, Kind::invalid, {"softcap", "-1"}},
      {"softcap inf", [](Call& c) { c.o.softcap = std::numeric_limits<float>::infinity(); }, Kind::invalid, {"softcap", "inf"}},
      {"softcap nan", [](Call& c) { c.o.softcap = std::nanf(""); }, Kind::invalid, {"softcap", "nan"}},
      {"alibi shape", [](Call& c) { c.o.alibi_slopes.shape[1] = 3; }, Kind::invalid, {"alibi_slopes", "[4] or [2, 4]", "[2, 3]"}},
      {"alibi batch", [](Call& c) { c.o.alibi_slopes.shape[0] = 3; }, Kind::invalid, {"alibi_slopes", "[3, 4]"}},
      {"alibi rank", [](Call& c) { c.o.alibi_slopes.rank = 3; }, Kind::invalid, {"alibi_slopes", "[Hq] or [B, Hq]"}},
      {"alibi dtype", [](Call& c) { c.o.alibi_slopes.dtype = DType::float16; }, Kind::dtype, {"alibi_slopes", "float16", "float32"}},
      {"alibi device", [](Call& c) { c.o.alibi_slopes.device = flashtile::Device::cuda; }, Kind::device, {"alibi_slopes", "cuda"}},
      {"sinks shape", [](Call& c) { c.o.sinks.shape[0] = 2; }, Kind::invalid, {"sinks", "[4]", "[2]"}},
      {"sinks dtype", [&](Call& c) { c.o.sinks = flashtile::make_view(f16_buf, DType::bfloat16, {4}); }, Kind::dtype,
       {"sinks", "bfloat16"}},
      {"sinks device", [](Call& c) { c.o.sinks.device = flashtile::Device::cuda; }, Kind::device, {"sinks", "cuda"}},
      {"sinks null", [](Call& c) { c.o.sinks.data = nullptr; }, Kind::invalid, {"sinks", "null"}},
      {"dsinks missing", [](Call& c) { c.o.dsinks = {}; }, Kind::invalid, {"dsinks", "required"}, true},
      {"dsinks without sinks", [](Call& c) { c.o.sinks = {}; }, Kind::invalid, {"dsinks", "without sinks"}, true},
      {"dsinks shape", [](Call& c) { c.o.dsinks.shape[0] = 5; }, Kind::invalid, {"dsinks", "[4]", "[5]"}, true},
      {"dsinks aliases sinks", [](Call& c) { c.o.dsinks.data = c.o.sinks.data; }, Kind::invalid, {"dsinks", "overlaps input sinks"},
       true},
      {"dsinks aliases dq", [](Call& c) { c.o.dsinks.data = c.dq.data; }, Kind::invalid, {"overlaps output"}, true},
      {"q int32", [](Call& c) { for (TensorView* t : {&c.q, &c.k, &c.v, &c.out, &c.dout, &c.dq, &c.dk, &c.dv}) t->dtype = DType::int32; },
       Kind::dtype, {"q", "int32"}},
      {"seqused_k dtype", [](Call& c) { c.o.seqused_k.dtype = DType::float32; }, Kind::dtype, {"seqused_k", "float32", "int32"}},
      {"seqused_k shape", [](Call& c) { c.o.seqused_k.shape[0] = 1; }, Kind::invalid, {"seqused_k", "[2]", "[1]"}},
      {"seqused_k device", [](Call& c) { c.o.seqused_k.device = flashtile::Device::cuda; }, Kind::device, {"seqused_k"}},
      {"seqused_k too large", [](Call& c) { static_cast<std::int32_t*>(c.o.seqused_k.data)[1] = 8; }, Kind::invalid,
       {"seqused_k[1] = 8", "[0, 7]"}},
      {"seqused_k negative", [](Call& c) { static_cast<std::int32_t*>(c.o.seqused_k.data)[0] = -1; }, Kind::invalid,
       {"seqused_k[0] = -1"}},
  };
  for (const Bad& bad : cases) {
    check(p, bad);
    p.seqused->set(0, 7);  // restore what a case wrote
    p.seqused->set(1, 3);
  }
}

TEST(VariantValidation, VarlenLayoutsAndSequenceArrays) {
  auto rng = test_rng();
  VarProblem p(varlen_case(), rng);  // total_q 9, total_k 12
  auto cu = [](Call& c, const char* which) -> std::int32_t* {
    return static_cast<std::int32_t*>(std::string(which) == "q" ? c.o.cu_seqlens_q.data : c.o.cu_seqlens_k.data);
  };
  std::vector<std::int32_t> saved_q(4), saved_k(4);
  for (int i = 0; i < 4; ++i) {
    saved_q[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(p.cu_seqlens_q->get(i));
    saved_k[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(p.cu_seqlens_k->get(i));
  }
  const std::vector<Bad> cases = {
      {"cu_seqlens_k missing", [](Call& c) { c.o.cu_seqlens_k = {}; }, Kind::invalid, {"cu_seqlens_k", "required"}},
      {"cu_seqlens_q missing", [](Call& c) { c.o.cu_seqlens_q = {}; }, Kind::invalid, {"cu_seqlens_q", "required"}},
      {"cu_seqlens_q float", [](Call& c) { c.o.cu_seqlens_q.dtype = DType::float32; }, Kind::dtype, {"cu_seqlens_q", "float32", "int32"}},
      {"cu_seqlens_k device", [](Call& c) { c.o.cu_seqlens_k.device = flashtile::Device::cuda; }, Kind::device, {"cu_seqlens_k", "cuda"}},
      {"cu_seqlens_k length", [](Call& c) { c.o.cu_seqlens_k.shape[0] = 3; }, Kind::invalid, {"cu_seqlens_k", "[4]", "[3]"}},
      {"cu_seqlens_q rank", [](Call& c) { c.o.cu_seqlens_q.rank = 2; }, Kind::invalid, {"cu_seqlens_q", "1 dimensions"}},
      {"cu_seqlens_q start", [&](Call& c) { cu(c, "q")[0] = 1; }, Kind::invalid, {"cu_seqlens_q", "start at 0", "= 1"}},
      {"cu_seqlens_k decreasing", [&](Call& c) { cu(c, "k")[2] = 3; }, Kind::invalid,
       {"cu_seqlens_k", "non-decreasing", "cu_seqlens_k[2] = 3", "cu_seqlens_k[1] = 4"}},
      {"cu_seqlens_q end", [&](Call& c) { cu(c, "q")[3] = 8; }, Kind::invalid, {"cu_seqlens_q", "total_q = 9", "= 8"}},
      {"cu_seqlens_k end", [&](Call& c) { cu(c, "k")[3] = 13; }, Kind::invalid, {"cu_seqlens_k", "total_k = 12", "= 13"}},
      {"max_seqlen_q small", [](Call& c) { c.o.max_seqlen_q = 5; }, Kind::invalid, {"max_seqlen_q", "5", "sequence 2", "6"}},
      {"max_seqlen_k small", [](Call& c) { c.o.max_seqlen_k = 3; }, Kind::invalid, {"max_seqlen_k", "3", "sequence 0", "4"}},
      {"max_seqlen negative", [](Call& c) { c.o.max_seqlen_q = -1; }, Kind::invalid, {"max_seqlen_q", "-1"}},
      {"q rank 4", [](Call& c) { c.q.rank = 4; }, Kind::invalid, {"q", "3 dimensions", "[total_q, Hq, D]"}},
      {"k rows", [](Call& c) { c.k.shape[0] = 11; c.v.shape[0] = 11; c.dk.shape[0] = 11; c.dv.shape[0] = 11; },
       Kind::invalid, {"cu_seqlens_k", "total_k = 11"}},
      {"lse layout", [](Call& c) { c.lse.shape[0] = 9; c.lse.shape[1] = 2; }, Kind::invalid, {"lse", "[2, 9]", "[Hq, total_q]"}},
      {"dq rows", [](Call& c) { c.dq.shape[0] = 8; }, Kind::invalid, {"dq", "[9, 2, 16]"}, true},
      {"seqused_k beyond a sequence", [](Call& c) { static_cast<std::int32_t*>(c.o.seqused_k.data)[1] = 3; }, Kind::invalid,
       {"seqused_k[1] = 3", "[0, 2]", "sequence 1"}},
  };
  for (const Bad& bad : cases) {
    check(p, bad);
    for (int i = 0; i < 4; ++i) {  // restore what a case wrote
      p.cu_seqlens_q->set(i, saved_q[static_cast<std::size_t>(i)]);
      p.cu_seqlens_k->set(i, saved_k[static_cast<std::size_t>(i)]);
    }
    p.seqused->set(1, 1);
  }
}

// A refused call writes nothing.
TEST(VariantValidation, RefusedCallChangesNothing) {
  auto rng = test_rng();
  VarProblem p(varlen_case(), rng);
  p.out->fill(3.0);
  p.lse->fill(3.0);
  Options o = p.options();
  o.max_seqlen_k = 1;
  EXPECT_THROW(flashtile::forward(p.q->view(), p.k->view(), p.v->view(), p.out->view(), p.lse->view(), o),
               flashtile::InvalidArgument);
  for (double x : p.out->to_double()) EXPECT_EQ(x, 3.0);
  for (double x : p.lse->to_double()) EXPECT_EQ(x, 3.0);
}

}  // namespace
}  // namespace ft_test
