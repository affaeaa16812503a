// Every bad input gets a typed error whose message names the argument and the values it got.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "support.h"

namespace ft_test {
namespace {

using flashtile::DTypeError;
using flashtile::Error;
using flashtile::InvalidArgument;
using flashtile::Options;
using flashtile::TensorView;

struct Views {
  TensorView q, k, v, out, lse, dout, dq, dk, dv;
  Options o;
};

enum class Kind { invalid, dtype, device, unsupported };

struct BadCase {
  const char* name;
  std::function<void(Views&)> mutate;
  Kind kind;
  std::vector<std::string> must_mention;
  bool forward_only = false;  // out is an output of forward but an input of backward
};

template <class E>
bool is(const Error& e) {
  return dynamic_cast<const E*>(&e) != nullptr;
}

void check_both(const Problem& p, const BadCase& bc) {
  Views v{p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.lse.view(), p.dout.view(), p.dq.view(), p.dk.view(),
          p.dv.view(), p.options()};
  bc.mutate(v);
  auto fwd = [&] { flashtile::forward(v.q, v.k, v.v, v.out, v.lse, v.o); };
  auto bwd = [&] { flashtile::backward(v.q, v.k, v.v, v.out, v.dout, v.lse, v.dq, v.dk, v.dv, v.o); };
  for (auto& [label, call] : {std::pair<const char*, std::function<void()>>{"forward", fwd}, {"backward", bwd}}) {
    if (bc.forward_only && std::string(label) == "backward") continue;
    SCOPED_TRACE(std::string(bc.name) + " / " + label);
    try {
      call();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      switch (bc.kind) {
        case Kind::invalid: EXPECT_TRUE(is<InvalidArgument>(e)) << msg; break;
        case Kind::dtype: EXPECT_TRUE(is<DTypeError>(e)) << msg; break;
        case Kind::device: EXPECT_TRUE(is<flashtile::DeviceError>(e)) << msg; break;
        case Kind::unsupported: EXPECT_TRUE(is<flashtile::UnsupportedError>(e)) << msg; break;
      }
      for (const std::string& word : bc.must_mention) EXPECT_NE(msg.find(word), std::string::npos) << "'" << word << "' not in: " << msg;
    }
  }
}

std::vector<BadCase> bad_cases() {
  return {
      {"q rank", [](Views& v) { v.q.rank = 3; }, Kind::invalid, {"q", "4 dimensions", "3"}},
      {"k batch", [](Views& v) { v.k.shape[0] = 3; }, Kind::invalid, {"k", "B = 2", "[3, "}},
      {"k head dim", [](Views& v) { v.k.shape[3] = 16; }, Kind::invalid, {"k", "D = 32"}},
      {"v seqlen", [](Views& v) { v.v.shape[1] = 9; }, Kind::invalid, {"v", "[2, 10, 2, 48]", "[2, 9, 2, 48]"}},
      {"v heads", [](Views& v) { v.v.shape[2] = 1; }, Kind::invalid, {"v", "[2, 10, 1, 48]"}},
      {"out shape", [](Views& v) { v.out.shape[3] = 32; }, Kind::invalid, {"out", "[2, 7, 4, 48]", "[2, 7, 4, 32]"}},
      {"lse shape", [](Views& v) { v.lse.shape[2] = 8; }, Kind::invalid, {"lse", "[2, 4, 7]", "[2, 4, 8]"}},
      {"gqa ratio", [](Views& v) { v.k.shape[2] = 3; v.v.shape[2] = 3; }, Kind::invalid, {"Hq = 4", "Hkv = 3"}},
      {"head dim 0", [](Views& v) { v.q.shape[3] = 0; }, Kind::invalid, {"q", "D = 0", "256"}},
      {"head dim 264", [](Views& v) { v.q.shape[3] = 264; }, Kind::invalid, {"q", "D = 264", "256"}},
      {"dv 300", [](Views& v) { v.v.shape[3] = 300; }, Kind::invalid, {"v", "Dv = 300"}},
      {"null q", [](Views& v) { v.q.data = nullptr; }, Kind::invalid, {"q", "null"}},
      {"null lse", [](Views& v) { v.lse.data = nullptr; }, Kind::invalid, {"lse", "null"}},
      {"q last stride", [](Views& v) { v.q.stride[3] = 2; }, Kind::invalid, {"q", "contiguous", "2"}},
      {"negative stride", [](Views& v) { v.k.stride[1] = -64; }, Kind::invalid, {"k", "negative", "-64"}},
      {"negative size", [](Views& v) { v.q.shape[1] = -1; }, Kind::invalid, {"q", "negative"}},
      {"k dtype", [](Views& v) { v.k.dtype = DType::float16; }, Kind::dtype, {"k", "float16", "float32"}},
      {"out dtype", [](Views& v) { v.out.dtype = DType::bfloat16; }, Kind::dtype, {"out", "bfloat16"}},
      {"lse dtype", [](Views& v) { v.lse.dtype = DType::float16; }, Kind::dtype, {"lse", "float16", "float32"}},
      {"offset overflow", [](Views& v) { v.q.stride[0] = std::int64_t{1} << 62; }, Kind::invalid, {"q", "overflows"}},
      {"numel overflow",
       [](Views& v) {
         v.q.shape[0] = std::int64_t{1} << 40;
         v.q.stride[0] = 1 << 10;
         v.q.shape[1] = std::int64_t{1} << 30;
         v.q.stride[1] = 0;
       },
       Kind::invalid,
       {"q", "overflow"}},
      {"device mix", [](Views& v) { v.k.device = flashtile::Device::cuda; }, Kind::device, {"k", "cuda", "cpu"}},
      {"overlapping output", [](Views& v) { v.out.stride[1] = 0; }, Kind::invalid, {"out", "overlap"}, true},
      {"out aliases q", [](Views& v) { v.out.data = v.q.data; v.out.dtype = v.q.dtype; }, Kind::invalid, {"out", "overlaps input q"}, true},
      {"nan scale", [](Views& v) { v.o.softmax_scale = std::nanf(""); }, Kind::invalid, {"softmax_scale"}},
      {"threads", [](Views& v) { v.o.num_threads = -2; }, Kind::invalid, {"num_threads", "-2"}},
      {"sm_margin", [](Views& v) { v.o.sm_margin = -3; }, Kind::invalid, {"sm_margin", "-3"}},
      {"unknown backend", [](Views& v) { v.o.backend = "tpu"; }, Kind::invalid, {"tpu", "cpu-flash"}},
      {"misaligned q", [](Views& v) { v.q.data = static_cast<char*>(v.q.data) + 2; }, Kind::invalid,
       {"q", "aligned", "4-byte"}},
      {"q rank 5", [](Views& v) { v.q.rank = 5; }, Kind::invalid, {"q", "4 dimensions", "got 5"}},
      {"lse rank -1", [](Views& v) { v.lse.rank = -1; }, Kind::invalid, {"lse", "3 dimensions", "got -1"}},
      {"workspace bytes without memory", [](Views& v) { v.o.workspace_bytes = 4096; }, Kind::invalid,
       {"workspace", "4096"}},
      {"misaligned workspace",
       [](Views& v) {
         v.o.workspace = static_cast<char*>(v.dq.data) + 4;
         v.o.workspace_bytes = 64;
       },
       Kind::invalid, {"workspace", "256-byte"}},
      {"all on cuda, no cuda backend can run",
       [](Views& v) {
         for (TensorView* t : {&v.q, &v.k, &v.v, &v.out, &v.lse, &v.dout, &v.dq, &v.dk, &v.dv})
           t->device = flashtile::Device::cuda;
       },
       Kind::unsupported,
       {"cpu-flash", "device:"}},
  };
}

// A stride of INT64_MAX on a dim of size 2 reaches exactly INT64_MAX as the largest offset: the end offset
// (one past it) overflows and must be reported, not computed.
TEST(Validation, LargestOffsetAtInt64MaxIsReported) {
  float x[4] = {};
  TensorView q = flashtile::make_view(x, DType::float32, {2, 1, 1, 1}, {INT64_MAX, 1, 1, 1});
  TensorView out = flashtile::make_view(x + 2, DType::float32, {2, 1, 1, 1});
  TensorView lse = flashtile::make_view(x, DType::float32, {2, 1, 1});
  try {
    flashtile::forward(q, q, q, out, lse);
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("overflows"), std::string::npos) << e.what();
  }
}

// Hq = 0 query heads against Hkv = 2: no output rows, but dK and dV exist and are zero.
TEST(Validation, BackwardWithoutQueryHeadsWritesZeroKeyGradients) {
  auto rng = test_rng();
  Case c;
  c.b = 2;
  c.sq = 3;
  c.sk = 5;
  c.hq = 0;
  c.hkv = 2;
  c.d = c.dv = 8;
  Problem p(c, rng);
  p.dk.fill(7.0);
  p.dv.fill(7.0);
  flashtile::backward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.dout.view(), p.lse.view(), p.dq.view(),
                      p.dk.view(), p.dv.view(), p.options());
  for (double x : p.dk.to_double()) EXPECT_EQ(x, 0.0);
  for (double x : p.dv.to_double()) EXPECT_EQ(x, 0.0);
}

// CPU backends need no scratch memory; the query validates like the call itself.
TEST(Validation, BackwardWorkspaceBytes) {
  auto rng = test_rng();
  Case c;
  c.sq = 5;
  c.sk = 9;
  c.d = c.dv = 16;
  Problem p(c, rng);
  const auto bytes = [&](const TensorView& q) {
    return flashtile::backward_workspace_bytes(q, p.k.view(), p.v.view(), p.out.view(), p.dout.view(), p.lse.view(),
                                               p.dq.view(), p.dk.view(), p.dv.view(), p.options());
  };
  EXPECT_EQ(bytes(p.q.view()), 0u);
  TensorView bad = p.q.view();
  bad.rank = 3;
  EXPECT_THROW(bytes(bad), InvalidArgument);
}

TEST(Validation, EveryBadInputIsATypedErrorNamingTheArgument) {
  auto rng = test_rng();
  Case c;
  c.b = 2;
  c.sq = 7;
  c.sk = 10;
  c.hq = 4;
  c.hkv = 2;
  c.d = 32;
  c.dv = 48;
  Problem p(c, rng);
  for (const BadCase& bc : bad_cases()) check_both(p, bc);
}

TEST(Validation, BackwardChecksItsOwnTensors) {
  auto rng = test_rng();
  Case c;
  c.sq = 5;
  c.sk = 6;
  c.d = c.dv = 16;
  Problem p(c, rng);
  auto expect = [&](const char* arg, auto mutate) {
    Views v{p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.lse.view(), p.dout.view(), p.dq.view(), p.dk.view(),
            p.dv.view(), p.options()};
    mutate(v);
    try {
      flashtile::backward(v.q, v.k, v.v, v.out, v.dout, v.lse, v.dq, v.dk, v.dv, v.o);
      ADD_FAILURE() << arg << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(arg), std::string::npos) << e.what();
    }
  };
  expect("dout", [](Views& v) { v.dout.shape[1] = 4; });
  expect("dout", [](Views& v) { v.dout.dtype = DType::float16; });
  expect("dq", [](Views& v) { v.dq.shape[3] = 8; });
  expect("dk", [](Views& v) { v.dk.shape[1] = 5; });
  expect("dv", [](Views& v) { v.dv.data = nullptr; });
  expect("dk", [](Views& v) { v.dk.data = v.dq.data; });  // outputs must not overlap each other
}

TEST(Validation, ViewConstructionRejectsBadRank) {
  float x = 0;
  EXPECT_THROW(flashtile::make_view(&x, DType::float32, {1, 1, 1, 1, 1}), InvalidArgument);
  EXPECT_THROW(flashtile::make_view(&x, DType::float32, {1, 1}, {1}), InvalidArgument);
}

TEST(Validation, ReferenceRejectsOutOfRangeRows) {
  auto rng = test_rng();
  Case c;
  c.sq = 5;
  Problem p(c, rng);
  EXPECT_THROW(flashtile::reference::forward_rows(p.q.view(), p.k.view(), p.v.view(), {0, 5}), InvalidArgument);
}

}  // namespace
}  // namespace ft_test
