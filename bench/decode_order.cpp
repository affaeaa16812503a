// A CPU decode that reads the KV cache in address order, for measurement only (issue 14's CPU target: batch 1,
// 32k keys at >= 80 % of the read bandwidth). bench/read_order.cpp showed that this EPYC reads a key block head by
// head (src/cpu/flash_decode.cpp's order) at a third to a half of the ascending order's rate; this kernel takes the
// ascending order and pays for it in arithmetic, so that the two costs can be weighed on one machine.
//
// The cell of the target: one query token, GQA 32/8 (4 query rows per KV head, 32 rows), head dim 128, a bf16
// (keys, 8, 128) K and V, the threads splitting the keys. Per key, all 8 heads: the 32 scores on vdpbf16ps (the
// query's own bf16 bits), a lazy online softmax (the running max moves only when a score passes it by 8 in log2
// units, so P <= 256 and the float sums stay exact enough), then P·V into float sums of all 32 rows (16 KiB, in L1).
//   key    one key at a time: K[j] and V[j] read in address order; P·V by FMAs on V widened to float, the sums
//          loaded and stored once per key (its cost)
//   pairs  two keys at a time: P·V on vdpbf16ps with P rounded to bf16, half the loads and stores of the sums,
//          but V read head by head across the pair (V[j, h], V[j + 1, h], then h + 1): not in address order
// Each mode reports the median GB/s of K+V over the calls and the largest error of three rows' outputs against a
// float64 reference (the threads' partial results merged as merge_attention_states does).
//
//   OMP_NUM_THREADS=2 build/cpu/bench/flashtile_decode_order [keys=32768] [calls=30]
//
// Standalone, as read_order.cpp: its reduction and 2^x are short copies of src/cpu/simd.h's reduce_lanes and exp2,
// because simd.h is compiled per kernel set with that set's flags, and this binary must start (and refuse) on any
// x86 CPU: only the functions marked FT_TARGET use AVX-512, after main's CPU check.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <vector>

namespace {

constexpr int kHeads = 8, kGroup = 4, kD = 128, kRows = kHeads * kGroup, kKeyElems = kHeads * kD;
#define FT_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// The 16 dot products a[0..15] as one vector: lane i = the sum of a[i]'s lanes. Inlined always: called out of
// line (GCC 12 at -O3 did), the kernel read memory at half the rate (the 16 sums spilled around a call per key).
[[gnu::always_inline]] FT_TARGET inline __m512 reduce16(const __m512* a) {
  __m512 b[8], c[4], d[2];
  for (int k = 0; k < 8; ++k)
    b[k] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * k], a[2 * k + 1]), _mm512_unpackhi_ps(a[2 * k], a[2 * k + 1]));
  for (int k = 0; k < 4; ++k)
    c[k] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * k], b[2 * k + 1], 0x44), _mm512_shuffle_ps(b[2 * k], b[2 * k + 1], 0xEE));
  for (int k = 0; k < 2; ++k)
    d[k] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * k], c[2 * k + 1], 0x88),
                         _mm512_shuffle_f32x4(c[2 * k], c[2 * k + 1], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(d[0], d[1], 0x88), _mm512_shuffle_f32x4(d[0], d[1], 0xDD));
}

// 2^x for x <= 8 (degree-5 polynomial, 2^n by vscalefps).
[[gnu::always_inline]] FT_TARGET inline __m512 exp2v(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-126.f));
  const __m512 n = _mm512_roundscale_ps(x, 0x08), f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.3333558e-3f);
  for (float c : {9.6181291e-3f, 5.5504109e-2f, 2.4022651e-1f, 6.9314718e-1f, 1.f}) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
  return _mm512_scalef_ps(p, n);
}

struct Part {  // one thread's keys: unnormalised sums, running max (log2 units) and sum of P per row
  alignas(64) float o[kRows][kD];
  alignas(64) float m[kRows], l[kRows];
};

struct Kernel {
  const std::uint16_t *k, *v, *q;  // q: the 32 rows' bf16 bits, row h * 4 + g
  float scale_log2;
  alignas(64) int lane_order[16];  // reduce16's lanes in row order

  // Scores of key j for all 32 rows, in log2 units (two vectors of 16 rows).
  FT_TARGET void scores(long j, __m512 s[2]) const {
    const std::uint16_t* kr = k + j * kKeyElems;
    for (int hg = 0; hg < 2; ++hg) {
      __m512 acc[16];
      for (auto& a : acc) a = _mm512_setzero_ps();
      for (int c = 0; c < kD; c += 32)
        for (int h4 = 0; h4 < 4; ++h4) {
          const int h = hg * 4 + h4;
          const auto kz = (__m512bh)_mm512_loadu_si512(kr + h * kD + c);
          for (int g = 0; g < kGroup; ++g)
            acc[h4 * 4 + g] = _mm512_dpbf16_ps(acc[h4 * 4 + g], (__m512bh)_mm512_loadu_si512(q + (h * 4 + g) * kD + c), kz);
        }
      s[hg] = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_load_si512(lane_order), reduce16(acc)), _mm512_set1_ps(scale_log2));
    }
  }
  // The lazy max: rows whose score passes m + 8 move m to it and rescale their sums (and `earlier`, a key's P
  // computed under the old m). Returns P = 2^(s - m).
  FT_TARGET static __m512 softmax(Part& w, int half, __m512 s, __m512& m, __m512& l, float* earlier) {
    const __mmask16 move = _mm512_cmp_ps_mask(s, _mm512_add_ps(m, _mm512_set1_ps(8.f)), _CMP_GT_OQ);
    if (move != 0) {
      const __m512 mn = _mm512_mask_max_ps(m, move, m, s), alpha = exp2v(_mm512_sub_ps(m, mn));
      alignas(64) float a[16];
      _mm512_store_ps(a, alpha);
      for (int r = 0; r < 16; ++r)
        if ((move >> r) & 1)
          for (int c = 0; c < kD; c += 16) {
            float* o = w.o[half * 16 + r] + c;
            _mm512_store_ps(o, _mm512_mul_ps(_mm512_load_ps(o), _mm512_set1_ps(a[r])));
          }
      l = _mm512_mul_ps(l, alpha);
      if (earlier != nullptr) _mm512_store_ps(earlier, _mm512_mul_ps(_mm512_load_ps(earlier), alpha));
      m = mn;
    }
    const __m512 p = exp2v(_mm512_sub_ps(s, m));
    l = _mm512_add_ps(l, p);
    return p;
  }

  // mode key: sums in column_of_key() order.
  FT_TARGET void by_key(long j0, long j1, Part& w) const {
    __m512 m[2] = {_mm512_set1_ps(-INFINITY), _mm512_set1_ps(-INFINITY)}, l[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    std::memset(w.o, 0, sizeof w.o);
    alignas(64) float p[kRows];
    for (long j = j0; j < j1; ++j) {
      __m512 s[2];
      scores(j, s);
      for (int i = 0; i < 2; ++i) _mm512_store_ps(p + 16 * i, softmax(w, i, s[i], m[i], l[i], nullptr));
      const std::uint16_t* vr = v + j * kKeyElems;
      for (int h = 0; h < kHeads; ++h) {
        __m512 vf[8];  // V[j, h] widened: each 32 values as their even and their odd ones (column_of_key())
        for (int c = 0; c < 4; ++c) {
          const __m512i x = _mm512_loadu_si512(vr + h * kD + 32 * c);
          vf[2 * c] = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
          vf[2 * c + 1] = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
        }
        for (int g = 0; g < kGroup; ++g) {
          const __m512 pr = _mm512_set1_ps(p[h * 4 + g]);
          float* o = w.o[h * 4 + g];
          for (int c = 0; c < 8; ++c) _mm512_store_ps(o + 16 * c, _mm512_fmadd_ps(pr, vf[c], _mm512_load_ps(o + 16 * c)));
        }
      }
    }
    for (int i = 0; i < 2; ++i) _mm512_store_ps(w.m + 16 * i, m[i]), _mm512_store_ps(w.l + 16 * i, l[i]);
  }

  // modes pairs and staged: sums in the order of _mm512_unpacklo/hi_epi16 (column_of_pairs()). staged reads V[j]
  // whole into an L1 buffer first and V[j + 1] in address order against it; pairs reads both head by head.
  FT_TARGET void by_pair(long j0, long j1, Part& w, bool staged) const {
    __m512 m[2] = {_mm512_set1_ps(-INFINITY), _mm512_set1_ps(-INFINITY)}, l[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    std::memset(w.o, 0, sizeof w.o);
    alignas(64) float p[2][kRows];
    alignas(64) std::uint32_t pp[kRows];  // (P[j], P[j + 1]) in bf16 per row
    alignas(64) std::uint16_t first[kKeyElems];  // staged: V[j]
    const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                                6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (long j = j0; j < j1; j += 2) {
      for (int kk = 0; kk < 2; ++kk) {
        __m512 s[2];
        scores(j + kk, s);
        for (int i = 0; i < 2; ++i)
          _mm512_store_ps(p[kk] + 16 * i, softmax(w, i, s[i], m[i], l[i], kk == 1 ? p[0] + 16 * i : nullptr));
      }
      for (int i = 0; i < 2; ++i) {
        const __m512bh both = _mm512_cvtne2ps_pbh(_mm512_load_ps(p[1] + 16 * i), _mm512_load_ps(p[0] + 16 * i));
        _mm512_store_si512(pp + 16 * i, _mm512_permutexvar_epi16(interleave, (__m512i)both));
      }
      const std::uint16_t *v0 = v + j * kKeyElems, *v1 = v0 + kKeyElems;
      if (staged) {
        for (int c = 0; c < kKeyElems; c += 32) _mm512_store_si512(first + c, _mm512_loadu_si512(v0 + c));
        v0 = first;
      }
      for (int h = 0; h < kHeads; ++h) {
        __m512bh vp[8];
        for (int c = 0; c < 4; ++c) {
          const __m512i x = _mm512_loadu_si512(v0 + h * kD + 32 * c), y = _mm512_loadu_si512(v1 + h * kD + 32 * c);
          vp[2 * c] = (__m512bh)_mm512_unpacklo_epi16(x, y);
          vp[2 * c + 1] = (__m512bh)_mm512_unpackhi_epi16(x, y);
        }
        for (int g = 0; g < kGroup; ++g) {
          const auto pr = (__m512bh)_mm512_set1_epi32(static_cast<int>(pp[h * 4 + g]));
          float* o = w.o[h * 4 + g];
          for (int u = 0; u < 8; ++u) _mm512_store_ps(o + 16 * u, _mm512_dpbf16_ps(_mm512_load_ps(o + 16 * u), pr, vp[u]));
        }
      }
    }
    for (int i = 0; i < 2; ++i) _mm512_store_ps(w.m + 16 * i, m[i]), _mm512_store_ps(w.l + 16 * i, l[i]);
  }
};

// Where column c of a row sits in by_key's sums.
int column_of_key(int c) { return c / 32 * 32 + c % 2 * 16 + c % 32 / 2; }

// Where column c of a row sits in by_pair's sums.
int column_of_pairs(int c) {
  const int cc = c % 32, lane = cc / 8, e = cc % 8;
  return c / 32 * 32 + (e >= 4) * 16 + lane * 4 + e % 4;
}

float bf16_value(std::uint16_t x) {
  const std::uint32_t u = std::uint32_t{x} << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

FT_TARGET void reduce16_lane_order(int* idx) {  // reduce16's lane of each input, as a permutation into input order
  __m512 t[16];
  for (int i = 0; i < 16; ++i) t[i] = _mm512_set1_ps(static_cast<float>(i));
  alignas(64) float o[16];
  _mm512_store_ps(o, reduce16(t));
  for (int i = 0; i < 16; ++i) idx[static_cast<int>(o[i]) / 16] = i;
}

}  // namespace

int main(int argc, char** argv) {
  if (!__builtin_cpu_supports("avx512bf16")) {
    std::printf("this CPU has no AVX512_BF16: nothing to measure\n");
    return 0;
  }
  const long keys = argc > 1 ? std::max(2L, std::atol(argv[1])) / 2 * 2 : 32768;
  const int calls = argc > 2 ? std::max(1, std::atoi(argv[2])) : 30;
  const std::size_t n = static_cast<std::size_t>(keys) * kKeyElems;
  auto* k = static_cast<std::uint16_t*>(std::aligned_alloc(64, n * 2));
  auto* v = static_cast<std::uint16_t*>(std::aligned_alloc(64, n * 2));
  auto* q = static_cast<std::uint16_t*>(std::aligned_alloc(64, kRows * kD * 2));
  if (k == nullptr || v == nullptr || q == nullptr) return 1;
  std::srand(1);
  const auto random_bf16 = [] {
    const float f = static_cast<float>(std::rand()) / RAND_MAX * 2.f - 1.f;
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return static_cast<std::uint16_t>(u >> 16);
  };
  for (std::size_t i = 0; i < n; ++i) k[i] = random_bf16(), v[i] = random_bf16();
  for (int i = 0; i < kRows * kD; ++i) q[i] = random_bf16();
  const float scale = 1.f / std::sqrt(static_cast<float>(kD));
  Kernel kernel{k, v, q, scale * 1.4426950408889634f, {}};
  reduce16_lane_order(kernel.lane_order);
  const int threads = omp_get_max_threads();
  std::vector<Part> parts(static_cast<std::size_t>(threads));
  std::printf("threads %d; keys %ld, GQA 32/8, hdim 128, bf16; K+V %.0f MiB\n", threads, keys, 4.0 * n / 1048576);

  for (const int mode : {0, 1, 2}) {  // key, pairs, staged
    const bool pairs = mode > 0;
    std::vector<double> gbs;
    for (int call = 0; call < calls + 1; ++call) {
      const double t0 = now();
#pragma omp parallel
      {
        const int t = omp_get_thread_num();
        const long j0 = t * keys / threads / 2 * 2, j1 = (t + 1) * keys / threads / 2 * 2;
        Part& w = parts[static_cast<std::size_t>(t)];
        if (pairs) kernel.by_pair(j0, j1, w, mode == 2);
        else kernel.by_key(j0, j1, w);
      }
      if (call > 0) gbs.push_back(4.0 * static_cast<double>(n) / (now() - t0) / 1e9);
    }
    std::sort(gbs.begin(), gbs.end());
    double err = 0;  // rows 0, 13, 31 against float64, the threads' parts merged
    for (const int r : {0, 13, 31}) {
      const int h = r / kGroup;
      std::vector<double> s(static_cast<std::size_t>(keys)), o(kD, 0.0), om(kD, 0.0);
      double mx = -INFINITY, sum = 0, lm = 0, mm = -INFINITY;
      for (long j = 0; j < keys; ++j) {
        double a = 0;
        for (int c = 0; c < kD; ++c) a += double{bf16_value(q[r * kD + c])} * bf16_value(k[j * kKeyElems + h * kD + c]);
        s[static_cast<std::size_t>(j)] = a * scale;
        mx = std::max(mx, a * scale);
      }
      for (long j = 0; j < keys; ++j) {
        const double p = std::exp(s[static_cast<std::size_t>(j)] - mx);
        sum += p;
        for (int c = 0; c < kD; ++c) o[c] += p * bf16_value(v[j * kKeyElems + h * kD + c]);
      }
      for (const Part& w : parts) mm = std::max(mm, double{w.m[r]});
      for (const Part& w : parts) {
        const double f = std::exp2(w.m[r] - mm);
        lm += f * w.l[r];
        for (int c = 0; c < kD; ++c) om[c] += f * w.o[r][pairs ? column_of_pairs(c) : column_of_key(c)];
      }
      for (int c = 0; c < kD; ++c) err = std::max(err, std::fabs(om[c] / lm - o[c] / sum));
    }
    std::printf("  %-6s  %6.1f GB/s (median of %d calls; best %.1f)  max |error| %.1e\n", mode == 0 ? "key" : mode == 1 ? "pairs" : "staged",
                gbs[gbs.size() / 2], calls, gbs.back(), err);
  }
  std::free(k);
  std::free(v);
  std::free(q);
  return 0;
}
