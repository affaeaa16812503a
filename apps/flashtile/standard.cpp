#include "standard.h"

#include <cblas.h>

#include <cmath>
#include <limits>

namespace flashtile::app {

StandardAttention::StandardAttention(const Shape& s, int threads)
    : s_(s), threads_(threads), scale_(1.0f / std::sqrt(static_cast<float>(s.hdim))) {
  openblas_set_num_threads(1);  // parallelism comes from the OpenMP loop over heads
}

void StandardAttention::release() { std::vector<float>().swap(p_); }

void StandardAttention::forward(const float* q, const float* k, const float* v, float* out, float* lse) {
  const std::int64_t B = s_.batch, H = s_.heads, Hk = s_.kv(), Sq = s_.seqlen_q, Sk = s_.sk(), D = s_.hdim,
                     Dv = s_.dv(), group = H / Hk;
  release();  // a fresh P per call, as an eager framework allocates it, so its memory is measured
  p_.assign(static_cast<std::size_t>(B * H * Sq * Sk), 0.0f);
  if (Sq == 0 || Sk == 0) return;
#pragma omp parallel for num_threads(threads_) schedule(dynamic, 1)
  for (std::int64_t bh = 0; bh < B * H; ++bh) {
    const std::int64_t b = bh / H, h = bh % H, hk = h / group;
    float* P = p_.data() + bh * Sq * Sk;
    const float* Q = q + b * Sq * H * D + h * D;
    const float* K = k + b * Sk * Hk * D + hk * D;
    const float* V = v + b * Sk * Hk * Dv + hk * Dv;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(Sq), static_cast<int>(Sk),
                static_cast<int>(D), scale_, Q, static_cast<int>(H * D), K, static_cast<int>(Hk * D), 0.0f, P,
                static_cast<int>(Sk));
    for (std::int64_t i = 0; i < Sq; ++i) {
      float* row = P + i * Sk;
      std::int64_t end = Sk;
      if (s_.causal) end = std::min<std::int64_t>(Sk, std::max<std::int64_t>(0, i + Sk - Sq + 1));
      float m = -std::numeric_limits<float>::infinity();
      for (std::int64_t j = 0; j < end; ++j) m = std::max(m, row[j]);
      float l = 0.0f;
      for (std::int64_t j = 0; j < end; ++j) l += (row[j] = std::exp(row[j] - m));
      const float inv = end > 0 ? 1.0f / l : 0.0f;
      for (std::int64_t j = 0; j < end; ++j) row[j] *= inv;
      for (std::int64_t j = end; j < Sk; ++j) row[j] = 0.0f;
      lse[bh * Sq + i] = end > 0 ? m + std::log(l) : -std::numeric_limits<float>::infinity();
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(Sq), static_cast<int>(Dv),
                static_cast<int>(Sk), 1.0f, P, static_cast<int>(Sk), V, static_cast<int>(Hk * Dv), 0.0f,
                out + b * Sq * H * Dv + h * Dv, static_cast<int>(H * Dv));
  }
}

void StandardAttention::backward(const float* q, const float* k, const float* v, const float* dout, float* dq,
                                 float* dk, float* dv) {
  const std::int64_t B = s_.batch, H = s_.heads, Hk = s_.kv(), Sq = s_.seqlen_q, Sk = s_.sk(), D = s_.hdim,
                     Dv = s_.dv(), group = H / Hk;
  std::vector<float> dp(p_.size());  // dP, then dS in place: [B, Hq, Sq, Sk]
  if (Sq == 0 || Sk == 0) return;
#pragma omp parallel for num_threads(threads_) schedule(dynamic, 1)
  for (std::int64_t bk = 0; bk < B * Hk; ++bk) {  // one KV head per task: dK, dV sum over its group
    const std::int64_t b = bk / Hk, hk = bk % Hk;
    const float* K = k + b * Sk * Hk * D + hk * D;
    const float* V = v + b * Sk * Hk * Dv + hk * Dv;
    float* dK = dk + b * Sk * Hk * D + hk * D;
    float* dV = dv + b * Sk * Hk * Dv + hk * Dv;
    for (std::int64_t g = 0; g < group; ++g) {
      const std::int64_t h = hk * group + g, bh = b * H + h;
      const float beta = g == 0 ? 0.0f : 1.0f;
      const float* P = p_.data() + bh * Sq * Sk;
      float* dP = dp.data() + bh * Sq * Sk;
      const float* Q = q + b * Sq * H * D + h * D;
      const float* dO = dout + b * Sq * H * Dv + h * Dv;
      const int ldq = static_cast<int>(H * D), ldk = static_cast<int>(Hk * D), ldo = static_cast<int>(H * Dv),
                ldv = static_cast<int>(Hk * Dv), isq = static_cast<int>(Sq), isk = static_cast<int>(Sk),
                id = static_cast<int>(D), idv = static_cast<int>(Dv);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, isk, idv, isq, 1.0f, P, isk, dO, ldo, beta, dV, ldv);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, isq, isk, idv, 1.0f, dO, ldo, V, ldv, 0.0f, dP, isk);
      for (std::int64_t i = 0; i < Sq; ++i) {
        const float* pr = P + i * Sk;
        float* dr = dP + i * Sk;
        float delta = 0.0f;
        for (std::int64_t j = 0; j < Sk; ++j) delta += pr[j] * dr[j];
        for (std::int64_t j = 0; j < Sk; ++j) dr[j] = pr[j] * (dr[j] - delta);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, isq, id, isk, scale_, dP, isk, K, ldk, 0.0f,
                  dq + b * Sq * H * D + h * D, ldq);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, isk, id, isq, scale_, dP, isk, Q, ldq, beta, dK, ldk);
    }
  }
}

}  // namespace flashtile::app
