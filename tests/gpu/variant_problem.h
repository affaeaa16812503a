// Host side of the GPU variant tests (test_gpu_variants.cpp): one case's data, the operands of a call on the GPU
// or on the host, and the yardstick: a standard attention in the case's precision written out densely from the
// semantics of issue 12 (it shares no code with core/mask.h or core/score.h).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/element.h"
#include "flashtile/flashtile.h"

namespace ft_gpu {

using flashtile::DType;
using flashtile::TensorView;

// cu_seqlens are int32 tensors. DType::int32 comes with issue 12's validation (merged from the cpu helper's
// branch); until that merge the tests still build, and the cases that need it skip.
template <class D>
constexpr bool kHasInt32 = requires { D::int32; };
template <class D>
D int32_dtype() {
  if constexpr (kHasInt32<D>) {
    return D::int32;
  } else {
    return D{};
  }
}

inline constexpr double kInf = std::numeric_limits<double>::infinity();

struct VCase {
  std::string name;
  std::vector<std::int64_t> lens_q, lens_k;  // per sequence; a padded batch needs equal lengths
  std::vector<std::int64_t> used_k;          // seqused_k (keys of each sequence in use); empty = all
  bool varlen = false;                       // packed with cu_seqlens_q / cu_seqlens_k
  std::int64_t hq = 4, hkv = 2;
  bool causal = false;
  std::int64_t left = -1, right = -1;
  float softcap = 0.f;
  int alibi = 0;  // 0: none, 1: slopes [Hq], 2: slopes [B, Hq]
  bool sinks = false;
  // Set per test instance:
  DType dtype = DType::bfloat16;
  std::int64_t d = 64;
};

// GoogleTest prints a parameter with this instead of its bytes.
inline void PrintTo(const VCase& c, std::ostream* os) { *os << c.name; }

// The variant kernel the call must run (the suffix of KernelInfo::kernel).
inline const char* expected_variant(const VCase& c) {
  if (c.softcap > 0.f || c.alibi != 0) return "_hooks";
  if (c.causal || c.left >= 0 || c.right >= 0) return "_masked";
  return "_plain";
}

// Host data of one case, logical row-major: q / out / dout [rows_q, Hq, D], k / v [rows_k, Hkv, D] where a padded
// batch's [B, S, H, D] is the same memory as [B * S, H, D]; lse [Hq, total_q] (varlen) or [B, Hq, Sq].
struct Host {
  VCase c;
  std::int64_t batch = 0, total_q = 0, total_k = 0, max_q = 0, max_k = 0;
  std::vector<std::int32_t> cu_q, cu_k;
  std::vector<double> q, k, v, dout;
  std::vector<float> slopes, sinks;
  float scale = 1.f;

  std::int64_t row0_q(std::int64_t b) const { return cu_q[static_cast<std::size_t>(b)]; }
  std::int64_t row0_k(std::int64_t b) const { return cu_k[static_cast<std::size_t>(b)]; }
  std::int64_t len_q(std::int64_t b) const { return c.lens_q[static_cast<std::size_t>(b)]; }
  std::int64_t len_k(std::int64_t b) const { return c.lens_k[static_cast<std::size_t>(b)]; }
  // Keys of sequence b that attention sees (seqused_k); the rest of its rows get dK = dV = 0.
  std::int64_t used_k(std::int64_t b) const { return c.used_k.empty() ? len_k(b) : c.used_k[static_cast<std::size_t>(b)]; }
  std::size_t lse_at(std::int64_t b, std::int64_t h, std::int64_t i) const {
    return static_cast<std::size_t>(c.varlen ? h * total_q + row0_q(b) + i : (b * c.hq + h) * max_q + i);
  }
  float slope(std::int64_t b, std::int64_t h) const {
    if (c.alibi == 0) return 0.f;
    return slopes[static_cast<std::size_t>(c.alibi == 2 ? b * c.hq + h : h)];
  }
  float sink(std::int64_t h) const { return c.sinks ? sinks[static_cast<std::size_t>(h)] : -INFINITY; }
};

inline double round_dt(DType t, double x) { return flashtile::detail::round_to(t, static_cast<float>(x)); }

inline Host make_host(const VCase& c, std::mt19937_64& rng) {
  Host p;
  p.c = c;
  p.batch = static_cast<std::int64_t>(c.lens_q.size());
  p.cu_q.push_back(0);
  p.cu_k.push_back(0);
  for (std::int64_t b = 0; b < p.batch; ++b) {
    p.cu_q.push_back(static_cast<std::int32_t>(p.cu_q.back() + p.len_q(b)));
    p.cu_k.push_back(static_cast<std::int32_t>(p.cu_k.back() + p.len_k(b)));
    p.max_q = std::max(p.max_q, p.len_q(b));
    p.max_k = std::max(p.max_k, p.len_k(b));
  }
  p.total_q = p.cu_q.back();
  p.total_k = p.cu_k.back();
  std::normal_distribution<double> n01(0.0, 1.0);
  auto fill = [&](std::vector<double>& x, std::int64_t n) {
    x.resize(static_cast<std::size_t>(n));
    for (double& e : x) e = round_dt(c.dtype, n01(rng));
  };
  fill(p.q, p.total_q * c.hq * c.d);
  fill(p.k, p.total_k * c.hkv * c.d);
  fill(p.v, p.total_k * c.hkv * c.d);
  fill(p.dout, p.total_q * c.hq * c.d);
  // ALiBi's geometric slopes (2^(-8 (h + 1) / Hq)); per-sequence slopes vary them by batch.
  if (c.alibi != 0) {
    const std::int64_t rows = c.alibi == 2 ? p.batch : 1;
    for (std::int64_t b = 0; b < rows; ++b)
      for (std::int64_t h = 0; h < c.hq; ++h)
        p.slopes.push_back(std::exp2(-8.f * static_cast<float>(h + 1) / static_cast<float>(c.hq)) *
                           (1.f + 0.25f * static_cast<float>(b)));
  }
  // Sinks near the rows' LSE, so they take a real share of the mass.
  if (c.sinks)
    for (std::int64_t h = 0; h < c.hq; ++h) p.sinks.push_back(static_cast<float>(1.5 + n01(rng)));
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  return p;
}

// The definition (issue 12), written out: key j is visible to query i of a sequence of sq queries and sk keys iff
// i + sk - sq - left <= j <= i + sk - sq + right (-1 = unbounded; causal: right = 0).
inline bool visible(const VCase& c, std::int64_t i, std::int64_t j, std::int64_t sq, std::int64_t sk) {
  const std::int64_t right = c.causal ? 0 : c.right;
  const std::int64_t diag = i + sk - sq;
  if (c.left >= 0 && j < diag - c.left) return false;
  if (right >= 0 && j > diag + right) return false;
  return true;
}

struct Out {
  std::vector<double> out, lse, dq, dk, dv, dsinks;
};

// Standard attention in the case's precision (the tolerance yardstick): float32 arithmetic, S, P, O, dP and the
// gradients rounded to the dtype where an eager framework stores them; score hook and sinks as defined.
inline Out standard_attention(const Host& p) {
  const VCase& c = p.c;
  const DType t = c.dtype;
  auto rd = [t](double x) { return static_cast<float>(round_dt(t, x)); };
  Out r;
  r.out.assign(p.q.size(), 0.0);
  r.lse.assign(static_cast<std::size_t>(c.varlen ? c.hq * p.total_q : p.batch * c.hq * p.max_q), 0.0);
  r.dq.assign(p.q.size(), 0.0);
  r.dk.assign(p.k.size(), 0.0);
  r.dv.assign(p.v.size(), 0.0);
  r.dsinks.assign(c.sinks ? static_cast<std::size_t>(c.hq) : 0, 0.0);
  const std::int64_t group = c.hq / c.hkv, D = c.d;
  std::vector<float> S, P, dS, dsc, psink;  // one (sequence, head) at a time
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < c.hq; ++h) {
      const std::int64_t sq = p.len_q(b), sk = p.used_k(b), hk = h / group;
      auto qa = [&](std::int64_t i) { return static_cast<std::size_t>(((p.row0_q(b) + i) * c.hq + h) * D); };
      auto ka = [&](std::int64_t j) { return static_cast<std::size_t>(((p.row0_k(b) + j) * c.hkv + hk) * D); };
      const float slope = p.slope(b, h), sink = p.sink(h);
      const auto n = static_cast<std::size_t>(sq * sk);
      S.assign(n, 0.f);
      P.assign(n, 0.f);
      dS.assign(n, 0.f);
      dsc.assign(n, 1.f);
      psink.assign(static_cast<std::size_t>(sq), 0.f);
      for (std::int64_t i = 0; i < sq; ++i) {
        float m = sink;
        for (std::int64_t j = 0; j < sk; ++j) {
          float s = 0.f;
          for (std::int64_t e = 0; e < D; ++e) s += static_cast<float>(p.q[qa(i) + e] * p.k[ka(j) + e]);
          s *= p.scale;
          if (c.softcap > 0.f) {
            const float th = std::tanh(s / c.softcap);
            s = c.softcap * th;
            dsc[i * sk + j] = 1.f - th * th;
          }
          s -= slope * std::fabs(static_cast<float>(i + sk - sq - j));
          S[i * sk + j] = visible(c, i, j, sq, sk) ? rd(s) : -INFINITY;
          m = std::max(m, S[i * sk + j]);
        }
        const float m_ref = m == -INFINITY ? 0.f : m;
        float l = c.sinks ? std::exp(sink - m_ref) : 0.f;
        for (std::int64_t j = 0; j < sk; ++j) l += (P[i * sk + j] = std::exp(S[i * sk + j] - m_ref));
        for (std::int64_t j = 0; j < sk; ++j) P[i * sk + j] = l == 0.f ? 0.f : rd(P[i * sk + j] / l);
        if (c.sinks) psink[i] = rd(std::exp(sink - m_ref) / l);
        r.lse[p.lse_at(b, h, i)] = l == 0.f ? -kInf : m_ref + std::log(l);
        for (std::int64_t e = 0; e < D; ++e) {
          float o = 0.f;
          for (std::int64_t j = 0; j < sk; ++j)
            if (P[i * sk + j] != 0.f) o += P[i * sk + j] * static_cast<float>(p.v[ka(j) + e]);
          r.out[qa(i) + e] = rd(o);
        }
        float delta = 0.f;
        for (std::int64_t e = 0; e < D; ++e) delta += static_cast<float>(p.dout[qa(i) + e] * r.out[qa(i) + e]);
        if (c.sinks) r.dsinks[static_cast<std::size_t>(h)] -= psink[i] * delta;
        for (std::int64_t j = 0; j < sk; ++j) {
          dS[i * sk + j] = 0.f;
          if (S[i * sk + j] == -INFINITY) continue;
          float dp = 0.f;
          for (std::int64_t e = 0; e < D; ++e) dp += static_cast<float>(p.dout[qa(i) + e] * p.v[ka(j) + e]);
          dS[i * sk + j] = rd(P[i * sk + j] * (rd(dp) - delta));
        }
      }
      for (std::int64_t i = 0; i < sq; ++i)
        for (std::int64_t j = 0; j < sk; ++j) {
          if (S[i * sk + j] == -INFINITY) continue;
          const float ds = dS[i * sk + j] * dsc[i * sk + j] * p.scale, pij = P[i * sk + j];
          for (std::int64_t e = 0; e < D; ++e) {
            r.dq[qa(i) + e] += ds * p.k[ka(j) + e];
            r.dk[ka(j) + e] += ds * p.q[qa(i) + e];
            r.dv[ka(j) + e] += pij * p.dout[qa(i) + e];
          }
        }
    }
  for (auto* vec : {&r.out, &r.dq, &r.dk, &r.dv})
    for (double& x : *vec) x = rd(x);
  return r;
}

// Bytes of x in dtype t (row-major).
inline std::vector<unsigned char> encode(const std::vector<double>& x, DType t) {
  std::vector<unsigned char> bytes(x.size() * flashtile::dtype_size(t));
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (t == DType::float32) {
      const float f = static_cast<float>(x[i]);
      std::memcpy(&bytes[i * 4], &f, 4);
    } else if (t == DType::float16) {
      const _Float16 h = static_cast<_Float16>(x[i]);
      std::memcpy(&bytes[i * 2], &h, 2);
    } else {
      const auto u = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(static_cast<float>(round_dt(t, x[i]))) >> 16);
      std::memcpy(&bytes[i * 2], &u, 2);
    }
  }
  return bytes;
}

inline std::vector<double> decode(const std::vector<unsigned char>& bytes, DType t) {
  const std::size_t w = flashtile::dtype_size(t);
  std::vector<double> x(bytes.size() / w);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = flashtile::detail::load_element(&bytes[i * w], t);
  return x;
}

// One buffer on the host or the GPU with its view; outputs start as NaN (0xff bytes).
class Buf {
 public:
  Buf(flashtile::Device dev, DType t, std::vector<std::int64_t> shape, const std::vector<unsigned char>* init)
      : dev_(dev), shape_(std::move(shape)) {
    std::int64_t n = 1;
    for (std::int64_t s : shape_) n *= s;
    bytes_ = static_cast<std::size_t>(n) * flashtile::dtype_size(t);
    std::vector<unsigned char> poison(bytes_, 0xff);
    const std::vector<unsigned char>& src = init != nullptr ? *init : poison;
    if (dev_ == flashtile::Device::cuda) {
      if (bytes_ > 0 && cudaMalloc(&data_, bytes_) != cudaSuccess) throw std::runtime_error("cudaMalloc failed");
      if (bytes_ > 0 && cudaMemcpy(data_, src.data(), bytes_, cudaMemcpyHostToDevice) != cudaSuccess)
        throw std::runtime_error("cudaMemcpy H2D failed");
    } else {
      host_ = src;
      data_ = host_.data();
    }
    view_.data = bytes_ > 0 ? data_ : nullptr;
    view_.dtype = t;
    view_.device = dev;
    view_.rank = static_cast<int>(shape_.size());
    std::int64_t stride = 1;
    for (int i = view_.rank - 1; i >= 0; --i) {
      view_.shape[static_cast<std::size_t>(i)] = shape_[static_cast<std::size_t>(i)];
      view_.stride[static_cast<std::size_t>(i)] = stride;
      stride *= std::max<std::int64_t>(shape_[static_cast<std::size_t>(i)], 1);
    }
  }
  ~Buf() {
    if (dev_ == flashtile::Device::cuda && data_ != nullptr) cudaFree(data_);
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  const TensorView& view() const { return view_; }
  std::vector<unsigned char> bytes() const {
    std::vector<unsigned char> out(bytes_);
    if (bytes_ == 0) return out;
    if (dev_ == flashtile::Device::cuda) {
      if (cudaMemcpy(out.data(), data_, bytes_, cudaMemcpyDeviceToHost) != cudaSuccess)
        throw std::runtime_error("cudaMemcpy D2H failed");
    } else {
      std::memcpy(out.data(), data_, bytes_);
    }
    return out;
  }
  std::vector<double> values() const { return decode(bytes(), view_.dtype); }

 private:
  flashtile::Device dev_;
  std::vector<std::int64_t> shape_;
  std::size_t bytes_ = 0;
  void* data_ = nullptr;
  std::vector<unsigned char> host_;
  TensorView view_;
};

inline std::vector<unsigned char> int32_bytes(const std::vector<std::int32_t>& x) {
  std::vector<unsigned char> b(x.size() * 4);
  if (!x.empty()) std::memcpy(b.data(), x.data(), b.size());
  return b;
}
inline std::vector<double> widen(const std::vector<float>& x) { return {x.begin(), x.end()}; }

// Every operand of one call on one device (the GPU in the case's dtype, the host in float32 for the reference).
struct Call {
  std::unique_ptr<Buf> q, k, v, out, lse, dout, dq, dk, dv, slopes, sinks, dsinks, cu_q, cu_k, used_k;
  flashtile::Options o;

  Call(const Host& p, flashtile::Device dev, DType t, const std::string& backend) {
    const VCase& c = p.c;
    auto shape = [&](std::int64_t rows, std::int64_t seq, std::int64_t heads) -> std::vector<std::int64_t> {
      if (c.varlen) return {rows, heads, c.d};
      return {p.batch, seq, heads, c.d};
    };
    auto make = [&](DType dt, std::vector<std::int64_t> s, const std::vector<double>* init) {
      if (init == nullptr) return std::make_unique<Buf>(dev, dt, std::move(s), nullptr);
      const auto bytes = encode(*init, dt);
      return std::make_unique<Buf>(dev, dt, std::move(s), &bytes);
    };
    q = make(t, shape(p.total_q, p.max_q, c.hq), &p.q);
    k = make(t, shape(p.total_k, p.max_k, c.hkv), &p.k);
    v = make(t, shape(p.total_k, p.max_k, c.hkv), &p.v);
    dout = make(t, shape(p.total_q, p.max_q, c.hq), &p.dout);
    out = make(t, shape(p.total_q, p.max_q, c.hq), nullptr);
    dq = make(t, shape(p.total_q, p.max_q, c.hq), nullptr);
    dk = make(t, shape(p.total_k, p.max_k, c.hkv), nullptr);
    dv = make(t, shape(p.total_k, p.max_k, c.hkv), nullptr);
    lse = make(DType::float32,
               c.varlen ? std::vector<std::int64_t>{c.hq, p.total_q} : std::vector<std::int64_t>{p.batch, c.hq, p.max_q},
               nullptr);
    o.backend = backend;
    o.strict = true;
    o.causal = c.causal;
    o.window_size = {c.left, c.right};
    o.softcap = c.softcap;
    o.softmax_scale = p.scale;
    if (c.alibi != 0) {
      const auto w = widen(p.slopes);
      slopes = make(DType::float32, c.alibi == 2 ? std::vector<std::int64_t>{p.batch, c.hq} : std::vector<std::int64_t>{c.hq}, &w);
      o.alibi_slopes = slopes->view();
    }
    if (c.sinks) {
      const auto w = widen(p.sinks);
      sinks = make(DType::float32, {c.hq}, &w);
      dsinks = make(DType::float32, {c.hq}, nullptr);
      o.sinks = sinks->view();
      o.dsinks = dsinks->view();
    }
    if (!c.used_k.empty()) {
      std::vector<std::int32_t> used;
      for (std::int64_t b = 0; b < p.batch; ++b) used.push_back(static_cast<std::int32_t>(p.used_k(b)));
      const auto bu = int32_bytes(used);
      used_k = std::make_unique<Buf>(dev, int32_dtype<DType>(), std::vector<std::int64_t>{p.batch}, &bu);
      o.seqused_k = used_k->view();
    }
    if (c.varlen) {
      const auto bq = int32_bytes(p.cu_q), bk = int32_bytes(p.cu_k);
      const DType i32 = int32_dtype<DType>();
      cu_q = std::make_unique<Buf>(dev, i32, std::vector<std::int64_t>{p.batch + 1}, &bq);
      cu_k = std::make_unique<Buf>(dev, i32, std::vector<std::int64_t>{p.batch + 1}, &bk);
      o.cu_seqlens_q = cu_q->view();
      o.cu_seqlens_k = cu_k->view();
      o.max_seqlen_q = p.max_q;
      o.max_seqlen_k = p.max_k;
    }
  }

  flashtile::DispatchReport forward() const {
    return flashtile::forward(q->view(), k->view(), v->view(), out->view(), lse->view(), o);
  }
  flashtile::DispatchReport backward(bool deterministic) {
    flashtile::Options ob = o;
    ob.deterministic = deterministic;
    if (ob.backend == "cuda-sm90" && deterministic) ob.backend = "cuda-sm80";  // sm90: no ordered dQ yet
    return flashtile::backward(q->view(), k->view(), v->view(), out->view(), dout->view(), lse->view(), dq->view(),
                               dk->view(), dv->view(), ob);
  }
  Out results() const {
    Out r{out->values(), lse->values(), dq->values(), dk->values(), dv->values(), {}};
    if (dsinks) r.dsinks = dsinks->values();
    return r;
  }
};

// The size of the terms each output is summed from (support.h: a score's rounding is eps times these, not eps
// times the score): LSE: max over visible (i, j) of scale Σ|q k| + |ALiBi term|, and |sink|; dsinks: Σ_i of
// |exp(sink - lse_i) · D_i| per head.
inline double lse_magnitude(const Host& p) {
  const VCase& c = p.c;
  double m = 0.0;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < c.hq; ++h) {
      m = std::max(m, c.sinks ? std::fabs(static_cast<double>(p.sink(h))) : 0.0);
      const std::int64_t sq = p.len_q(b), sk = p.used_k(b), hk = h / (c.hq / c.hkv);
      for (std::int64_t i = 0; i < sq; ++i)
        for (std::int64_t j = 0; j < sk; ++j) {
          if (!visible(c, i, j, sq, sk)) continue;
          double sum = 0.0;
          for (std::int64_t e = 0; e < c.d; ++e)
            sum += std::fabs(p.q[static_cast<std::size_t>(((p.row0_q(b) + i) * c.hq + h) * c.d + e)] *
                             p.k[static_cast<std::size_t>(((p.row0_k(b) + j) * c.hkv + hk) * c.d + e)]);
          m = std::max(m, p.scale * sum + std::fabs(p.slope(b, h) * static_cast<double>(i + sk - sq - j)));
        }
    }
  return m;
}

inline double dsink_magnitude(const Host& p, const Out& ref) {
  const VCase& c = p.c;
  double m = 0.0;
  for (std::int64_t h = 0; h < c.hq; ++h) {
    double sum = 0.0;
    for (std::int64_t b = 0; b < p.batch; ++b)
      for (std::int64_t i = 0; i < p.len_q(b); ++i) {
        const double lse = ref.lse[p.lse_at(b, h, i)];
        if (lse == -kInf) continue;
        double delta = 0.0;
        for (std::int64_t e = 0; e < c.d; ++e) {
          const auto a = static_cast<std::size_t>(((p.row0_q(b) + i) * c.hq + h) * c.d + e);
          delta += p.dout[a] * ref.out[a];
        }
        sum += std::fabs(std::exp(static_cast<double>(p.sink(h)) - lse) * delta);
      }
    m = std::max(m, sum);
  }
  return m;
}


}  // namespace ft_gpu
