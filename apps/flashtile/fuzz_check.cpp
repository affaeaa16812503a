// The fuzzer's yardstick and its one tolerance rule (see fuzz_check.h).
#include "fuzz_check.h"

#include "core/element.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

namespace flashtile::app::fuzz {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Rounds a float to the dtype (round to nearest even), as a framework storing the tensor does.
float rd(DType t, float x) { return flashtile::detail::round_to(t, x); }

// Where query row i of batch b lives: its sequence, its row inside it, the sequence's lengths and the
// packed row of its first key. Batched calls: sequence b, row i; varlen calls (b = 0, i a packed row): the
// sequence whose rows [cu_q[s], cu_q[s + 1]) hold i (an empty sequence holds none). seqused_k shortens Sk.
struct Seq {
  std::int64_t b = 0, i = 0, sq = 0, sk = 0, k0 = 0;
};
Seq locate(const Problem& pr, std::int64_t b, std::int64_t i) {
  Seq s{b, i, pr.q.s, pr.k.s, 0};
  if (!pr.cu_q.empty()) {
    s.b = (std::upper_bound(pr.cu_q.begin(), pr.cu_q.end(), i) - pr.cu_q.begin()) - 1;
    const auto sb = static_cast<std::size_t>(s.b);
    s.i = i - pr.cu_q[sb];
    s.sq = pr.cu_q[sb + 1] - pr.cu_q[sb];
    s.k0 = pr.cu_k[sb];
    s.sk = pr.cu_k[sb + 1] - pr.cu_k[sb];
  }
  if (!pr.seqused.empty()) s.sk = pr.seqused[static_cast<std::size_t>(s.b)];
  return s;
}

// Visible keys of query row s.i are [lo, hi) of its sequence: the definition (bottom-right aligned window,
// causal = right 0), written from the README, not taken from the library.
std::pair<std::int64_t, std::int64_t> key_range(const Problem& pr, const Seq& q) {
  const std::int64_t sk = q.sk, diag = q.i + sk - q.sq;
  const std::int64_t left = pr.window[0], right = pr.causal ? 0 : pr.window[1];
  const std::int64_t lo = left < 0 ? 0 : std::clamp<std::int64_t>(diag - left, 0, sk);
  const std::int64_t hi = right < 0 ? sk : std::clamp<std::int64_t>(diag + right + 1, 0, sk);
  return {lo, std::max(lo, hi)};
}

// One softmax row of standard attention. Returns false for a row that contributes nothing (no visible
// key, or every visible score -inf and none NaN, and no sink); then out = 0 and lse = -inf. With a sink
// such a row has lse = sink and P = 0.
struct Row {
  std::int64_t lo = 0;   // the first visible key (packed row in varlen): entry j below is key lo + j
  std::vector<float> p;  // rounded probabilities of the visible keys
  std::vector<float> dcap;  // softcap: d(capped score)/d(score) = 1 - tanh^2, per visible key
  float lse = -kInf;
  float psink = 0.0f;    // exp(sink - lse): the sink's probability
  bool active = false;
  // The same row in float64 without rounding (scores, probabilities, LSE): the size of the terms the
  // tolerance is built from, which must not overflow where the dtype's standard attention does.
  std::vector<double> sx, px;
  double lsex = 0, psinkx = 0;
};

// The score hook as an eager framework writes it (torch: s / c, tanh, * c, then - bias), each op rounded
// to the dtype; dcap gets the softcap derivative 1 - tanh^2 in float32.
float hook(const Problem& pr, float x, double bias, float& dcap) {
  const DType t = pr.dtype;
  dcap = 1.0f;
  if (pr.softcap > 0.0f) {
    const float th = rd(t, std::tanh(rd(t, x / pr.softcap)));
    dcap = 1.0f - th * th;
    x = rd(t, th * pr.softcap);
  }
  return pr.alibi.empty() ? x : rd(t, x - static_cast<float>(bias));
}

Row softmax_row(const Problem& pr, std::int64_t b, std::int64_t h, std::int64_t i, double& score_scale) {
  const DType t = pr.dtype;
  const std::int64_t group = pr.q.h / pr.k.h, hk = h / group;
  const Seq sq = locate(pr, b, i);
  const auto [lo, hi] = key_range(pr, sq);
  const double slope = pr.alibi.empty() ? 0.0
                       : pr.alibi[static_cast<std::size_t>((pr.alibi_batched ? sq.b * pr.q.h : 0) + h)];
  Row r;
  r.lo = sq.k0 + lo;
  std::vector<float> s(static_cast<std::size_t>(hi - lo));
  r.dcap.resize(s.size());
  float m = -kInf;
  bool nan = false;
  const double* qi = pr.q.at(b, i, h);
  for (std::int64_t j = 0; j < hi - lo; ++j) {
    const double* kj = pr.k.at(b, r.lo + j, hk);
    float acc = 0.0f;
    double mag = 0.0;
    for (std::int64_t c = 0; c < pr.q.d; ++c) {
      acc += static_cast<float>(qi[c] * kj[c]);
      const double a = std::abs(qi[c] * kj[c]);
      if (std::isfinite(a)) mag += a;
    }
    const double bias = slope * static_cast<double>(std::abs(sq.i + sq.sk - sq.sq - (lo + j)));
    score_scale = std::max(score_scale, std::abs(static_cast<double>(pr.scale)) * mag + std::abs(bias));
    const float x = hook(pr, rd(t, acc * pr.scale), bias, r.dcap[static_cast<std::size_t>(j)]);
    double exact = 0.0;
    for (std::int64_t c = 0; c < pr.q.d; ++c) exact += qi[c] * kj[c];
    exact *= static_cast<double>(pr.scale);
    if (pr.softcap > 0.0f) exact = pr.softcap * std::tanh(exact / pr.softcap);
    r.sx.push_back(exact - bias);
    s[static_cast<std::size_t>(j)] = x;
    nan = nan || std::isnan(x);
    if (!std::isnan(x)) m = std::max(m, x);
  }
  const bool sink = !pr.sinks.empty();
  const double sinkx = sink ? pr.sinks[static_cast<std::size_t>(h)] : -kInf;
  double mx = r.sx.empty() ? -kInf : *std::max_element(r.sx.begin(), r.sx.end());
  mx = std::max(mx, sinkx);
  const bool exact_defined = std::none_of(r.sx.begin(), r.sx.end(), [](double x) { return std::isnan(x); }) &&
                             mx > -kInf && mx < kInf;
  if (exact_defined) {  // else the exact row is NaN or empty: no finite magnitude to take from it
    double lx = sink ? std::exp(sinkx - mx) : 0.0;
    for (double x : r.sx) r.px.push_back(std::exp(x - mx)), lx += r.px.back();
    for (double& x : r.px) x /= lx;
    r.lsex = mx + std::log(lx);
    r.psinkx = sink ? std::exp(sinkx - r.lsex) : 0.0;
  }
  if (!nan && m == -kInf && !sink) return r;
  r.active = true;
  const float sk = static_cast<float>(sinkx);
  if (sink && !nan) m = std::max(m, sk);
  float l = sink ? std::exp(sk - m) : 0.0f;
  // e^(x − m) below the smallest normal float is 0, as the kernels' exp2 computes it (cpu/exp2.h; the GPU's
  // ex2.approx.ftz): a precision effect, under 1.2e-38 |v| on any finite output, seen only where a value is
  // infinite (0 · inf = NaN where gradual underflow gives ±inf).
  for (float& x : s) {
    x = std::exp(x - m);
    l += (x = x < std::numeric_limits<float>::min() ? 0.0f : x);
  }
  r.p.resize(s.size());
  for (std::size_t j = 0; j < s.size(); ++j) r.p[j] = rd(t, s[j] / l);
  r.lse = m + std::log(l);
  r.psink = sink ? std::exp(sk - r.lse) : 0.0f;
  return r;
}

}  // namespace

double eps(DType t) { return flashtile::detail::eps(t); }

double read_elem(const TensorView& t, std::int64_t i0, std::int64_t i1, std::int64_t i2, std::int64_t i3) {
  const std::int64_t idx[4] = {i0, i1, i2, i3};
  std::int64_t off = 0;
  for (int d = 0; d < t.rank; ++d) off += idx[d] * t.stride[static_cast<std::size_t>(d)];
  const auto* p = static_cast<const unsigned char*>(t.data) + off * static_cast<std::int64_t>(dtype_size(t.dtype));
  return flashtile::detail::load_element(p, t.dtype);
}

std::vector<double> load_flat(const TensorView& t) {
  std::vector<double> out;
  const std::int64_t n0 = t.shape[0], n1 = t.rank == 2 ? t.shape[1] : 1;
  for (std::int64_t i = 0; i < n0; ++i)
    for (std::int64_t j = 0; j < n1; ++j) out.push_back(read_elem(t, i, j));
  return out;
}

TensorView as_batched(const TensorView& t, bool lse) {
  if (t.rank != (lse ? 2 : 3)) return t;
  TensorView v = t;
  v.rank = t.rank + 1;
  for (int d = t.rank; d > 0; --d) {
    v.shape[static_cast<std::size_t>(d)] = t.shape[static_cast<std::size_t>(d - 1)];
    v.stride[static_cast<std::size_t>(d)] = t.stride[static_cast<std::size_t>(d - 1)];
  }
  v.shape[0] = 1;
  v.stride[0] = 0;
  return v;
}

Dense load(const TensorView& t) {
  Dense d{t.shape[0], t.shape[1], t.shape[2], t.shape[3], {}};
  d.x.resize(static_cast<std::size_t>(d.b * d.s * d.h * d.d));
  std::size_t n = 0;
  for (std::int64_t b = 0; b < d.b; ++b)
    for (std::int64_t s = 0; s < d.s; ++s)
      for (std::int64_t h = 0; h < d.h; ++h)
        for (std::int64_t c = 0; c < d.d; ++c) d.x[n++] = read_elem(t, b, s, h, c);
  return d;
}

std::vector<double> load_rows(const TensorView& t, const std::vector<std::int64_t>& rows) {
  std::vector<double> out;
  out.reserve(static_cast<std::size_t>(t.shape[0] * t.shape[2] * t.shape[3]) * rows.size());
  for (std::int64_t b = 0; b < t.shape[0]; ++b)
    for (std::int64_t i : rows)
      for (std::int64_t h = 0; h < t.shape[2]; ++h)
        for (std::int64_t c = 0; c < t.shape[3]; ++c) out.push_back(read_elem(t, b, i, h, c));
  return out;
}

std::vector<double> load_lse_rows(const TensorView& t, const std::vector<std::int64_t>& rows) {
  std::vector<double> out;
  for (std::int64_t b = 0; b < t.shape[0]; ++b)
    for (std::int64_t h = 0; h < t.shape[1]; ++h)
      for (std::int64_t i : rows) out.push_back(read_elem(t, b, h, i));
  return out;
}

StdForward standard_forward(const Problem& pr, const std::vector<std::int64_t>& rows) {
  StdForward f;
  const std::int64_t nb = pr.q.b, nh = pr.q.h, dv = pr.v.d, nr = static_cast<std::int64_t>(rows.size());
  f.out.assign(static_cast<std::size_t>(nb * nr * nh * dv), 0.0);
  f.lse.assign(static_cast<std::size_t>(nb * nh * nr), -std::numeric_limits<double>::infinity());
  if (pr.k.h == 0) return f;
  const std::int64_t group = nh / pr.k.h;
  for (std::int64_t b = 0; b < nb; ++b)
    for (std::int64_t h = 0; h < nh; ++h)
      for (std::int64_t ri = 0; ri < nr; ++ri) {
        const std::int64_t i = rows[static_cast<std::size_t>(ri)];
        const Row r = softmax_row(pr, b, h, i, f.score_scale);
        f.lse[static_cast<std::size_t>((b * nh + h) * nr + ri)] = r.lse;
        if (!r.active) continue;
        for (std::int64_t c = 0; c < dv; ++c) {
          float o = 0.0f;
          for (std::size_t j = 0; j < r.p.size(); ++j)
            o += r.p[j] * static_cast<float>(pr.v.at(b, r.lo + static_cast<std::int64_t>(j), h / group)[c]);
          f.out[static_cast<std::size_t>(((b * nr + ri) * nh + h) * dv + c)] = rd(pr.dtype, o);
        }
      }
  return f;
}

StdBackward standard_backward(const Problem& pr) {
  StdBackward g;
  g.dq.assign(pr.q.x.size(), 0.0);
  g.dk.assign(pr.k.x.size(), 0.0);
  g.dv.assign(pr.v.x.size(), 0.0);
  g.dsinks.assign(pr.sinks.size(), 0.0);
  if (pr.k.h == 0) return g;
  const DType t = pr.dtype;
  const std::int64_t nh = pr.q.h, group = nh / pr.k.h, d = pr.q.d, dv = pr.v.d;
  std::vector<double> abs_sum[4] = {std::vector<double>(g.dq.size()), std::vector<double>(g.dk.size()),
                                    std::vector<double>(g.dv.size()), std::vector<double>(g.dsinks.size())};
  auto idx = [](const Dense& x, std::int64_t b, std::int64_t s, std::int64_t h) {
    return static_cast<std::size_t>(((b * x.s + s) * x.h + h) * x.d);
  };
  // dQ = dS K, dK = dS^T Q and dV = P^T dO are float32 matrix products in an eager framework: their sums run in
  // float32, in the order of the loops below (dK and dV: head by head of a group, each over its query rows). Summed in
  // float64 instead, standard attention's error would miss a long sum's own rounding, which every float32
  // backward carries (268 equal dO rows summed into one dV row: 5e-6 relative, 90 times the float64 sum's).
  auto accumulate = [](double& sum, float term) { sum = static_cast<float>(sum) + term; };
  for (std::int64_t b = 0; b < pr.q.b; ++b)
    for (std::int64_t h = 0; h < nh; ++h)
      for (std::int64_t i = 0; i < pr.q.s; ++i) {
        // Standard attention's row may overflow in the dtype where the float64 row does not: its result
        // then follows the dtype (r.active, r.p), the tolerance's magnitudes the float64 row (r.px).
        const Row r = softmax_row(pr, b, h, i, g.score_scale);
        if (!r.active && r.px.empty()) continue;
        const bool exact = !r.px.empty();
        const std::int64_t hk = h / group;
        const double* gi = pr.dout.at(b, i, h);
        // O in the dtype, then delta = rowsum(dO ∘ O) in float32, as autograd computes it.
        float delta = 0.0f;
        double delta_terms = 0.0;  // sum_c |dO_c O_c|
        double o_terms = 0.0;      // sum_c |dO_c| sum_j P_j |v_jc|: the size of O's rounding, seen by dsinks
        for (std::int64_t c = 0; c < dv; ++c) {
          float o = 0.0f;
          double ox = 0.0, oa = 0.0;
          for (std::size_t j = 0; j < r.p.size(); ++j) o += r.p[j] * static_cast<float>(pr.v.at(b, r.lo + static_cast<std::int64_t>(j), hk)[c]);
          for (std::size_t j = 0; j < r.px.size(); ++j) {
            const double vc = pr.v.at(b, r.lo + static_cast<std::int64_t>(j), hk)[c];
            ox += r.px[j] * vc;
            oa += r.px[j] * std::abs(vc);
          }
          delta += static_cast<float>(gi[c] * rd(t, o));
          delta_terms += std::abs(gi[c] * ox);
          o_terms += std::abs(gi[c]) * oa;
        }
        // dL/dsink_h = -sum_i P_sink,i delta_i (the sink adds no value; its score's gradient is P (0 - delta)).
        if (!pr.sinks.empty()) {
          const auto hs = static_cast<std::size_t>(h);
          if (r.active) g.dsinks[hs] -= static_cast<double>(r.psink * delta);
          if (exact && r.psinkx > 0)
            abs_sum[3][hs] += r.psinkx * (delta_terms + o_terms) * (1.0 + std::abs(pr.sinks[hs]) + std::abs(r.lsex));
        }
        for (std::size_t jj = 0; jj < r.sx.size(); ++jj) {
          const auto j = r.lo + static_cast<std::int64_t>(jj);
          const double* vj = pr.v.at(b, j, hk);
          float dp = 0.0f;
          double dp_terms = 0.0;
          for (std::int64_t c = 0; c < dv; ++c) {
            dp += static_cast<float>(gi[c] * vj[c]);
            dp_terms += std::abs(gi[c] * vj[c]);
          }
          // Softcap: the chain rule through c tanh(s / c) multiplies by 1 - tanh^2 (ALiBi's bias is constant).
          const float ds = r.active ? rd(t, rd(t, r.p[jj] * (rd(t, dp) - delta)) * r.dcap[jj]) * pr.scale : 0.0f;
          const float pj = r.active ? r.p[jj] : 0.0f;
          // dS = P (dP - delta) cancels (to exactly 0 under a one-hot softmax); its rounding is that of the
          // products summed into dP and delta, |scale| P (sum |dO_c v_c| + sum |dO_c O_c|), and P, recomputed
          // as exp(s - LSE), carries a relative error of eps (|s| + |LSE|): hence the factor `recompute`
          // (a capped score's own rounding is at most eps c on top).
          const double recompute = 1.0 + std::abs(r.sx[jj]) + std::abs(r.lsex) + static_cast<double>(pr.softcap);
          const double px = exact ? r.px[jj] : 0.0;
          const double ds_terms =  // a key of P = 0 (score -inf) adds no term, though |s| is infinite
              px > 0 ? std::abs(static_cast<double>(pr.scale)) * px * (dp_terms + delta_terms) * recompute : 0.0;
          const double* qi = pr.q.at(b, i, h);
          const double* kj = pr.k.at(b, j, hk);
          for (std::int64_t c = 0; c < d; ++c) {
            const std::size_t iq = idx(pr.q, b, i, h) + static_cast<std::size_t>(c), ik = idx(pr.k, b, j, hk) + static_cast<std::size_t>(c);
            if (r.active) {
              accumulate(g.dq[iq], ds * static_cast<float>(kj[c]));
              accumulate(g.dk[ik], ds * static_cast<float>(qi[c]));
            }
            if (ds_terms > 0) {
              abs_sum[0][iq] += ds_terms * std::abs(kj[c]);
              abs_sum[1][ik] += ds_terms * std::abs(qi[c]);
            }
          }
          for (std::int64_t c = 0; c < dv; ++c) {
            const std::size_t iv = idx(pr.v, b, j, hk) + static_cast<std::size_t>(c);
            if (r.active) accumulate(g.dv[iv], pj * static_cast<float>(gi[c]));
            if (px > 0) abs_sum[2][iv] += px * std::abs(gi[c]) * recompute;
          }
        }
      }
  for (int n = 0; n < 4; ++n) {
    for (double e : abs_sum[n])
      if (std::isfinite(e)) g.abs_sum[n] = std::max(g.abs_sum[n], e);
  }
  for (auto* x : {&g.dq, &g.dk, &g.dv})
    for (double& e : *x) e = rd(t, static_cast<float>(e));
  for (double& e : g.dsinks) e = static_cast<float>(e);  // dsinks is float32 whatever the dtype
  return g;
}

double max_abs_finite(const std::vector<double>& x) {
  double m = 0;
  for (double e : x)
    if (std::isfinite(e)) m = std::max(m, std::abs(e));
  return m;
}

namespace {
enum class Cls { finite, nan, pos_inf, neg_inf };
Cls cls(double x) {
  if (std::isnan(x)) return Cls::nan;
  if (std::isinf(x)) return x > 0 ? Cls::pos_inf : Cls::neg_inf;
  return Cls::finite;
}
}  // namespace

Verdict compare(const char* name, const std::vector<double>& got, const std::vector<double>& standard,
                const std::vector<double>& ref, DType dtype, double magnitude, DType storage) {
  // The largest finite value of the output's dtype: a result within tolerance of it may be stored as Inf.
  const double max_finite = storage == DType::float16    ? 65504.0
                            : storage == DType::bfloat16 ? 3.3895313892515355e38
                                                         : static_cast<double>(std::numeric_limits<float>::max());
  Verdict v;
  v.name = name;
  std::ostringstream s;
  if (got.size() != ref.size() || standard.size() != ref.size()) {
    v.ok = false;
    s << name << ": " << got.size() << " elements read, oracle has " << ref.size();
    v.detail = s.str();
    return v;
  }
  for (std::size_t i = 0; i < ref.size(); ++i)
    if (std::isfinite(standard[i]) && std::isfinite(ref[i])) v.std_err = std::max(v.std_err, std::abs(standard[i] - ref[i]));
  v.tol = 2.0 * v.std_err + 8.0 * eps(dtype) * std::max({max_abs_finite(ref), magnitude, 1e-3});
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const Cls cr = cls(ref[i]), cg = cls(got[i]), cs = cls(standard[i]);
    bool bad = false;
    if (cr == Cls::finite && cg == Cls::finite) {
      const double e = std::abs(got[i] - ref[i]);
      v.err = std::max(v.err, e);
      bad = e > v.tol;
    } else if (cg != cr) {
      if (cr == Cls::finite && std::isinf(got[i]) && (got[i] > 0) == (ref[i] > 0) &&
          std::abs(ref[i]) + v.tol >= max_finite) {
        // overflow on storing the result
      } else if (cs != cr && cg == cs) {
        ++v.precision_limited;  // e.g. float32 overflow of a score the oracle holds in float64
      } else {
        bad = true;
      }
    }
    if (bad && v.ok) {
      v.ok = false;
      s << name << "[" << i << "] = " << got[i] << ", oracle " << ref[i] << ", standard attention " << standard[i]
        << " (tolerance " << v.tol << ", standard's max error " << v.std_err << ")";
    }
  }
  v.detail = s.str();
  return v;
}

}  // namespace flashtile::app::fuzz
