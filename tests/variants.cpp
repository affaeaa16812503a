#include "variants.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/element.h"

namespace ft_test {

using flashtile::Options;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::unique_ptr<Tensor> tensor(DType t, std::vector<std::int64_t> shape, Layout layout = Layout::contiguous) {
  return std::make_unique<Tensor>(t, std::move(shape), layout);
}

std::vector<std::int64_t> prefix(const std::vector<std::int64_t>& lens) {
  std::vector<std::int64_t> cu{0};
  for (std::int64_t x : lens) cu.push_back(cu.back() + x);
  return cu;
}

// The window rule, written out once more here (the test's own copy, as the oracle has its own).
bool visible(const VarCase& c, std::int64_t sq, std::int64_t sk, std::int64_t i, std::int64_t j) {
  const std::int64_t left = c.window[0], right = c.causal ? 0 : c.window[1], diag = i + sk - sq;
  return (left < 0 || j >= diag - left) && (right < 0 || j <= diag + right);
}

}  // namespace

VarProblem::VarProblem(const VarCase& cs, std::mt19937_64& rng) : c(cs) {
  const std::int64_t B = c.batch();
  if (c.varlen()) {
    cu_q = prefix(c.lens_q);
    cu_k = prefix(c.lens_k);
    total_q = cu_q.back();
    total_k = cu_k.back();
    max_q = *std::max_element(c.lens_q.begin(), c.lens_q.end());
    max_k = *std::max_element(c.lens_k.begin(), c.lens_k.end());
  } else {
    total_q = c.b * c.sq;
    total_k = c.b * c.sk;
  }
  auto q_like = [&](std::int64_t dim) {
    return c.varlen() ? std::vector<std::int64_t>{total_q, c.hq, dim} : std::vector<std::int64_t>{c.b, c.sq, c.hq, dim};
  };
  auto k_like = [&](std::int64_t dim) {
    return c.varlen() ? std::vector<std::int64_t>{total_k, c.hkv, dim}
                      : std::vector<std::int64_t>{c.b, c.sk, c.hkv, dim};
  };
  q = tensor(c.dtype, q_like(c.d), c.layout);
  k = tensor(c.dtype, k_like(c.d), c.layout);
  v = tensor(c.dtype, k_like(c.dv), c.layout);
  out = tensor(c.dtype, q_like(c.dv), c.layout);
  dout = tensor(c.dtype, q_like(c.dv), c.layout);
  dq = tensor(c.dtype, q_like(c.d), c.layout);
  dk = tensor(c.dtype, k_like(c.d), c.layout);
  dv = tensor(c.dtype, k_like(c.dv), c.layout);
  lse = tensor(DType::float32, c.varlen() ? std::vector<std::int64_t>{c.hq, total_q} : std::vector<std::int64_t>{c.b, c.hq, c.sq},
               c.layout == Layout::padded ? Layout::padded : Layout::contiguous);
  q->fill_normal(rng, c.data_scale);
  k->fill_normal(rng, c.data_scale);
  v->fill_normal(rng);
  dout->fill_normal(rng);
  if (c.varlen()) {
    cu_seqlens_q = tensor(DType::int32, {B + 1});
    cu_seqlens_k = tensor(DType::int32, {B + 1});
    for (std::int64_t i = 0; i <= B; ++i) {
      cu_seqlens_q->set(i, static_cast<double>(cu_q[static_cast<std::size_t>(i)]));
      cu_seqlens_k->set(i, static_cast<double>(cu_k[static_cast<std::size_t>(i)]));
    }
  }
  if (!c.seqused_k.empty()) {
    seqused = tensor(DType::int32, {B});
    for (std::int64_t i = 0; i < B; ++i) seqused->set(i, static_cast<double>(c.seqused_k[static_cast<std::size_t>(i)]));
  }
  if (c.alibi != 0) {
    // BLOOM's slopes 2^(−8 (h + 1) / Hq), varied per sequence in the [B, Hq] form.
    alibi = c.alibi == 1 ? tensor(DType::float32, {c.hq}) : tensor(DType::float32, {B, c.hq});
    for (std::int64_t b = 0; b < (c.alibi == 1 ? 1 : B); ++b)
      for (std::int64_t h = 0; h < c.hq; ++h)
        alibi->set(b * c.hq + h, std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(c.hq)) *
                                     (1.0 + 0.5 * static_cast<double>(b)));
  }
  if (c.sinks) {
    sinks = tensor(DType::float32, {c.hq});
    dsinks = tensor(DType::float32, {c.hq});
    std::normal_distribution<double> nd(1.0, 1.0);
    for (std::int64_t h = 0; h < c.hq; ++h) sinks->set(h, nd(rng));
  }
}

std::int64_t VarProblem::len_q(std::int64_t b) const { return c.varlen() ? c.lens_q[static_cast<std::size_t>(b)] : c.sq; }
std::int64_t VarProblem::len_k(std::int64_t b) const {
  if (!c.seqused_k.empty()) return c.seqused_k[static_cast<std::size_t>(b)];
  return c.varlen() ? c.lens_k[static_cast<std::size_t>(b)] : c.sk;
}

Options VarProblem::options(const std::string& backend, bool backward) const {
  Options o;
  o.backend = backend;
  o.causal = c.causal;
  o.window_size = c.window;
  o.softcap = c.softcap;
  if (alibi) o.alibi_slopes = alibi->view();
  if (sinks) o.sinks = sinks->view();
  if (sinks && backward) o.dsinks = dsinks->view();
  if (c.varlen()) {
    o.cu_seqlens_q = cu_seqlens_q->view();
    o.cu_seqlens_k = cu_seqlens_k->view();
    o.max_seqlen_q = max_q;
    o.max_seqlen_k = max_k;
  }
  if (seqused) o.seqused_k = seqused->view();
  return o;
}

void VarProblem::forward(const std::string& backend) {
  flashtile::forward(q->view(), k->view(), v->view(), out->view(), lse->view(), options(backend));
}

void VarProblem::backward(const std::string& backend) {
  flashtile::backward(q->view(), k->view(), v->view(), out->view(), dout->view(), lse->view(), dq->view(), dk->view(),
                      dv->view(), options(backend, true));
}

VarResults var_oracle(const VarProblem& p, bool with_backward) {
  VarResults r;
  const Options o = p.options();
  auto f = flashtile::reference::forward(p.q->view(), p.k->view(), p.v->view(), o);
  r.out = std::move(f.out);
  r.lse = std::move(f.lse);
  if (with_backward) {
    auto g = flashtile::reference::backward(p.q->view(), p.k->view(), p.v->view(), p.dout->view(), o);
    r.dq = std::move(g.dq);
    r.dk = std::move(g.dk);
    r.dv = std::move(g.dv);
    r.dsinks = std::move(g.dsinks);
  }
  return r;
}

VarResults var_standard(const VarProblem& p, bool with_backward) {
  const VarCase& c = p.c;
  const DType t = c.dtype;
  auto rd = [t](double x) { return static_cast<double>(flashtile::detail::round_to(t, static_cast<float>(x))); };
  const auto q = p.q->to_double(), k = p.k->to_double(), v = p.v->to_double(), g = p.dout->to_double();
  const std::vector<double> slopes = p.alibi ? p.alibi->to_double() : std::vector<double>{};
  const std::vector<double> sinks = p.sinks ? p.sinks->to_double() : std::vector<double>{};
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  const std::int64_t group = c.hq / c.hkv, B = c.batch();
  VarResults r;
  r.out.assign(static_cast<std::size_t>(p.total_q * c.hq * c.dv), 0.0);
  r.lse.assign(static_cast<std::size_t>(p.total_q * c.hq), 0.0);
  if (with_backward) {
    r.dq.assign(q.size(), 0.0);
    r.dk.assign(k.size(), 0.0);
    r.dv.assign(v.size(), 0.0);
    r.dsinks.assign(sinks.size(), 0.0);
  }
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t sq = p.len_q(b), sk = p.len_k(b);
    const std::int64_t qr = c.varlen() ? p.q_row0(b) : b * c.sq, kr = c.varlen() ? p.k_row0(b) : b * c.sk;
    auto qi = [&](std::int64_t i, std::int64_t h) { return static_cast<std::size_t>(((qr + i) * c.hq + h) * c.d); };
    auto oi = [&](std::int64_t i, std::int64_t h) { return static_cast<std::size_t>(((qr + i) * c.hq + h) * c.dv); };
    auto ki = [&](std::int64_t j, std::int64_t h, std::int64_t dim) {
      return static_cast<std::size_t>(((kr + j) * c.hkv + h) * dim);
    };
    auto li = [&](std::int64_t i, std::int64_t h) {
      return static_cast<std::size_t>(c.varlen() ? h * p.total_q + qr + i : (b * c.hq + h) * c.sq + i);
    };
    std::vector<float> S(static_cast<std::size_t>(sq * sk)), P(S.size()), dT(S.size(), 1.0f);
    std::vector<double> mag(static_cast<std::size_t>(sk));  // one row's score magnitudes (row_score_sensitivity)
    for (std::int64_t h = 0; h < c.hq; ++h) {
      const std::int64_t hk = h / group;
      const float slope = slopes.empty() ? 0.0f : static_cast<float>(slopes[static_cast<std::size_t>((c.alibi == 2 ? b * c.hq : 0) + h)]);
      const float sink = sinks.empty() ? -kInf : static_cast<float>(sinks[static_cast<std::size_t>(h)]);
      for (std::int64_t i = 0; i < sq; ++i) {
        float m = sink;
        for (std::int64_t j = 0; j < sk; ++j) {
          float s = 0.0f;
          double terms = 0.0;
          for (std::int64_t e = 0; e < c.d; ++e) {
            const double qk = q[qi(i, h) + e] * k[ki(j, hk, c.d) + e];
            s += static_cast<float>(qk);
            terms += std::abs(qk);
          }
          double size = scale * terms;  // the score's rounding (row_score_sensitivity's mag_j) ...
          s = static_cast<float>(rd(s * scale));
          if (c.softcap > 0.0f) {
            const float th = std::tanh(s / c.softcap);
            s = c.softcap * th;
            dT[i * sk + j] = 1.0f - th * th;
            size = size * dT[i * sk + j] + std::abs(s);  // ... through the cap's slope, and the cap's own rounding
          }
          s -= slope * std::abs(static_cast<float>(i + sk - sq - j));
          // ... and, as in var_score_magnitude, the ALiBi term's rounding at its own size.
          mag[static_cast<std::size_t>(j)] = size + std::abs(slope * static_cast<double>(i + sk - sq - j));
          S[i * sk + j] = visible(c, sq, sk, i, j) ? s : -kInf;
          m = std::max(m, S[i * sk + j]);
        }
        // As support.cpp's standard_attention: 16 lane sums; the sink's term joins the sum.
        const float m_ref = m == -kInf ? 0.0f : m;
        float lanes[16] = {};
        for (std::int64_t j = 0; j < sk; ++j) lanes[j % 16] += (P[i * sk + j] = std::exp(S[i * sk + j] - m_ref));
        float l = sinks.empty() ? 0.0f : std::exp(sink - m_ref);
        for (float x : lanes) l += x;
        for (std::int64_t j = 0; j < sk; ++j) P[i * sk + j] = l == 0.0f ? 0.0f : static_cast<float>(rd(P[i * sk + j] / l));
        r.lse[li(i, h)] = l == 0.0f ? -kInf : m + std::log(l);
        for (std::int64_t e = 0; e < c.dv; ++e) {
          float o = 0.0f;
          for (std::int64_t j = 0; j < sk; ++j)
            if (l != 0.0f && visible(c, sq, sk, i, j)) o += P[i * sk + j] * static_cast<float>(v[ki(j, hk, c.dv) + e]);
          r.out[oi(i, h) + e] = rd(o);
        }
        if (l != 0.0f)
          r.out_score_sensitivity = std::max(
              r.out_score_sensitivity,
              row_score_sensitivity(sk, c.dv, P.data() + i * sk, mag.data(),
                                    [&](std::int64_t j, std::int64_t e) { return v[ki(j, hk, c.dv) + e]; }, r.out.data() + oi(i, h)));
      }
      if (!with_backward) continue;
      for (std::int64_t i = 0; i < sq; ++i) {
        const float lse = static_cast<float>(r.lse[li(i, h)]);
        if (lse == -kInf) continue;  // empty row: no gradient
        float delta = 0.0f;
        for (std::int64_t e = 0; e < c.dv; ++e) delta += static_cast<float>(g[oi(i, h) + e] * r.out[oi(i, h) + e]);
        if (!sinks.empty()) r.dsinks[static_cast<std::size_t>(h)] -= std::exp(sink - lse) * delta;
        for (std::int64_t j = 0; j < sk; ++j) {
          if (!visible(c, sq, sk, i, j)) continue;
          float dp = 0.0f;
          for (std::int64_t e = 0; e < c.dv; ++e) dp += static_cast<float>(g[oi(i, h) + e] * v[ki(j, hk, c.dv) + e]);
          const float pij = P[i * sk + j];
          const float ds = static_cast<float>(rd(pij * (static_cast<float>(rd(dp)) - delta))) * scale * dT[i * sk + j];
          for (std::int64_t e = 0; e < c.d; ++e) {
            r.dq[qi(i, h) + e] += ds * k[ki(j, hk, c.d) + e];
            r.dk[ki(j, hk, c.d) + e] += ds * q[qi(i, h) + e];
          }
          for (std::int64_t e = 0; e < c.dv; ++e) r.dv[ki(j, hk, c.dv) + e] += pij * g[oi(i, h) + e];
        }
      }
    }
  }
  for (auto* vec : {&r.dq, &r.dk, &r.dv})
    for (double& x : *vec) x = rd(x);
  return r;
}

double var_score_magnitude(const VarProblem& p) {
  const VarCase& c = p.c;
  const auto q = p.q->to_double(), k = p.k->to_double();
  const std::vector<double> slopes = p.alibi ? p.alibi->to_double() : std::vector<double>{};
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  double m = 0.0;
  if (p.sinks)
    for (double s : p.sinks->to_double()) m = std::max(m, std::abs(s));
  for (std::int64_t b = 0; b < c.batch(); ++b) {
    const std::int64_t sq = p.len_q(b), sk = p.len_k(b);
    const std::int64_t qr = c.varlen() ? p.q_row0(b) : b * c.sq, kr = c.varlen() ? p.k_row0(b) : b * c.sk;
    for (std::int64_t h = 0; h < c.hq; ++h) {
      const double slope = slopes.empty() ? 0.0 : slopes[static_cast<std::size_t>((c.alibi == 2 ? b * c.hq : 0) + h)];
      for (std::int64_t i = 0; i < sq; ++i)
        for (std::int64_t j = 0; j < sk; ++j) {
          if (!visible(c, sq, sk, i, j)) continue;
          const double* qi = q.data() + ((qr + i) * c.hq + h) * c.d;
          const double* kj = k.data() + ((kr + j) * c.hkv + h / (c.hq / c.hkv)) * c.d;
          double sum = 0.0;
          for (std::int64_t e = 0; e < c.d; ++e) sum += std::abs(qi[e] * kj[e]);
          m = std::max(m, scale * sum + std::abs(slope * static_cast<double>(i + sk - sq - j)));
        }
    }
  }
  return m;
}

bool var_close(const std::vector<double>& got, const std::vector<double>& standard, const std::vector<double>& ref,
               DType dtype, double magnitude, double score_sensitivity) {
  return max_abs_error(got, ref) <= tolerance(max_abs_error(standard, ref), ref, dtype, magnitude, score_sensitivity);
}

void expect_var_close(const VarProblem& p, const VarResults& ref, const VarResults& standard, bool with_backward) {
  const DType t = p.c.dtype;
  if (!with_backward) {
    expect_close("out", p.out->to_double(), standard.out, ref.out, t, 0.0, standard.out_score_sensitivity);
    expect_close("lse", p.lse->to_double(), standard.lse, ref.lse, t, var_score_magnitude(p));
    return;
  }
  // As support.h's backward_magnitude: the largest gradient times (1 + max|LSE|).
  const double lse_factor = 1.0 + max_abs(ref.lse);
  const double mag = std::max({max_abs(ref.dq), max_abs(ref.dk), max_abs(ref.dv)}) * lse_factor;
  expect_close("dq", p.dq->to_double(), standard.dq, ref.dq, t, mag);
  expect_close("dk", p.dk->to_double(), standard.dk, ref.dk, t, mag);
  expect_close("dv", p.dv->to_double(), standard.dv, ref.dv, t, mag);
  if (p.sinks) {
    // dsink_h sums exp(sink − LSE_i) · D_i over the rows: its scale is the sum of the terms' sizes, and each
    // term carries LSE's relative error like P does.
    const auto out = p.out->to_double(), g = p.dout->to_double(), lse = p.lse->to_double();
    double terms = 0.0;
    const auto sinks = p.sinks->to_double();
    for (std::size_t r = 0; r < lse.size(); ++r) {
      const std::int64_t h = p.c.varlen() ? static_cast<std::int64_t>(r) / p.total_q
                                          : (static_cast<std::int64_t>(r) / p.c.sq) % p.c.hq;
      const std::int64_t row = p.c.varlen() ? static_cast<std::int64_t>(r) % p.total_q
                                            : static_cast<std::int64_t>(r) / (p.c.sq * p.c.hq) * p.c.sq +
                                                  static_cast<std::int64_t>(r) % p.c.sq;
      double delta = 0.0;
      for (std::int64_t e = 0; e < p.c.dv; ++e) {
        const std::size_t o = static_cast<std::size_t>((row * p.c.hq + h) * p.c.dv + e);
        delta += std::abs(out[o] * g[o]);
      }
      if (std::isfinite(lse[r])) terms += std::exp(sinks[static_cast<std::size_t>(h)] - lse[r]) * delta;
    }
    expect_close("dsinks", p.dsinks->to_double(), standard.dsinks, ref.dsinks, t, terms * lse_factor);
  }
}

}  // namespace ft_test
