// The float64 oracle. Plain loops, S and P materialised per (sequence, head); no tiling, no tricks, so that it
// is obviously the textbook definition, per sequence b of Sq query and Sk key rows:
//   s_ij = scale · q_i·k_j;  softcap c > 0: s_ij = c·tanh(s_ij / c);  ALiBi: s_ij −= slope_h · |i + Sk − Sq − j|
//   over the keys j that row i sees (the window below), P = softmax(S) with the sink logit in the denominator,
//   O = P V, LSE = log(exp(sink) + Σ exp(S))
//   dV = Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP − rowsum(P ∘ dP)), dS' = dS · ∂s/∂(q·k), dQ = dS' K, dK = dS'ᵀ Q,
//   dsink = −Σ_i exp(sink − LSE_i) · rowsum(P ∘ dP)_i
// with the rows the softmax leaves undefined defined as in softmax_row below (NaN rows, empty rows).
//
// Independence: this file writes the mask, the score and the sequence layout out from their definitions. It
// includes neither core/mask.h (MaskPolicy) nor core/score.h (ScoreHook), nor calls params.h's sequence(), so a
// mistake in those cannot hide from the tests (tests/test_mask_policy.cpp proves a wrong policy fails them).
#include "cpu/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/validate.h"
#include "cpu/convert.h"
#include "flashtile/errors.h"
#include "flashtile/reference.h"

namespace flashtile {
namespace cpu {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A [DB, S, H, D] tensor copied to contiguous float64 (DB = B, or 1 for a packed varlen tensor).
struct Dense {
  std::int64_t s = 0, h = 0, d = 0;
  std::vector<double> data;
  double* at(std::int64_t b, std::int64_t i, std::int64_t head) { return data.data() + ((b * s + i) * h + head) * d; }
  const double* at(std::int64_t b, std::int64_t i, std::int64_t head) const {
    return data.data() + ((b * s + i) * h + head) * d;
  }
};

Dense gather(const void* ptr, const detail::Strides& st, DType dtype, std::int64_t batch, std::int64_t seq,
             std::int64_t heads, std::int64_t dim) {
  Dense out{seq, heads, dim, std::vector<double>(static_cast<std::size_t>(batch * seq * heads * dim))};
  visit_dtype(dtype, [&]<class T>() {
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t i = 0; i < seq; ++i)
        for (std::int64_t h = 0; h < heads; ++h) {
          const T* src = row_ptr<T>(ptr, st, b, i, h);
          double* dst = out.at(b, i, h);
          for (std::int64_t c = 0; c < dim; ++c) dst[c] = to_float(src[c]);
        }
  });
  return out;
}

// The dense shape of the operands: [B, Sq, ...] per batch, or one packed batch of total_q rows (varlen).
std::int64_t dense_batch(const detail::AttnParams& p) { return p.cu_seqlens_q != nullptr ? 1 : p.batch; }
std::int64_t dense_q(const detail::AttnParams& p) { return p.cu_seqlens_q != nullptr ? p.total_q : p.seqlen_q; }
std::int64_t dense_k(const detail::AttnParams& p) { return p.cu_seqlens_q != nullptr ? p.total_k : p.seqlen_k; }

// Sequence b: its dense batch, first query and key rows there, and its lengths (Sk = the keys it uses).
struct Seq {
  std::int64_t db = 0, q0 = 0, k0 = 0, sq = 0, sk = 0;
};
Seq seq_of(const detail::AttnParams& p, std::int64_t b) {
  Seq s{b, 0, 0, p.seqlen_q, p.seqlen_k};
  if (p.cu_seqlens_q != nullptr) {
    s = {0, p.cu_seqlens_q[b], p.cu_seqlens_k[b], p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b],
         p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b]};
  }
  if (p.seqused_k != nullptr) s.sk = p.seqused_k[b];
  return s;
}

struct Inputs {
  Dense q, k, v;
};

Inputs load(const detail::AttnParams& p) {
  const std::int64_t db = dense_batch(p);
  return {gather(p.q, p.q_stride, p.dtype, db, dense_q(p), p.heads_q, p.hdim),
          gather(p.k, p.k_stride, p.dtype, db, dense_k(p), p.heads_kv, p.hdim),
          gather(p.v, p.v_stride, p.dtype, db, dense_k(p), p.heads_kv, p.hdim_v)};
}

double dot(const double* a, const double* b, std::int64_t n) {
  double s = 0.0;
  for (std::int64_t c = 0; c < n; ++c) s += a[c] * b[c];
  return s;
}

// One (sequence, head): the mask and the score written out from the definition.
struct Head {
  const detail::AttnParams& p;
  const Inputs& in;
  Seq s;
  std::int64_t b, h, hk;
  double slope, sink;  // ALiBi slope (0 = off) and sink logit (−inf = none)

  Head(const detail::AttnParams& p_, const Inputs& in_, std::int64_t b_, std::int64_t h_)
      : p(p_), in(in_), s(seq_of(p_, b_)), b(b_), h(h_), hk(h_ / p_.group()),
        slope(p_.alibi_slopes != nullptr ? p_.alibi_slopes[b_ * p_.alibi_batch_stride + h_] : 0.0),
        sink(p_.sinks != nullptr ? p_.sinks[h_] : kNegInf) {}

  // Key j is visible to query i iff i + Sk − Sq − left <= j <= i + Sk − Sq + right (−1: unbounded side;
  // causal: right = 0).
  bool visible(std::int64_t i, std::int64_t j) const {
    const std::int64_t left = p.window_left, right = p.causal ? 0 : p.window_right;
    const std::int64_t diag = i + s.sk - s.sq;
    return j >= 0 && j < s.sk && (left < 0 || j >= diag - left) && (right < 0 || j <= diag + right);
  }
  const double* q(std::int64_t i) const { return in.q.at(s.db, s.q0 + i, h); }
  const double* k(std::int64_t j) const { return in.k.at(s.db, s.k0 + j, hk); }
  const double* v(std::int64_t j) const { return in.v.at(s.db, s.k0 + j, hk); }
  double raw(std::int64_t i, std::int64_t j) const { return p.softmax_scale * dot(q(i), k(j), p.hdim); }
  double score(std::int64_t i, std::int64_t j) const {
    double x = raw(i, j);
    if (p.softcap > 0.0f) x = p.softcap * std::tanh(x / p.softcap);
    return x - slope * std::abs(static_cast<double>(i + s.sk - s.sq - j));
  }
  // ∂ score / ∂ (q·k).
  double dscore(std::int64_t i, std::int64_t j) const {
    if (!(p.softcap > 0.0f)) return p.softmax_scale;
    const double t = std::tanh(raw(i, j) / p.softcap);
    return p.softmax_scale * (1.0 - t * t);
  }

  // Softmax row of query i: fills prob[j] for every key (0 for keys the row does not see) and returns LSE.
  // The semantics (one definition for every backend):
  //  - a visible score that is NaN or +inf makes the row NaN: prob NaN on its visible keys, LSE NaN;
  //  - no visible key, or only −inf scores, and no sink: prob 0 everywhere, LSE −inf (the row is "empty");
  //  - otherwise the softmax with exp(sink) in the denominator (prob 0 for −inf scores); with a sink and no
  //    visible key, prob 0 and LSE = sink.
  double softmax_row(std::int64_t i, std::vector<double>& prob) const {
    std::fill(prob.begin(), prob.end(), 0.0);
    double m = sink;
    bool nan = std::isnan(sink);
    for (std::int64_t j = 0; j < s.sk; ++j) {
      if (!visible(i, j)) continue;
      const double x = score(i, j);
      prob[static_cast<std::size_t>(j)] = x;
      nan = nan || std::isnan(x) || x == std::numeric_limits<double>::infinity();
      if (!std::isnan(x)) m = std::max(m, x);
    }
    if (nan) {
      for (std::int64_t j = 0; j < s.sk; ++j)
        if (visible(i, j)) prob[static_cast<std::size_t>(j)] = kNaN;
      return kNaN;
    }
    if (m == kNegInf) {  // nothing visible, or every visible score −inf, and no sink
      std::fill(prob.begin(), prob.end(), 0.0);
      return kNegInf;
    }
    double l = std::exp(sink - m);  // 0 without a sink
    for (std::int64_t j = 0; j < s.sk; ++j) {
      if (!visible(i, j)) continue;
      double& x = prob[static_cast<std::size_t>(j)];
      x = std::exp(x - m);  // −inf scores give 0
      l += x;
    }
    for (double& x : prob) x /= l;
    return m + std::log(l);
  }
};

}  // namespace

reference::ForwardResult reference_forward(const detail::AttnParams& p, const std::vector<std::int64_t>& rows) {
  const Inputs in = load(p);
  const std::int64_t db = dense_batch(p);
  const bool varlen = p.cu_seqlens_q != nullptr;
  reference::ForwardResult r;
  r.rows = rows;
  const auto nr = static_cast<std::int64_t>(rows.size());
  r.out.assign(static_cast<std::size_t>(db * nr * p.heads_q * p.hdim_v), 0.0);
  r.lse.assign(static_cast<std::size_t>(db * p.heads_q * nr), 0.0);
  std::vector<double> prob;
  for (std::int64_t d = 0; d < db; ++d)
    for (std::int64_t ri = 0; ri < nr; ++ri) {
      // The sequence and local row of dense row `row`: batch d, or the varlen sequence whose rows hold it.
      const std::int64_t row = rows[static_cast<std::size_t>(ri)];
      std::int64_t b = d, i = row;
      if (varlen) {
        b = std::upper_bound(p.cu_seqlens_q, p.cu_seqlens_q + p.batch + 1, row) - p.cu_seqlens_q - 1;
        i = row - p.cu_seqlens_q[b];
      }
      for (std::int64_t h = 0; h < p.heads_q; ++h) {
        const Head head(p, in, b, h);
        prob.assign(static_cast<std::size_t>(head.s.sk), 0.0);
        const double lse = head.softmax_row(i, prob);
        r.lse[static_cast<std::size_t>((d * p.heads_q + h) * nr + ri)] = lse;
        if (lse == kNegInf) continue;  // empty row: O = 0, whatever V holds
        double* o = r.out.data() + ((d * nr + ri) * p.heads_q + h) * p.hdim_v;
        for (std::int64_t j = 0; j < head.s.sk; ++j) {
          if (!head.visible(i, j)) continue;
          const double w = prob[static_cast<std::size_t>(j)];
          const double* vj = head.v(j);
          for (std::int64_t c = 0; c < p.hdim_v; ++c) o[c] += w * vj[c];
        }
      }
    }
  return r;
}

reference::BackwardResult reference_backward(const detail::AttnParams& p) {
  const Inputs in = load(p);
  const std::int64_t db = dense_batch(p);
  const Dense dout = gather(p.dout, p.dout_stride, p.dtype, db, dense_q(p), p.heads_q, p.hdim_v);
  Dense dq{in.q.s, p.heads_q, p.hdim, std::vector<double>(in.q.data.size(), 0.0)};
  Dense dk{in.k.s, p.heads_kv, p.hdim, std::vector<double>(in.k.data.size(), 0.0)};
  Dense dv{in.v.s, p.heads_kv, p.hdim_v, std::vector<double>(in.v.data.size(), 0.0)};
  std::vector<double> dsinks(p.sinks != nullptr ? static_cast<std::size_t>(p.heads_q) : 0, 0.0);
  std::vector<double> prob, dprob;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      const Head head(p, in, b, h);
      const Seq& s = head.s;
      prob.assign(static_cast<std::size_t>(s.sk), 0.0);
      dprob.assign(static_cast<std::size_t>(s.sk), 0.0);
      for (std::int64_t i = 0; i < s.sq; ++i) {
        // An empty row has P = 0: no gradient to dQ, no contribution to dK or dV (not even 0 · NaN).
        const double lse = head.softmax_row(i, prob);
        if (lse == kNegInf) continue;
        const double* g = dout.at(s.db, s.q0 + i, h);
        double delta = 0.0;  // rowsum(P ∘ dP) = rowsum(dO ∘ O)
        for (std::int64_t j = 0; j < s.sk; ++j) {
          if (!head.visible(i, j)) continue;
          dprob[static_cast<std::size_t>(j)] = dot(g, head.v(j), p.hdim_v);
          delta += prob[static_cast<std::size_t>(j)] * dprob[static_cast<std::size_t>(j)];
        }
        if (!dsinks.empty()) dsinks[static_cast<std::size_t>(h)] -= std::exp(head.sink - lse) * delta;
        double* dqi = dq.at(s.db, s.q0 + i, h);
        const double* qi = head.q(i);
        for (std::int64_t j = 0; j < s.sk; ++j) {
          if (!head.visible(i, j)) continue;
          const double pij = prob[static_cast<std::size_t>(j)];
          const double ds = pij * (dprob[static_cast<std::size_t>(j)] - delta) * head.dscore(i, j);
          double* dkj = dk.at(s.db, s.k0 + j, head.hk);
          double* dvj = dv.at(s.db, s.k0 + j, head.hk);
          const double* kj = head.k(j);
          for (std::int64_t c = 0; c < p.hdim; ++c) {
            dqi[c] += ds * kj[c];
            dkj[c] += ds * qi[c];
          }
          for (std::int64_t c = 0; c < p.hdim_v; ++c) dvj[c] += pij * g[c];
        }
      }
    }
  return {std::move(dq.data), std::move(dk.data), std::move(dv.data), std::move(dsinks)};
}

}  // namespace cpu

namespace reference {

namespace {
detail::AttnParams host_inputs(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView* dout,
                               const Options& options) {
  const auto p = detail::validate_inputs(q, k, v, dout, options);
  if (p.device != Device::cpu)
    throw DeviceError("q: the float64 reference reads host memory; got a tensor on " +
                      std::string(device_name(p.device)));
  return p;
}
}  // namespace

ForwardResult forward_rows(const TensorView& q, const TensorView& k, const TensorView& v,
                           const std::vector<std::int64_t>& rows, const Options& options) {
  const auto p = host_inputs(q, k, v, nullptr, options);
  const std::int64_t n = p.is_varlen() ? p.total_q : p.seqlen_q;
  for (std::int64_t i : rows)
    if (i < 0 || i >= n)
      throw InvalidArgument("rows: query row " + std::to_string(i) + " is outside [0, " + std::to_string(n) + ")");
  return cpu::reference_forward(p, rows);
}

ForwardResult forward(const TensorView& q, const TensorView& k, const TensorView& v, const Options& options) {
  const auto p = host_inputs(q, k, v, nullptr, options);
  std::vector<std::int64_t> rows(static_cast<std::size_t>(p.is_varlen() ? p.total_q : p.seqlen_q));
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<std::int64_t>(i);
  return cpu::reference_forward(p, rows);
}

BackwardResult backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dout,
                        const Options& options) {
  return cpu::reference_backward(host_inputs(q, k, v, &dout, options));
}

}  // namespace reference
}  // namespace flashtile
