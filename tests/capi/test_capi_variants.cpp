// The C API's variant arguments (ft_variants, ft_forward_ex / ft_backward_ex): results against the float64 oracle
// with the tolerance of tests/variants.h (standard attention in the same precision), the struct_size rule of
// capi.h, and one bad-input case per new argument (refused with FT_ERR_INVALID_ARGUMENT, a message naming the
// argument and its value, outputs untouched). The problems and the oracle come from tests/variants.h; the calls
// go through libflashtile_capi.so as ctypes callers make them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "flashtile/capi.h"
#include "variants.h"

namespace ft_test {
namespace {

constexpr double kUntouched = -12345.0;
const double kDefaultScale = std::numeric_limits<double>::quiet_NaN();

ft_tensor ft(const Tensor& t) {
  const TensorView& v = t.view();
  ft_tensor x{v.data, {0, 0, 0, 0}, {0, 0, 0, 0}, v.rank};
  for (int i = 0; i < v.rank; ++i) {
    x.shape[i] = v.shape[static_cast<std::size_t>(i)];
    x.stride[i] = v.stride[static_cast<std::size_t>(i)];
  }
  return x;
}

int dtype_code(DType t) { return t == DType::float32 ? FT_DTYPE_FLOAT32 : t == DType::float16 ? FT_DTYPE_FLOAT16 : FT_DTYPE_BFLOAT16; }

// A VarProblem's operands as ft_tensors, and its options as ft_variants (the C spelling of VarProblem::options).
struct CCall {
  VarProblem& p;
  ft_tensor q, k, v, out, lse, dout, dq, dk, dv, alibi{}, sinks{}, dsinks{}, cu_q{}, cu_k{}, seqused{};
  ft_variants var = FT_VARIANTS_INIT;
  std::string msg;

  explicit CCall(VarProblem& pr)
      : p(pr), q(ft(*pr.q)), k(ft(*pr.k)), v(ft(*pr.v)), out(ft(*pr.out)), lse(ft(*pr.lse)), dout(ft(*pr.dout)),
        dq(ft(*pr.dq)), dk(ft(*pr.dk)), dv(ft(*pr.dv)) {
    var.window_left = p.c.window[0];
    var.window_right = p.c.window[1];
    var.softcap = p.c.softcap;
    if (p.alibi) var.alibi_slopes = &(alibi = ft(*p.alibi));
    if (p.sinks) {
      var.sinks = &(sinks = ft(*p.sinks));
      var.dsinks = &(dsinks = ft(*p.dsinks));
    }
    if (p.c.varlen()) {
      var.cu_seqlens_q = &(cu_q = ft(*p.cu_seqlens_q));
      var.cu_seqlens_k = &(cu_k = ft(*p.cu_seqlens_k));
      var.max_seqlen_q = p.max_q;
      var.max_seqlen_k = p.max_k;
    }
    if (p.seqused) var.seqused_k = &(seqused = ft(*p.seqused));
  }
  int forward(const ft_variants* x) {
    char buf[2048];
    const int rc = ft_forward_ex(&q, &k, &v, &out, &lse, dtype_code(p.c.dtype), FT_DEVICE_HOST, kDefaultScale,
                                 p.c.causal, nullptr, 0, x, buf, sizeof buf);
    msg = buf;
    return rc;
  }
  int forward() { return forward(&var); }
  int backward(const ft_variants* x) {
    char buf[2048];
    const int rc = ft_backward_ex(&q, &k, &v, &out, &dout, &lse, &dq, &dk, &dv, dtype_code(p.c.dtype), FT_DEVICE_HOST,
                                  kDefaultScale, p.c.causal, 0, nullptr, 0, x, buf, sizeof buf);
    msg = buf;
    return rc;
  }
  int backward() { return backward(&var); }
};

// Every output (out, lse, dq, dk, dv, dsinks) set to kUntouched, and whether they still are.
void poison(VarProblem& p) {
  for (auto* t : {&p.out, &p.lse, &p.dq, &p.dk, &p.dv, &p.dsinks})
    if (*t) (*t)->fill(kUntouched);
}
bool untouched(const VarProblem& p) {
  for (auto* t : {&p.out, &p.lse, &p.dq, &p.dk, &p.dv, &p.dsinks})
    if (*t)
      for (double x : (*t)->to_double())
        if (x != kUntouched) return false;
  return true;
}

VarResults results(const VarProblem& p) {
  VarResults r{p.out->to_double(), p.lse->to_double(), p.dq->to_double(), p.dk->to_double(), p.dv->to_double(), {}};
  if (p.dsinks) r.dsinks = p.dsinks->to_double();
  return r;
}

// The combinations that matter, small: varlen with an empty sequence + causal + window + GQA + softcap + ALiBi
// [B, Hq] + sinks + seqused_k, and a batched call with ALiBi [Hq], a two-sided window and sinks.
std::vector<VarCase> cases() {
  std::vector<VarCase> v;
  for (DType t : {DType::float32, DType::bfloat16}) {
    VarCase a;
    a.label = std::string("varlen_all_") + std::string(flashtile::dtype_name(t));
    a.lens_q = {20, 0, 70, 5};
    a.lens_k = {30, 7, 66, 2};
    a.seqused_k = {25, 7, 66, 1};
    a.hq = 4;
    a.hkv = 2;
    a.d = a.dv = 24;
    a.causal = true;
    a.window = {17, -1};
    a.softcap = 4.0f;
    a.data_scale = 2.0;
    a.alibi = 2;
    a.sinks = true;
    a.dtype = t;
    v.push_back(a);
    VarCase b;
    b.label = std::string("batched_alibi_window_sinks_") + std::string(flashtile::dtype_name(t));
    b.b = 2;
    b.sq = 40;
    b.sk = 70;
    b.hq = 2;
    b.d = 16;
    b.dv = 20;
    b.window = {30, 10};
    b.alibi = 1;
    b.sinks = true;
    b.dtype = t;
    v.push_back(b);
  }
  return v;
}

TEST(CApiVariants, ForwardAndBackwardAgreeWithTheOracle) {
  std::mt19937_64 rng = test_rng();
  for (const VarCase& c : cases()) {
    SCOPED_TRACE(c.label);
    VarProblem p(c, rng);
    CCall call(p);
    ASSERT_EQ(call.forward(), FT_OK) << call.msg;
    EXPECT_NE(call.msg.find("alibi"), std::string::npos) << "the report names the hooks it ran: " << call.msg;
    ASSERT_EQ(call.backward(), FT_OK) << call.msg;
    expect_var_close(p, var_oracle(p, true), var_standard(p, true), true);
    // The C++ API on the same problem gives the same bytes: the C layer adds nothing and drops nothing.
    const VarResults c_results = results(p);
    poison(p);
    p.forward();
    p.backward();
    const VarResults cpp = results(p);
    EXPECT_EQ(c_results.out, cpp.out);
    EXPECT_EQ(c_results.lse, cpp.lse);
    EXPECT_EQ(c_results.dq, cpp.dq);
    EXPECT_EQ(c_results.dk, cpp.dk);
    EXPECT_EQ(c_results.dv, cpp.dv);
    EXPECT_EQ(c_results.dsinks, cpp.dsinks);
  }
}

// No variants (NULL, or FT_VARIANTS_INIT) is ft_forward / ft_backward, byte for byte.
TEST(CApiVariants, NoVariantsIsThePlainCall) {
  std::mt19937_64 rng = test_rng();
  VarCase c;
  c.b = 2;
  c.sq = 33;
  c.sk = 47;
  c.hq = 2;
  c.causal = true;
  VarProblem p(c, rng);
  CCall call(p);
  char buf[1024];
  ASSERT_EQ(ft_forward(&call.q, &call.k, &call.v, &call.out, &call.lse, FT_DTYPE_FLOAT32, FT_DEVICE_HOST, kDefaultScale,
                       1, nullptr, 0, buf, sizeof buf),
            FT_OK)
      << buf;
  ASSERT_EQ(ft_backward(&call.q, &call.k, &call.v, &call.out, &call.dout, &call.lse, &call.dq, &call.dk, &call.dv,
                        FT_DTYPE_FLOAT32, FT_DEVICE_HOST, kDefaultScale, 1, 0, nullptr, 0, buf, sizeof buf),
            FT_OK)
      << buf;
  const VarResults plain = results(p);
  const ft_variants init = FT_VARIANTS_INIT;
  for (const ft_variants* x : {static_cast<const ft_variants*>(nullptr), &init}) {
    poison(p);
    ASSERT_EQ(call.forward(x), FT_OK) << call.msg;
    ASSERT_EQ(call.backward(x), FT_OK) << call.msg;
    const VarResults r = results(p);
    EXPECT_EQ(r.out, plain.out);
    EXPECT_EQ(r.lse, plain.lse);
    EXPECT_EQ(r.dq, plain.dq);
    EXPECT_EQ(r.dk, plain.dk);
    EXPECT_EQ(r.dv, plain.dv);
  }
}

void expect_refused(CCall& call, int rc, const std::string& arg, const std::string& value) {
  EXPECT_EQ(rc, FT_ERR_INVALID_ARGUMENT) << call.msg;
  EXPECT_NE(call.msg.find(arg + ":"), std::string::npos) << "message should name " << arg << ": " << call.msg;
  EXPECT_NE(call.msg.find(value), std::string::npos) << "message should name the value " << value << ": " << call.msg;
  EXPECT_TRUE(untouched(call.p)) << "a refused call wrote to an output";
}

// struct_size: below the first version's is refused; larger is accepted when the unknown tail is zero (a newer
// header's defaults) and refused when it is not.
TEST(CApiVariants, StructSizeRule) {
  std::mt19937_64 rng = test_rng();
  VarCase c = cases()[0];
  VarProblem p(c, rng);
  CCall call(p);
  ASSERT_EQ(call.forward(), FT_OK) << call.msg;
  const std::vector<double> want = p.out->to_double();
  constexpr std::uint64_t kVersion1 = offsetof(ft_variants, sm_margin);  // the first header's sizeof(ft_variants)
  for (std::uint64_t small : {std::uint64_t{0}, std::uint64_t{8}, kVersion1 - 8}) {
    poison(p);
    ft_variants x = call.var;
    x.struct_size = small;
    expect_refused(call, call.forward(&x), "variants", "got " + std::to_string(small));
  }
  {  // a caller of the first version: sm_margin lies past its struct and is never read (-1 would be refused)
    ft_variants x = call.var;
    x.struct_size = kVersion1;
    x.sm_margin = -1;
    poison(p);
    ASSERT_EQ(call.forward(&x), FT_OK) << call.msg;
    EXPECT_EQ(p.out->to_double(), want);
  }
  struct Newer {
    ft_variants v;
    std::int64_t future_field;
  } newer{call.var, 0};
  newer.v.struct_size = sizeof newer;
  poison(p);
  ASSERT_EQ(call.forward(&newer.v), FT_OK) << call.msg;
  EXPECT_EQ(p.out->to_double(), want);
  newer.future_field = 1;
  poison(p);
  expect_refused(call, call.forward(&newer.v), "variants", "got struct_size " + std::to_string(sizeof newer));
}

// One bad value per new argument, in forward and (where it applies) backward.
TEST(CApiVariants, BadVariantArgumentsAreRefused) {
  std::mt19937_64 rng = test_rng();
  VarCase c = cases()[0];
  VarProblem p(c, rng);
  ASSERT_EQ(c.hq, 4);
  ASSERT_EQ(c.lens_q.size(), 4u);
  // Wrong-shape and bad-value tensors the cases below point at.
  Tensor alibi_bad(DType::float32, {c.hq + 1}), sinks_bad(DType::float32, {c.hq, 1}), dsinks_bad(DType::float32, {2});
  Tensor cu_q_bad(DType::int32, {5}), cu_k_bad(DType::int32, {5}), seqused_bad(DType::int32, {4});
  alibi_bad.fill(0.5);
  sinks_bad.fill(0.0);
  const double cu_q_values[] = {0, 20, 10, 90, 95};  // 20 > 10: decreasing
  const double cu_k_values[] = {0, 30, 37, 103, 104};  // ends at 104, total_k is 105
  const double seqused_values[] = {25, 7, 99, 1};      // sequence 2 has 66 keys
  for (int i = 0; i < 5; ++i) cu_q_bad.set(i, cu_q_values[i]), cu_k_bad.set(i, cu_k_values[i]);
  for (int i = 0; i < 4; ++i) seqused_bad.set(i, seqused_values[i]);
  ft_tensor fa = ft(alibi_bad), fs = ft(sinks_bad), fd = ft(dsinks_bad), fq = ft(cu_q_bad), fk = ft(cu_k_bad),
            fu = ft(seqused_bad), rank7 = ft(alibi_bad);
  rank7.rank = 7;

  struct Bad {
    const char* arg;
    std::string value;
    std::function<void(ft_variants&)> edit;
    bool forward = true;  // else backward only
  };
  const std::vector<Bad> bad = {
      {"window_size", "left = -2", [](ft_variants& x) { x.window_left = -2; }},
      {"window_size", "right = -7", [](ft_variants& x) { x.window_right = -7; }},
      {"softcap", "got -1", [](ft_variants& x) { x.softcap = -1.0; }},
      {"softcap", "got nan", [](ft_variants& x) { x.softcap = std::nan(""); }},
      {"softcap", "got 1e+300", [](ft_variants& x) { x.softcap = 1e300; }},
      {"alibi_slopes", "got [5]", [&](ft_variants& x) { x.alibi_slopes = &fa; }},
      {"alibi_slopes", "got 7", [&](ft_variants& x) { x.alibi_slopes = &rank7; }},
      {"sinks", "got [4, 1]", [&](ft_variants& x) { x.sinks = &fs; }},
      {"dsinks", "required", [](ft_variants& x) { x.dsinks = nullptr; }, false},
      {"dsinks", "got [2]", [&](ft_variants& x) { x.dsinks = &fd; }, false},
      {"cu_seqlens_q", "cu_seqlens_q[2] = 10", [&](ft_variants& x) { x.cu_seqlens_q = &fq; }},
      {"cu_seqlens_k", "cu_seqlens_k[4] = 104", [&](ft_variants& x) { x.cu_seqlens_k = &fk; }},
      {"cu_seqlens_k", "required with cu_seqlens_q", [](ft_variants& x) { x.cu_seqlens_k = nullptr; }},
      {"seqused_k", "seqused_k[2] = 99", [&](ft_variants& x) { x.seqused_k = &fu; }},
      {"max_seqlen_q", "69 is smaller than sequence 2's length 70", [](ft_variants& x) { x.max_seqlen_q = 69; }},
      {"max_seqlen_k", "got -1", [](ft_variants& x) { x.max_seqlen_k = -1; }},
      {"sm_margin", "got -1", [](ft_variants& x) { x.sm_margin = -1; }},
      {"sm_margin", "got 4294967296", [](ft_variants& x) { x.sm_margin = std::int64_t{1} << 32; }},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(std::string(b.arg) + " " + b.value);
    CCall call(p);
    b.edit(call.var);
    if (b.forward) {
      poison(p);
      expect_refused(call, call.forward(), b.arg, b.value);
    }
    poison(p);
    expect_refused(call, call.backward(), b.arg, b.value);
  }
}

// ft_forward_kvcache: the C call runs the C++ call (bitwise the same results on a paged cache with an append, a
// window and sinks), and a refused call names the argument and leaves the cache untouched.
TEST(CApiKvCache, MatchesTheCppCallAndRefusesBeforeWriting) {
  auto rng = test_rng();
  const DType t = DType::float32;
  Tensor q(t, {2, 1, 4, 16}), kc(t, {5, 16, 2, 16}), vc(t, {5, 16, 2, 16}), kn(t, {2, 1, 2, 16}), vn(t, {2, 1, 2, 16});
  Tensor out(t, {2, 1, 4, 16}), lse(DType::float32, {2, 4, 1}), lens(DType::int32, {2}), table(DType::int32, {2, 2});
  Tensor sinks(DType::float32, {4});
  for (Tensor* x : {&q, &kc, &vc, &kn, &vn, &sinks}) x->fill_normal(rng);
  lens.set(0, 20);
  lens.set(1, 3);
  const double pages[4] = {3, 0, 4, 1};
  for (int i = 0; i < 4; ++i) table.set(i, pages[i]);
  // The C++ call on copies of the cache: the reference.
  Tensor kc2(t, {5, 16, 2, 16}), vc2(t, {5, 16, 2, 16}), out2(t, {2, 1, 4, 16}), lse2(DType::float32, {2, 4, 1});
  const auto k0 = kc.to_double(), v0 = vc.to_double();
  for (std::int64_t i = 0; i < kc.numel(); ++i) kc2.set(i, k0[static_cast<std::size_t>(i)]), vc2.set(i, v0[static_cast<std::size_t>(i)]);
  flashtile::KVCache c;
  c.k_cache = kc2.view();
  c.v_cache = vc2.view();
  c.k_new = kn.view();
  c.v_new = vn.view();
  c.cache_seqlens = lens.view();
  c.block_table = table.view();
  c.num_splits = 2;
  flashtile::Options o;
  o.window_size = {8, 0};
  o.sinks = sinks.view();
  flashtile::forward_kvcache(q.view(), c, out2.view(), lse2.view(), o);

  ft_tensor fq = ft(q), fkc = ft(kc), fvc = ft(vc), fkn = ft(kn), fvn = ft(vn), fo = ft(out), fl = ft(lse),
            flens = ft(lens), ftab = ft(table), fs = ft(sinks);
  ft_variants var = FT_VARIANTS_INIT;
  var.window_left = 8;
  var.window_right = 0;
  var.sinks = &fs;
  char msg[2048];
  int rc = ft_forward_kvcache(&fq, &fkc, &fvc, &fkn, &fvn, &flens, &ftab, nullptr, &fo, &fl, 2, 0, FT_DTYPE_FLOAT32,
                              FT_DEVICE_HOST, kDefaultScale, 0, nullptr, 0, &var, msg, sizeof msg);
  ASSERT_EQ(rc, FT_OK) << msg;
  EXPECT_NE(std::string(msg).find("cpu_flash_decode"), std::string::npos) << msg;
  EXPECT_EQ(out.to_double(), out2.to_double());
  EXPECT_EQ(lse.to_double(), lse2.to_double());
  EXPECT_EQ(kc.to_double(), kc2.to_double());
  EXPECT_EQ(vc.to_double(), vc2.to_double());

  lens.set(0, 32);  // 32 + 1 keys do not fit in two pages of 16
  const auto k1 = kc.to_double();
  rc = ft_forward_kvcache(&fq, &fkc, &fvc, &fkn, &fvn, &flens, &ftab, nullptr, &fo, &fl, 0, 0, FT_DTYPE_FLOAT32,
                          FT_DEVICE_HOST, kDefaultScale, 0, nullptr, 0, nullptr, msg, sizeof msg);
  EXPECT_EQ(rc, FT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("cache_seqlens[0] = 32"), std::string::npos) << msg;
  EXPECT_EQ(kc.to_double(), k1);
}

}  // namespace
}  // namespace ft_test
