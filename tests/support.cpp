#include "support.h"

#include "core/element.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <sstream>

namespace ft_test {

using flashtile::Options;

std::uint64_t run_seed() {
  static const std::uint64_t seed = [] {
    std::uint64_t s;
    if (const char* env = std::getenv("FLASHTILE_TEST_SEED"); env != nullptr && *env != '\0') {
      s = std::strtoull(env, nullptr, 10);
    } else {
      std::random_device rd;
      s = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
    }
    std::cout << "[flashtile] test seed " << s << " (replay with FLASHTILE_TEST_SEED=" << s << ")\n";
    return s;
  }();
  return seed;
}

std::mt19937_64 test_rng() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info != nullptr ? std::string(info->test_suite_name()) + "." + info->name() : "";
  return std::mt19937_64(run_seed() ^ std::hash<std::string>{}(name));
}

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::contiguous: return "contig";
    case Layout::heads_major: return "hmajor";
    case Layout::padded: return "padded";
  }
  return "?";
}

namespace {

using flashtile::detail::round_to;

}  // namespace

double eps(DType t) { return flashtile::detail::eps(t); }

Tensor::Tensor(DType dtype, std::vector<std::int64_t> shape, Layout layout) : dtype_(dtype), shape_(std::move(shape)) {
  const int rank = static_cast<int>(shape_.size());
  std::vector<int> order(static_cast<std::size_t>(rank));  // physical position -> logical dim
  for (int i = 0; i < rank; ++i) order[static_cast<std::size_t>(i)] = i;
  if (layout == Layout::heads_major && rank == 4) std::swap(order[1], order[2]);
  std::vector<std::int64_t> stride(static_cast<std::size_t>(rank));
  std::int64_t st = 1;
  for (int pos = rank - 1; pos >= 0; --pos) {
    const int dim = order[static_cast<std::size_t>(pos)];
    stride[static_cast<std::size_t>(dim)] = st;
    std::int64_t extent = std::max<std::int64_t>(shape_[static_cast<std::size_t>(dim)], 1);
    if (layout == Layout::padded && pos == rank - 1) extent += 8;   // padded rows
    st *= extent;
    if (layout == Layout::padded && pos == 1) st += 16;             // gap between batches
  }
  std::int64_t max_off = 0;
  for (int i = 0; i < rank; ++i)
    max_off += std::max<std::int64_t>(shape_[static_cast<std::size_t>(i)] - 1, 0) * stride[static_cast<std::size_t>(i)];
  storage_.assign(static_cast<std::size_t>((max_off + 1) * static_cast<std::int64_t>(flashtile::dtype_size(dtype))), 0);
  view_.data = storage_.data();
  view_.dtype = dtype;
  view_.rank = rank;
  for (int i = 0; i < rank; ++i) {
    view_.shape[static_cast<std::size_t>(i)] = shape_[static_cast<std::size_t>(i)];
    view_.stride[static_cast<std::size_t>(i)] = stride[static_cast<std::size_t>(i)];
  }
  fill(std::numeric_limits<double>::quiet_NaN());  // padding and untouched elements are NaN
}

std::int64_t Tensor::numel() const {
  std::int64_t n = 1;
  for (auto s : shape_) n *= s;
  return n;
}

std::int64_t Tensor::offset(std::int64_t flat) const {
  std::int64_t off = 0;
  for (int i = static_cast<int>(shape_.size()) - 1; i >= 0; --i) {
    const auto d = static_cast<std::size_t>(i);
    off += (flat % shape_[d]) * view_.stride[d];
    flat /= shape_[d];
  }
  return off;
}

double Tensor::get(std::int64_t flat) const {
  return flashtile::detail::load_element(
      storage_.data() + offset(flat) * static_cast<std::int64_t>(flashtile::dtype_size(dtype_)), dtype_);
}

void Tensor::set(std::int64_t flat, double x) {
  unsigned char* base = storage_.data() + offset(flat) * static_cast<std::int64_t>(flashtile::dtype_size(dtype_));
  const float f = round_to(dtype_, static_cast<float>(x));
  switch (dtype_) {
    case DType::float32: std::memcpy(base, &f, 4); break;
    case DType::float16: {
      const _Float16 h = static_cast<_Float16>(f);
      std::memcpy(base, &h, 2);
      break;
    }
    case DType::bfloat16: {
      const auto b = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(f) >> 16);
      std::memcpy(base, &b, 2);
      break;
    }
    case DType::int32: {  // index tensors: x is an integer
      const auto i = static_cast<std::int32_t>(x);
      std::memcpy(base, &i, 4);
      break;
    }
  }
}

void Tensor::fill_normal(std::mt19937_64& rng, double stddev) {
  std::normal_distribution<double> nd(0.0, stddev);
  for (std::int64_t i = 0; i < numel(); ++i) set(i, nd(rng));
}

void Tensor::fill(double x) {
  // Fill every byte of storage, padding included, by writing the value at each element slot.
  const std::size_t es = flashtile::dtype_size(dtype_);
  std::vector<unsigned char> one(es);
  const float f = round_to(dtype_, static_cast<float>(x));
  if (dtype_ == DType::int32) {
    const auto i = std::isfinite(x) ? static_cast<std::int32_t>(x) : std::int32_t{-1};
    std::memcpy(one.data(), &i, 4);
  } else if (dtype_ == DType::float32) {
    std::memcpy(one.data(), &f, 4);
  } else if (dtype_ == DType::float16) {
    const _Float16 h = static_cast<_Float16>(f);
    std::memcpy(one.data(), &h, 2);
  } else {
    const auto b = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(f) >> 16);
    std::memcpy(one.data(), &b, 2);
  }
  for (std::size_t i = 0; i + es <= storage_.size(); i += es) std::memcpy(&storage_[i], one.data(), es);
}

std::vector<double> Tensor::to_double() const {
  std::vector<double> out(static_cast<std::size_t>(numel()));
  for (std::int64_t i = 0; i < numel(); ++i) out[static_cast<std::size_t>(i)] = get(i);
  return out;
}

std::string Case::name() const {
  std::ostringstream s;
  s << "b" << b << "_q" << sq << "_k" << sk << "_h" << hq << "x" << hkv << "_d" << d << "_dv" << dv << "_"
    << (causal ? "causal" : "full") << "_" << flashtile::dtype_name(dtype) << "_" << layout_name(layout);
  return s.str();
}

Problem::Problem(const Case& cs, std::mt19937_64& rng)
    : c(cs),
      q(cs.dtype, {cs.b, cs.sq, cs.hq, cs.d}, cs.layout),
      k(cs.dtype, {cs.b, cs.sk, cs.hkv, cs.d}, cs.layout),
      v(cs.dtype, {cs.b, cs.sk, cs.hkv, cs.dv}, cs.layout),
      out(cs.dtype, {cs.b, cs.sq, cs.hq, cs.dv}, cs.layout),
      lse(DType::float32, {cs.b, cs.hq, cs.sq}, cs.layout == Layout::padded ? Layout::padded : Layout::contiguous),
      dout(cs.dtype, {cs.b, cs.sq, cs.hq, cs.dv}, cs.layout),
      dq(cs.dtype, {cs.b, cs.sq, cs.hq, cs.d}, cs.layout),
      dk(cs.dtype, {cs.b, cs.sk, cs.hkv, cs.d}, cs.layout),
      dv(cs.dtype, {cs.b, cs.sk, cs.hkv, cs.dv}, cs.layout) {
  q.fill_normal(rng);
  k.fill_normal(rng);
  v.fill_normal(rng);
  dout.fill_normal(rng);
}

Options Problem::options(const std::string& backend) const {
  Options o;
  o.causal = c.causal;
  o.backend = backend;
  o.softmax_scale = c.softmax_scale;
  return o;
}

Results oracle(const Problem& p, bool with_backward) {
  Results r;
  const auto f = flashtile::reference::forward(p.q.view(), p.k.view(), p.v.view(), p.options());
  r.out = f.out;
  r.lse = f.lse;
  if (with_backward) {
    auto g = flashtile::reference::backward(p.q.view(), p.k.view(), p.v.view(), p.dout.view(), p.options());
    r.dq = std::move(g.dq);
    r.dk = std::move(g.dk);
    r.dv = std::move(g.dv);
  }
  return r;
}

Results standard_attention(const Problem& p, bool with_backward) {
  const Case& c = p.c;
  const DType t = c.dtype;
  auto rd = [t](double x) { return static_cast<double>(round_to(t, static_cast<float>(x))); };
  const auto q = p.q.to_double(), k = p.k.to_double(), v = p.v.to_double(), g = p.dout.to_double();
  const float scale = c.softmax_scale ? *c.softmax_scale : 1.0f / std::sqrt(static_cast<float>(c.d));
  const std::int64_t group = c.hq / c.hkv;
  Results r;
  r.out.assign(static_cast<std::size_t>(c.b * c.sq * c.hq * c.dv), 0.0);
  r.lse.assign(static_cast<std::size_t>(c.b * c.hq * c.sq), 0.0);
  if (with_backward) {
    r.dq.assign(q.size(), 0.0);
    r.dk.assign(k.size(), 0.0);
    r.dv.assign(v.size(), 0.0);
  }
  auto at = [](std::int64_t s, std::int64_t h, std::int64_t d, std::int64_t b, std::int64_t i, std::int64_t hh) {
    return static_cast<std::size_t>(((b * s + i) * h + hh) * d);
  };
  std::vector<float> S(static_cast<std::size_t>(c.sq * c.sk)), P(S.size()), dP(S.size());
  std::vector<double> mag(static_cast<std::size_t>(c.sk));  // one row's score magnitudes (row_score_sensitivity)
  for (std::int64_t b = 0; b < c.b; ++b)
    for (std::int64_t h = 0; h < c.hq; ++h) {
      const std::int64_t hk = h / group;
      auto visible = [&](std::int64_t i, std::int64_t j) { return !c.causal || j <= i + c.sk - c.sq; };
      for (std::int64_t i = 0; i < c.sq; ++i) {
        float m = -std::numeric_limits<float>::infinity();
        for (std::int64_t j = 0; j < c.sk; ++j) {
          float s = 0.0f;
          double terms = 0.0;
          for (std::int64_t e = 0; e < c.d; ++e) {
            const double qk = q[at(c.sq, c.hq, c.d, b, i, h) + e] * k[at(c.sk, c.hkv, c.d, b, j, hk) + e];
            s += static_cast<float>(qk);
            terms += std::abs(qk);
          }
          mag[static_cast<std::size_t>(j)] = std::abs(scale) * terms;
          s = static_cast<float>(rd(s * scale));
          S[i * c.sk + j] = visible(i, j) ? s : -std::numeric_limits<float>::infinity();
          m = std::max(m, S[i * c.sk + j]);
        }
        // The semantics every backend follows: a NaN or +inf score makes l (and the row) NaN; a row whose
        // scores are all -inf (or that sees no key) has l = 0 and is empty: P = 0, LSE = -inf, O = 0.
        // (m is NaN-blind; a NaN score still reaches l through exp.)
        // l is summed as a vectorised softmax (PyTorch's CPU kernel) sums it: 16 running lane sums, added at the
        // end. A single running float sum over Sk terms near 1 would be a weaker yardstick than any real kernel
        // (its error grows like sqrt(Sk)·eps: 1.4e-5 of max|dV| at Sk = 1024 in Exactness.DominantKey...).
        const float m_ref = m == -INFINITY ? 0.0f : m;
        float lanes[16] = {};
        for (std::int64_t j = 0; j < c.sk; ++j) lanes[j % 16] += (P[i * c.sk + j] = std::exp(S[i * c.sk + j] - m_ref));
        float l = 0.0f;
        for (float x : lanes) l += x;
        for (std::int64_t j = 0; j < c.sk; ++j) P[i * c.sk + j] = l == 0.0f ? 0.0f : static_cast<float>(rd(P[i * c.sk + j] / l));
        r.lse[static_cast<std::size_t>((b * c.hq + h) * c.sq + i)] = l == 0.0f ? -INFINITY : m + std::log(l);
        // Keys a row does not see are left out of every product (a boolean mask, not an additive one, which
        // would let 0 · NaN through), as the semantics ask; so is every key of an empty row.
        const bool empty = l == 0.0f;
        for (std::int64_t e = 0; e < c.dv; ++e) {
          float o = 0.0f;
          for (std::int64_t j = 0; j < c.sk; ++j)
            if (!empty && visible(i, j)) o += P[i * c.sk + j] * static_cast<float>(v[at(c.sk, c.hkv, c.dv, b, j, hk) + e]);
          r.out[at(c.sq, c.hq, c.dv, b, i, h) + e] = rd(o);
        }
        if (!empty)
          r.out_score_sensitivity = std::max(
              r.out_score_sensitivity,
              row_score_sensitivity(c.sk, c.dv, P.data() + i * c.sk, mag.data(),
                                    [&](std::int64_t j, std::int64_t e) { return v[at(c.sk, c.hkv, c.dv, b, j, hk) + e]; },
                                    r.out.data() + at(c.sq, c.hq, c.dv, b, i, h)));
      }
      if (!with_backward) continue;
      for (std::int64_t i = 0; i < c.sq; ++i) {
        if (r.lse[static_cast<std::size_t>((b * c.hq + h) * c.sq + i)] == -INFINITY) {  // empty row: no gradient
          for (std::int64_t j = 0; j < c.sk; ++j) dP[i * c.sk + j] = 0.0f;
          continue;
        }
        float delta = 0.0f;
        for (std::int64_t e = 0; e < c.dv; ++e)
          delta += static_cast<float>(g[at(c.sq, c.hq, c.dv, b, i, h) + e] * r.out[at(c.sq, c.hq, c.dv, b, i, h) + e]);
        for (std::int64_t j = 0; j < c.sk; ++j) {
          dP[i * c.sk + j] = 0.0f;
          if (!visible(i, j)) continue;
          float dp = 0.0f;
          for (std::int64_t e = 0; e < c.dv; ++e)
            dp += static_cast<float>(g[at(c.sq, c.hq, c.dv, b, i, h) + e] * v[at(c.sk, c.hkv, c.dv, b, j, hk) + e]);
          dP[i * c.sk + j] = static_cast<float>(rd(P[i * c.sk + j] * (static_cast<float>(rd(dp)) - delta)));
        }
      }
      for (std::int64_t i = 0; i < c.sq; ++i)
        for (std::int64_t j = 0; j < c.sk; ++j) {
          if (r.lse[static_cast<std::size_t>((b * c.hq + h) * c.sq + i)] == -INFINITY) break;
          if (!visible(i, j)) continue;
          const float ds = dP[i * c.sk + j] * scale, pij = P[i * c.sk + j];
          for (std::int64_t e = 0; e < c.d; ++e) {
            r.dq[at(c.sq, c.hq, c.d, b, i, h) + e] += ds * k[at(c.sk, c.hkv, c.d, b, j, hk) + e];
            r.dk[at(c.sk, c.hkv, c.d, b, j, hk) + e] += ds * q[at(c.sq, c.hq, c.d, b, i, h) + e];
          }
          for (std::int64_t e = 0; e < c.dv; ++e)
            r.dv[at(c.sk, c.hkv, c.dv, b, j, hk) + e] += pij * g[at(c.sq, c.hq, c.dv, b, i, h) + e];
        }
    }
  for (auto* vec : {&r.dq, &r.dk, &r.dv})
    for (double& x : *vec) x = rd(x);
  return r;
}

double max_abs(const std::vector<double>& x) {
  double m = 0.0;
  for (double e : x)
    if (std::isfinite(e)) m = std::max(m, std::abs(e));
  return m;
}

double score_magnitude(const Problem& p) {
  const Case& c = p.c;
  const auto q = p.q.to_double(), k = p.k.to_double();
  const double scale = std::abs(c.softmax_scale ? *c.softmax_scale : 1.0 / std::sqrt(static_cast<double>(c.d)));
  double m = 0.0;
  for (std::int64_t b = 0; b < c.b; ++b)
    for (std::int64_t h = 0; h < c.hq; ++h)
      for (std::int64_t i = 0; i < c.sq; ++i)
        for (std::int64_t j = 0; j < c.sk; ++j) {
          if (c.causal && j > i + c.sk - c.sq) continue;
          const double* qi = q.data() + ((b * c.sq + i) * c.hq + h) * c.d;
          const double* kj = k.data() + ((b * c.sk + j) * c.hkv + h / (c.hq / c.hkv)) * c.d;
          double sum = 0.0;
          for (std::int64_t e = 0; e < c.d; ++e) sum += std::abs(qi[e] * kj[e]);
          if (std::isfinite(sum)) m = std::max(m, scale * sum);
        }
  return m;
}

double backward_magnitude(const Results& ref) {
  const double grads = std::max({max_abs(ref.dq), max_abs(ref.dk), max_abs(ref.dv)});
  return grads * (1.0 + max_abs(ref.lse));
}

double max_abs_error(const std::vector<double>& got, const std::vector<double>& ref) {
  if (got.size() != ref.size()) return std::numeric_limits<double>::infinity();
  double m = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double a = got[i], b = ref[i];
    if (std::isnan(a) || std::isnan(b)) {
      if (std::isnan(a) != std::isnan(b)) return std::numeric_limits<double>::infinity();
      continue;
    }
    if (std::isinf(a) || std::isinf(b)) {
      if (a != b) return std::numeric_limits<double>::infinity();
      continue;
    }
    m = std::max(m, std::abs(a - b));
  }
  return m;
}

double tolerance(double std_err, const std::vector<double>& ref, DType dtype, double magnitude, double score_sensitivity) {
  return 2.0 * std_err + 8.0 * eps(dtype) * std::max({max_abs(ref), magnitude, 1e-3}) +
         8.0 * eps(DType::float32) * score_sensitivity;
}

void expect_close(const char* what, const std::vector<double>& got, const std::vector<double>& standard,
                  const std::vector<double>& ref, DType dtype, double magnitude, double score_sensitivity) {
  const double err = max_abs_error(got, ref);
  const double std_err = max_abs_error(standard, ref);
  // A yardstick that disagrees with the oracle on where NaN and Inf are would make the tolerance infinite and
  // the comparison vacuous.
  EXPECT_TRUE(std::isfinite(std_err)) << what << ": standard attention disagrees with the oracle's NaN/Inf pattern";
  const double tol = tolerance(std_err, ref, dtype, magnitude, score_sensitivity);
  if (const char* v = std::getenv("FLASHTILE_TEST_VERBOSE"); v != nullptr && *v == '1')
    std::cout << "[flashtile] " << what << ": error " << err << " standard " << std_err << " tolerance " << tol
              << " ratio " << err / tol << "\n";
  EXPECT_LE(err, tol) << what << ": FlashTile max error " << err << ", standard attention in "
                      << flashtile::dtype_name(dtype) << " " << std_err << ", tolerance " << tol;
}

std::string bf16_products_of(std::string_view isa) {
  if (isa == "avx512-amx") return "AMX tiles (tdpbf16ps)";
  if (isa == "avx2-amxemu") return "AMX tiles, emulated";
  if (isa == "avx512-bf16") return "vdpbf16ps pairs";
  if (isa == "avx2-bf16emu") return "bf16 dot-product pairs, emulated on FMAs";
  return "float32 FMAs on converted tiles";
}

ScopedCpuIsa::ScopedCpuIsa(const char* value) {
  const char* now = std::getenv("FLASHTILE_CPU_ISA");
  had_ = now != nullptr;
  if (had_) old_ = now;
  set(value);
}

ScopedCpuIsa::~ScopedCpuIsa() { set(had_ ? old_.c_str() : nullptr); }

void ScopedCpuIsa::set(const char* value) {
  if (value != nullptr) {
    setenv("FLASHTILE_CPU_ISA", value, 1);
  } else {
    unsetenv("FLASHTILE_CPU_ISA");
  }
}

void compare_with_oracle(const Problem& p) {
  const Results ref = oracle(p, true);
  const Results st = standard_attention(p, true);
  expect_close("out", p.out.to_double(), st.out, ref.out, p.c.dtype, 0.0, st.out_score_sensitivity);
  expect_close("lse", p.lse.to_double(), st.lse, ref.lse, p.c.dtype, score_magnitude(p));
  const double mag = backward_magnitude(ref);
  expect_close("dq", p.dq.to_double(), st.dq, ref.dq, p.c.dtype, mag);
  expect_close("dk", p.dk.to_double(), st.dk, ref.dk, p.c.dtype, mag);
  expect_close("dv", p.dv.to_double(), st.dv, ref.dv, p.c.dtype, mag);
}

}  // namespace ft_test
