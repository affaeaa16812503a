// merge_attention_states (include/flashtile/merge.h): the keys split into parts, each part's forward merged,
// against one forward over every key; in place, packed, 16-bit outputs; and every refusal.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "flashtile/flashtile.h"

namespace {

using flashtile::DType;
using flashtile::TensorView;

struct Parts {
  std::int64_t b = 2, sq = 5, h = 3, d = 16;
  std::vector<std::int64_t> splits;  // key counts of the parts
  std::vector<float> q, k, v;
  std::int64_t sk() const {
    std::int64_t n = 0;
    for (auto s : splits) n += s;
    return n;
  }
};

Parts make_parts(std::vector<std::int64_t> splits, std::uint64_t seed, std::int64_t batch = 2) {
  Parts p;
  p.b = batch;
  p.splits = std::move(splits);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  auto fill = [&](std::vector<float>& x, std::int64_t count) {
    x.resize(static_cast<std::size_t>(count));
    for (float& e : x) e = n(rng);
  };
  fill(p.q, p.b * p.sq * p.h * p.d);
  fill(p.k, p.b * p.sk() * p.h * p.d);
  fill(p.v, p.b * p.sk() * p.h * p.d);
  return p;
}

// Keys [k0, k0 + n) of a contiguous [B, Sk, H, D] tensor, as a view with the full tensor's strides.
TensorView key_slice(std::vector<float>& x, const Parts& p, std::int64_t k0, std::int64_t n) {
  const std::int64_t sk = p.sk();
  return flashtile::make_view(x.data() + k0 * p.h * p.d, DType::float32, {p.b, n, p.h, p.d},
                              {sk * p.h * p.d, p.h * p.d, p.d, 1});
}

struct Result {
  std::vector<float> out, lse;
};

// forward() over keys [k0, k0 + n) on the float64 oracle backend.
Result attend(Parts& p, std::int64_t k0, std::int64_t n) {
  Result r{std::vector<float>(static_cast<std::size_t>(p.b * p.sq * p.h * p.d)),
           std::vector<float>(static_cast<std::size_t>(p.b * p.h * p.sq))};
  flashtile::Options o;
  o.backend = "cpu-reference";
  o.strict = true;
  o.softmax_scale = 0.25f;
  flashtile::forward(flashtile::make_view(p.q.data(), DType::float32, {p.b, p.sq, p.h, p.d}), key_slice(p.k, p, k0, n),
                     key_slice(p.v, p, k0, n), flashtile::make_view(r.out.data(), DType::float32, {p.b, p.sq, p.h, p.d}),
                     flashtile::make_view(r.lse.data(), DType::float32, {p.b, p.h, p.sq}), o);
  return r;
}

std::vector<Result> attend_parts(Parts& p) {
  std::vector<Result> parts;
  std::int64_t k0 = 0;
  for (auto n : p.splits) {
    parts.push_back(attend(p, k0, n));
    k0 += n;
  }
  return parts;
}

// The merge's own error: each weight exp(lse_i - max) / sum carries a relative error of a few float32 eps per
// unit of |lse_i - max| (below 10 here) and the sum over parts adds one eps per part; 64 eps of the largest value
// bounds that with room, while a wrong weight (a missing part, a swapped exponent) is off by ~1e-1.
constexpr double kEps32 = 0x1p-23;

void expect_merged(const std::vector<float>& got_out, const std::vector<float>& got_lse, const Result& full,
                   double out_eps) {
  double vmax = 0;
  for (float x : full.out) vmax = std::max(vmax, std::fabs(double(x)));
  for (std::size_t i = 0; i < full.out.size(); ++i)
    ASSERT_NEAR(got_out[i], full.out[i], (64 * kEps32 + out_eps) * vmax) << "out element " << i;
  for (std::size_t i = 0; i < full.lse.size(); ++i)
    ASSERT_NEAR(got_lse[i], full.lse[i], 64 * kEps32 * (1 + std::fabs(double(full.lse[i])))) << "lse element " << i;
}

TEST(Merge, PartsEqualOneCall) {
  for (auto splits : std::vector<std::vector<std::int64_t>>{{7, 9}, {1, 30}, {4, 0, 11}, {5, 6, 7, 8}, {13}}) {
    Parts p = make_parts(splits, 1000 + splits.size());
    const Result full = attend(p, 0, p.sk());
    std::vector<Result> parts = attend_parts(p);
    std::vector<TensorView> outs, lses;
    for (Result& r : parts) {
      outs.push_back(flashtile::make_view(r.out.data(), DType::float32, {p.b, p.sq, p.h, p.d}));
      lses.push_back(flashtile::make_view(r.lse.data(), DType::float32, {p.b, p.h, p.sq}));
    }
    std::vector<float> out(full.out.size(), NAN), lse(full.lse.size(), NAN);
    flashtile::merge_attention_states(outs, lses, flashtile::make_view(out.data(), DType::float32, {p.b, p.sq, p.h, p.d}),
                                      flashtile::make_view(lse.data(), DType::float32, {p.b, p.h, p.sq}));
    SCOPED_TRACE("parts " + std::to_string(splits.size()));
    expect_merged(out, lse, full, 0);
  }
}

TEST(Merge, InPlaceTwoPartFormAndEmptyParts) {
  Parts p = make_parts({10, 6}, 77);
  const Result full = attend(p, 0, p.sk());
  std::vector<Result> parts = attend_parts(p);
  const TensorView oa = flashtile::make_view(parts[0].out.data(), DType::float32, {p.b, p.sq, p.h, p.d});
  const TensorView la = flashtile::make_view(parts[0].lse.data(), DType::float32, {p.b, p.h, p.sq});
  flashtile::merge_attention_states(oa, la, flashtile::make_view(parts[1].out.data(), DType::float32, {p.b, p.sq, p.h, p.d}),
                                    flashtile::make_view(parts[1].lse.data(), DType::float32, {p.b, p.h, p.sq}), oa, la);
  expect_merged(parts[0].out, parts[0].lse, full, 0);

  // Every part empty: out = 0, lse = -inf, as a row without keys.
  Parts e = make_parts({0, 0}, 78);
  std::vector<Result> empty = attend_parts(e);
  std::vector<float> out(empty[0].out.size(), NAN), lse(empty[0].lse.size(), NAN);
  flashtile::merge_attention_states(
      flashtile::make_view(empty[0].out.data(), DType::float32, {e.b, e.sq, e.h, e.d}),
      flashtile::make_view(empty[0].lse.data(), DType::float32, {e.b, e.h, e.sq}),
      flashtile::make_view(empty[1].out.data(), DType::float32, {e.b, e.sq, e.h, e.d}),
      flashtile::make_view(empty[1].lse.data(), DType::float32, {e.b, e.h, e.sq}),
      flashtile::make_view(out.data(), DType::float32, {e.b, e.sq, e.h, e.d}),
      flashtile::make_view(lse.data(), DType::float32, {e.b, e.h, e.sq}));
  for (float x : out) EXPECT_EQ(x, 0.f);
  for (float x : lse) EXPECT_TRUE(std::isinf(x) && x < 0);
}

// Packed [T, H, Dv] / [H, T] views (batch 1 here, so the packed rows are the sequence's) and a bfloat16 output:
// its rounding (eps 2^-8 relative) is the only error added.
TEST(Merge, PackedAndBfloat16) {
  Parts p = make_parts({9, 8}, 91, 1);
  const Result full = attend(p, 0, p.sk());
  std::vector<Result> parts = attend_parts(p);
  std::vector<TensorView> outs, lses;
  for (Result& r : parts) {
    outs.push_back(flashtile::make_view(r.out.data(), DType::float32, {p.sq, p.h, p.d}));
    lses.push_back(flashtile::make_view(r.lse.data(), DType::float32, {p.h, p.sq}));
  }
  std::vector<float> out(full.out.size(), NAN), lse(full.lse.size(), NAN);
  flashtile::merge_attention_states(outs, lses, flashtile::make_view(out.data(), DType::float32, {p.sq, p.h, p.d}),
                                    flashtile::make_view(lse.data(), DType::float32, {p.h, p.sq}));
  expect_merged(out, lse, full, 0);

  // bfloat16 parts and output: the parts rounded to bf16 first, so the reference is the merge of those values.
  auto to_bf16 = [](float x) {
    std::uint32_t u;
    std::memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return static_cast<std::uint16_t>(u);
  };
  std::vector<std::vector<std::uint16_t>> b16(parts.size());
  std::vector<TensorView> outs16;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    for (float x : parts[i].out) b16[i].push_back(to_bf16(x));
    outs16.push_back(flashtile::make_view(b16[i].data(), DType::bfloat16, {p.sq, p.h, p.d}));
  }
  std::vector<std::uint16_t> out16(full.out.size());
  flashtile::merge_attention_states(outs16, lses, flashtile::make_view(out16.data(), DType::bfloat16, {p.sq, p.h, p.d}),
                                    flashtile::make_view(lse.data(), DType::float32, {p.h, p.sq}));
  std::vector<float> widened;
  for (std::uint16_t u : out16) {
    const std::uint32_t w = static_cast<std::uint32_t>(u) << 16;
    float x;
    std::memcpy(&x, &w, 4);
    widened.push_back(x);
  }
  // Parts rounded (2^-9 relative each) and the output rounded (2^-9): 3 · 2^-9 of the largest value.
  expect_merged(widened, lse, full, 3 * 0x1p-9);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const flashtile::Error& e) {
    return e.what();
  }
  return "";
}

TEST(Merge, Refusals) {
  std::vector<float> a(2 * 3 * 4 * 8, 1.f), b(a.size(), 1.f), la(2 * 4 * 3, 0.f), lb(la.size(), 0.f);
  std::vector<float> out(a.size(), 7.f), lse(la.size(), 7.f);
  std::vector<std::int32_t> ints(la.size());
  auto o4 = [](std::vector<float>& x) { return flashtile::make_view(x.data(), DType::float32, {2, 3, 4, 8}); };
  auto l3 = [](std::vector<float>& x) { return flashtile::make_view(x.data(), DType::float32, {2, 4, 3}); };
  struct Bad {
    std::string expect;
    std::function<void()> call;
  };
  const std::vector<Bad> cases = {
      {"at least one part", [&] { flashtile::merge_attention_states({}, {}, o4(out), l3(lse)); }},
      {"one lse per part",
       [&] {
         const TensorView outs[] = {o4(a), o4(b)};
         const TensorView lses[] = {l3(la)};
         flashtile::merge_attention_states(outs, lses, o4(out), l3(lse));
       }},
      {"outs[1]: shape", [&] {
         flashtile::merge_attention_states(o4(a), l3(la), flashtile::make_view(b.data(), DType::float32, {2, 3, 4, 4}),
                                           l3(lb), o4(out), l3(lse));
       }},
      {"lses[0]: dtype int32", [&] {
         flashtile::merge_attention_states(o4(a), flashtile::make_view(ints.data(), DType::int32, {2, 4, 3}), o4(b),
                                           l3(lb), o4(out), l3(lse));
       }},
      {"differs from out's float32", [&] {
         flashtile::merge_attention_states(o4(a), l3(la), flashtile::make_view(b.data(), DType::bfloat16, {2, 3, 4, 8}),
                                           l3(lb), o4(out), l3(lse));
       }},
      {"lse: shape", [&] {
         flashtile::merge_attention_states(o4(a), l3(la), o4(b), l3(lb), o4(out),
                                           flashtile::make_view(lse.data(), DType::float32, {2, 3, 4}));
       }},
      {"overlaps outs[0]", [&] {
         flashtile::merge_attention_states(o4(a), l3(la), o4(b), l3(lb),
                                           flashtile::make_view(a.data() + 8, DType::float32, {2, 3, 4, 8}), l3(lse));
       }},
      {"tensors are on cuda", [&] {
         TensorView x = o4(a);
         x.device = flashtile::Device::cuda;
         flashtile::merge_attention_states(x, l3(la), o4(b), l3(lb), o4(out), l3(lse));
       }},
  };
  for (const Bad& c : cases) {
    const std::string err = error_of(c.call);
    EXPECT_NE(err.find(c.expect), std::string::npos) << "expected '" << c.expect << "', got '" << err << "'";
    EXPECT_NE(err.find("merge_attention_states"), std::string::npos) << err;
  }
  // A refused call wrote nothing.
  for (float x : out) ASSERT_EQ(x, 7.f);
  for (float x : lse) ASSERT_EQ(x, 7.f);
}

}  // namespace
