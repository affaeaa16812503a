// Measures this CPU's float32 FMA peak (GFLOP/s) for 1..N threads: independent FMA chains on the widest
// vectors the CPU executes (AVX-512 or AVX2), enough chains to cover the FMA latency. The ceiling the CPU
// benchmark's GFLOP/s are read against.
#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace {

constexpr long kIters = 200'000'000 / 16;

__attribute__((target("avx2,fma"))) float run_avx2() {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (long it = 0; it < kIters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  float s = 0;
  for (int i = 0; i < 12; ++i) s += _mm256_cvtss_f32(acc[i]);
  return s;
}

__attribute__((target("avx512f"))) float run_avx512() {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (long it = 0; it < kIters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  float s = 0;
  for (int i = 0; i < 12; ++i) s += _mm512_cvtss_f32(acc[i]);
  return s;
}

}  // namespace

int main() {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const int lanes = avx512 ? 16 : 8;
  const int max_threads = omp_get_max_threads();
  for (int t = 1; t <= max_threads; ++t) {
    float sink = 0;
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(t) reduction(+ : sink)
    sink += avx512 ? run_avx512() : run_avx2();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double flops = 2.0 * 12 * lanes * static_cast<double>(kIters) * t;
    std::printf("{\"threads\": %d, \"isa\": \"%s\", \"gflops\": %.1f, \"sink\": %g}\n", t, avx512 ? "avx512" : "avx2",
                flops / s * 1e-9, static_cast<double>(sink));
  }
  return 0;
}
