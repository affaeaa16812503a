// The float64 oracle. Plain loops, S and P materialised per (batch, head); no tiling, no tricks, so
// that it is obviously the textbook definition:
//   S = scale · Q Kᵀ (masked entries excluded), P = softmax(S), O = P V, LSE = log Σ exp(S)
//   dV = Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP − rowsum(P ∘ dP)), dQ = scale · dS K, dK = scale · dSᵀ Q
// with the rows the softmax leaves undefined defined as in softmax_row below (NaN rows, empty rows).
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

// A [B, S, H, D] tensor copied to contiguous float64.
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

struct Inputs {
  Dense q, k, v;
};

Inputs load(const detail::AttnParams& p) {
  return {gather(p.q, p.q_stride, p.dtype, p.batch, p.seqlen_q, p.heads_q, p.hdim),
          gather(p.k, p.k_stride, p.dtype, p.batch, p.seqlen_k, p.heads_kv, p.hdim),
          gather(p.v, p.v_stride, p.dtype, p.batch, p.seqlen_k, p.heads_kv, p.hdim_v)};
}

double dot(const double* a, const double* b, std::int64_t n) {
  double s = 0.0;
  for (std::int64_t c = 0; c < n; ++c) s += a[c] * b[c];
  return s;
}

// The mask, written out here from its definition rather than taken from the kernels' AttnParams::key_begin /
// key_end, so that a mistake there cannot hide from the oracle: causal is bottom-right aligned.
bool visible(const detail::AttnParams& p, std::int64_t i, std::int64_t j) {
  return !p.causal || j <= i + p.seqlen_k - p.seqlen_q;
}

// Softmax row of query i of head h: fills prob[j] for every key (0 for keys the row does not see) and returns
// LSE. The semantics (one definition for every backend):
//  - a visible score that is NaN or +inf makes the row NaN: prob NaN on its visible keys, LSE NaN;
//  - no visible key, or only −inf scores: prob 0 everywhere, LSE −inf (the row is "empty");
//  - otherwise the softmax, with prob 0 for −inf scores.
double softmax_row(const detail::AttnParams& p, const Inputs& in, std::int64_t b, std::int64_t h, std::int64_t i,
                   std::vector<double>& prob) {
  const std::int64_t hk = h / p.group();
  std::fill(prob.begin(), prob.end(), 0.0);
  double m = kNegInf;
  bool nan = false;
  for (std::int64_t j = 0; j < p.seqlen_k; ++j) {
    if (!visible(p, i, j)) continue;
    const double s = p.softmax_scale * dot(in.q.at(b, i, h), in.k.at(b, j, hk), p.hdim);
    prob[static_cast<std::size_t>(j)] = s;
    nan = nan || std::isnan(s) || s == std::numeric_limits<double>::infinity();
    if (!std::isnan(s)) m = std::max(m, s);
  }
  if (nan) {
    for (std::int64_t j = 0; j < p.seqlen_k; ++j)
      if (visible(p, i, j)) prob[static_cast<std::size_t>(j)] = std::numeric_limits<double>::quiet_NaN();
    return std::numeric_limits<double>::quiet_NaN();
  }
  if (m == kNegInf) {  // nothing visible, or every visible score −inf
    std::fill(prob.begin(), prob.end(), 0.0);
    return kNegInf;
  }
  double l = 0.0;
  for (std::int64_t j = 0; j < p.seqlen_k; ++j) {
    if (!visible(p, i, j)) continue;
    double& x = prob[static_cast<std::size_t>(j)];
    x = std::exp(x - m);  // −inf scores give 0
    l += x;
  }
  for (double& x : prob) x /= l;
  return m + std::log(l);
}

}  // namespace

reference::ForwardResult reference_forward(const detail::AttnParams& p, const std::vector<std::int64_t>& rows) {
  const Inputs in = load(p);
  reference::ForwardResult r;
  r.rows = rows;
  const auto nr = static_cast<std::int64_t>(rows.size());
  r.out.assign(static_cast<std::size_t>(p.batch * nr * p.heads_q * p.hdim_v), 0.0);
  r.lse.assign(static_cast<std::size_t>(p.batch * p.heads_q * nr), 0.0);
  std::vector<double> prob(static_cast<std::size_t>(p.seqlen_k));
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      const std::int64_t hk = h / p.group();
      for (std::int64_t ri = 0; ri < nr; ++ri) {
        const std::int64_t i = rows[static_cast<std::size_t>(ri)];
        const double lse = softmax_row(p, in, b, h, i, prob);
        r.lse[static_cast<std::size_t>((b * p.heads_q + h) * nr + ri)] = lse;
        if (lse == kNegInf) continue;  // empty row: O = 0, whatever V holds
        double* o = r.out.data() + ((b * nr + ri) * p.heads_q + h) * p.hdim_v;
        for (std::int64_t j = 0; j < p.seqlen_k; ++j) {
          if (!visible(p, i, j)) continue;
          const double w = prob[static_cast<std::size_t>(j)];
          const double* vj = in.v.at(b, j, hk);
          for (std::int64_t c = 0; c < p.hdim_v; ++c) o[c] += w * vj[c];
        }
      }
    }
  return r;
}

reference::BackwardResult reference_backward(const detail::AttnParams& p) {
  const Inputs in = load(p);
  const Dense dout = gather(p.dout, p.dout_stride, p.dtype, p.batch, p.seqlen_q, p.heads_q, p.hdim_v);
  Dense dq{p.seqlen_q, p.heads_q, p.hdim, std::vector<double>(in.q.data.size(), 0.0)};
  Dense dk{p.seqlen_k, p.heads_kv, p.hdim, std::vector<double>(in.k.data.size(), 0.0)};
  Dense dv{p.seqlen_k, p.heads_kv, p.hdim_v, std::vector<double>(in.v.data.size(), 0.0)};
  const auto sk = static_cast<std::size_t>(p.seqlen_k);
  std::vector<double> prob(sk), dprob(sk);
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      const std::int64_t hk = h / p.group();
      for (std::int64_t i = 0; i < p.seqlen_q; ++i) {
        // An empty row has P = 0: no gradient to dQ, no contribution to dK or dV (not even 0 · NaN).
        if (softmax_row(p, in, b, h, i, prob) == kNegInf) continue;
        const double* g = dout.at(b, i, h);
        double delta = 0.0;  // rowsum(P ∘ dP) = rowsum(dO ∘ O)
        for (std::int64_t j = 0; j < p.seqlen_k; ++j) {
          if (!visible(p, i, j)) continue;
          dprob[static_cast<std::size_t>(j)] = dot(g, in.v.at(b, j, hk), p.hdim_v);
          delta += prob[static_cast<std::size_t>(j)] * dprob[static_cast<std::size_t>(j)];
        }
        for (std::int64_t j = 0; j < p.seqlen_k; ++j) {
          if (!visible(p, i, j)) continue;
          const double pij = prob[static_cast<std::size_t>(j)];
          const double ds = pij * (dprob[static_cast<std::size_t>(j)] - delta) * p.softmax_scale;
          double* dqi = dq.at(b, i, h);
          double* dkj = dk.at(b, j, hk);
          double* dvj = dv.at(b, j, hk);
          const double* qi = in.q.at(b, i, h);
          const double* kj = in.k.at(b, j, hk);
          for (std::int64_t c = 0; c < p.hdim; ++c) {
            dqi[c] += ds * kj[c];
            dkj[c] += ds * qi[c];
          }
          for (std::int64_t c = 0; c < p.hdim_v; ++c) dvj[c] += pij * g[c];
        }
      }
    }
  return {std::move(dq.data), std::move(dk.data), std::move(dv.data)};
}

}  // namespace cpu

namespace reference {

ForwardResult forward_rows(const TensorView& q, const TensorView& k, const TensorView& v,
                           const std::vector<std::int64_t>& rows, const Options& options) {
  const auto p = detail::validate_inputs(q, k, v, nullptr, options);
  if (p.device != Device::cpu)
    throw DeviceError("q: the float64 reference reads host memory; got a tensor on " +
                      std::string(device_name(p.device)));
  for (std::int64_t i : rows)
    if (i < 0 || i >= p.seqlen_q)
      throw InvalidArgument("rows: query row " + std::to_string(i) + " is outside [0, " +
                            std::to_string(p.seqlen_q) + ")");
  return cpu::reference_forward(p, rows);
}

ForwardResult forward(const TensorView& q, const TensorView& k, const TensorView& v, const Options& options) {
  std::vector<std::int64_t> rows(static_cast<std::size_t>(std::max<std::int64_t>(q.rank == 4 ? q.shape[1] : 0, 0)));
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<std::int64_t>(i);
  return forward_rows(q, k, v, rows, options);
}

BackwardResult backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dout,
                        const Options& options) {
  const auto p = detail::validate_inputs(q, k, v, &dout, options);
  if (p.device != Device::cpu)
    throw DeviceError("q: the float64 reference reads host memory; got a tensor on " +
                      std::string(device_name(p.device)));
  return cpu::reference_backward(p);
}

}  // namespace reference
}  // namespace flashtile
