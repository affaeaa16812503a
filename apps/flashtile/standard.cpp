#include "standard.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/exp2.h"

namespace flashtile::app {

std::string blas_description() {
  return std::string(openblas_get_config()) + ", core " + openblas_get_corename();
}

StandardAttention::StandardAttention(const Shape& s, int threads)
    : s_(s), threads_(threads), scale_(1.0f / std::sqrt(static_cast<float>(s.hdim))) {
  openblas_set_num_threads(1);  // parallelism comes from the OpenMP loop over heads
}

namespace {

// The baseline's element-wise passes are compiled for AVX-512, AVX2+FMA and baseline x86-64, picked when the
// program loads (target_clones), as a framework's vectorised softmax is: a scalar std::exp loop made the
// softmax a third of standard attention's forward time on the AVX2 VM (per head, S=2048, D=128: 28 ms of 85).
// exp(x) = 2^(x·log2 e) through FlashTile's exp2 polynomial (src/cpu/exp2.h, 4 ulp), written so that it
// vectorises.
#if defined(__x86_64__)
#define FT_BASELINE_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FT_BASELINE_CLONES
#endif

constexpr float kLog2e = 1.4426950408889634f;

// Softmax of row[0, end) in place, row[end, n) = 0; returns the log-sum-exp.
FT_BASELINE_CLONES float softmax_row(float* row, std::int64_t n, std::int64_t end) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (std::int64_t j = 0; j < end; ++j) m = std::max(m, row[j]);
  float l = 0.0f;
#pragma omp simd reduction(+ : l)
  for (std::int64_t j = 0; j < end; ++j) {
    const float e = flashtile::cpu::exp2_fast((row[j] - m) * kLog2e);
    row[j] = e;
    l += e;
  }
  const float inv = end > 0 ? 1.0f / l : 0.0f;
#pragma omp simd
  for (std::int64_t j = 0; j < end; ++j) row[j] *= inv;
  for (std::int64_t j = end; j < n; ++j) row[j] = 0.0f;
  return end > 0 ? m + std::log(l) : -std::numeric_limits<float>::infinity();
}

// dS = P ∘ (dP − rowsum(P ∘ dP)) for one row, in place in dP.
FT_BASELINE_CLONES void softmax_grad_row(const float* p, float* dp, std::int64_t n) {
  float delta = 0.0f;
#pragma omp simd reduction(+ : delta)
  for (std::int64_t j = 0; j < n; ++j) delta += p[j] * dp[j];
#pragma omp simd
  for (std::int64_t j = 0; j < n; ++j) dp[j] = p[j] * (dp[j] - delta);
}

// Uninitialised, as torch.empty: the products write every element, and page faults then happen in the worker
// that writes a head's rows, not in a serial zero-fill up front.
std::unique_ptr<float[]> uninitialised(std::int64_t n) {
  return std::unique_ptr<float[]>(new float[static_cast<std::size_t>(n)]);
}

}  // namespace

void StandardAttention::release() {
  p_.reset();
  p_size_ = 0;
}

void StandardAttention::forward(const float* q, const float* k, const float* v, float* out, float* lse) {
  const std::int64_t B = s_.batch, H = s_.heads, Hk = s_.kv(), Sq = s_.seqlen_q, Sk = s_.sk(), D = s_.hdim,
                     Dv = s_.dv(), group = H / Hk;
  release();  // a fresh P per call, as an eager framework allocates it, so its memory is measured
  p_size_ = B * H * Sq * Sk;
  p_ = uninitialised(p_size_);
  if (Sq == 0 || Sk == 0) return;
#pragma omp parallel for num_threads(threads_) schedule(dynamic, 1)
  for (std::int64_t bh = 0; bh < B * H; ++bh) {
    const std::int64_t b = bh / H, h = bh % H, hk = h / group;
    float* P = p_.get() + bh * Sq * Sk;
    const float* Q = q + b * Sq * H * D + h * D;
    const float* K = k + b * Sk * Hk * D + hk * D;
    const float* V = v + b * Sk * Hk * Dv + hk * Dv;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(Sq), static_cast<int>(Sk),
                static_cast<int>(D), scale_, Q, static_cast<int>(H * D), K, static_cast<int>(Hk * D), 0.0f, P,
                static_cast<int>(Sk));
    for (std::int64_t i = 0; i < Sq; ++i) {
      const std::int64_t end =
          s_.causal ? std::min<std::int64_t>(Sk, std::max<std::int64_t>(0, i + Sk - Sq + 1)) : Sk;
      lse[bh * Sq + i] = softmax_row(P + i * Sk, Sk, end);
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
  const std::unique_ptr<float[]> dp = uninitialised(p_size_);  // dP, then dS in place: [B, Hq, Sq, Sk]
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
      const float* P = p_.get() + bh * Sq * Sk;
      float* dP = dp.get() + bh * Sq * Sk;
      const float* Q = q + b * Sq * H * D + h * D;
      const float* dO = dout + b * Sq * H * Dv + h * Dv;
      const int ldq = static_cast<int>(H * D), ldk = static_cast<int>(Hk * D), ldo = static_cast<int>(H * Dv),
                ldv = static_cast<int>(Hk * Dv), isq = static_cast<int>(Sq), isk = static_cast<int>(Sk),
                id = static_cast<int>(D), idv = static_cast<int>(Dv);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, isk, idv, isq, 1.0f, P, isk, dO, ldo, beta, dV, ldv);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, isq, isk, idv, 1.0f, dO, ldo, V, ldv, 0.0f, dP, isk);
      for (std::int64_t i = 0; i < Sq; ++i) softmax_grad_row(P + i * Sk, dP + i * Sk, Sk);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, isq, id, isk, scale_, dP, isk, K, ldk, 0.0f,
                  dq + b * Sq * H * D + h * D, ldq);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, isk, id, isq, scale_, dP, isk, Q, ldq, beta, dK, ldk);
    }
  }
}

}  // namespace flashtile::app
