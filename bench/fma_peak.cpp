// Measures this CPU's float32 FMA peak (GFLOP/s) for 1..N threads: independent FMA chains on the widest
// vectors the CPU executes (AVX-512 or AVX2), enough chains to cover the FMA latency. The ceiling the CPU
// benchmark's GFLOP/s are read against. On CPUs with AVX512_BF16 it also measures the bf16 dot-product peak
// (vdpbf16ps: 16 lanes x 2 products, counted as 64 FLOP), and on CPUs with AMX-BF16 the tile peak (tdpbf16ps:
// 16 x 16 outputs x 32 products, 16384 FLOP), the ceiling of the bf16 forward on each path.
// Each figure is the best of 3 timed runs after a warm-up: server CPUs raise their clock only after a second or
// more of load, and a single cold run read 123 GFLOP/s for one thread against 307 for two.
#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include <sys/syscall.h>
#include <unistd.h>

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

__attribute__((target("avx512f,avx512bf16"))) float run_avx512_bf16() {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80);  // bf16 pair (1, 1)
  const __m512bh b = (__m512bh)_mm512_set1_epi32(0x33d733d7);  // bf16 pair (1e-7, 1e-7)
  for (long it = 0; it < kIters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  float s = 0;
  for (int i = 0; i < 12; ++i) s += _mm512_cvtss_f32(acc[i]);
  return s;
}

constexpr long kAmxIters = kIters / 8;  // ~100 M cycles at 64 cycles per 4 tdpbf16ps

// Four independent accumulator tiles (0-3) from two A and two B tiles, enough to cover tdpbf16ps's latency.
__attribute__((target("amx-tile,amx-bf16"))) float run_amx() {
  struct alignas(64) {
    std::uint8_t palette = 1, start = 0, reserved[14] = {};
    std::uint16_t colsb[16] = {};
    std::uint8_t rows[16] = {};
  } cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  alignas(64) static thread_local std::uint16_t ab[16 * 32];
  alignas(64) static thread_local float c[16 * 16];
  for (auto& x : ab) x = 0x3f80;  // bf16 1.0
  _tile_loadconfig(&cfg);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, ab, 64);
  _tile_loadd(5, ab, 64);
  _tile_loadd(6, ab, 64);
  _tile_loadd(7, ab, 64);
  for (long it = 0; it < kAmxIters; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 5, 6);
    _tile_dpbf16ps(2, 4, 7);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, 64);
  _tile_release();
  return c[0];
}

// Linux hands out the tile registers only on request (as src/cpu/isa.cpp does).
bool amx_usable() {
  if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-bf16")) return false;
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
}

// Best GFLOP/s of 3 runs of `kernel` on t threads; flops per thread and run.
template <class Kernel>
double best_gflops(int t, double flops, Kernel kernel, float& sink) {
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(t) reduction(+ : sink)
    sink += kernel();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double g = flops * t / s * 1e-9;
    best = g > best ? g : best;
  }
  return best;
}

}  // namespace

int main() {
  __builtin_cpu_init();
  // FT_FMA_PEAK_ISA=avx2: the 256-bit peak of an AVX-512 CPU (the ceiling of the avx2 kernel set run there).
  const char* isa = std::getenv("FT_FMA_PEAK_ISA");
  const bool avx512 = __builtin_cpu_supports("avx512f") && !(isa != nullptr && std::string_view(isa) == "avx2");
  const int lanes = avx512 ? 16 : 8;
  const int max_threads = omp_get_max_threads();
  const bool bf16 = avx512 && __builtin_cpu_supports("avx512bf16");
  const bool amx = amx_usable();
  float sink = 0;
  {  // warm-up: about a second of FMAs on every thread, so the timed runs see the loaded clock
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 1.0) {
#pragma omp parallel num_threads(max_threads) reduction(+ : sink)
      sink += avx512 ? run_avx512() : run_avx2();
    }
  }
  for (int t = 1; t <= max_threads; ++t) {
    const double g = best_gflops(t, 2.0 * 12 * lanes * kIters, avx512 ? run_avx512 : run_avx2, sink);
    std::printf("{\"threads\": %d, \"isa\": \"%s\", \"kind\": \"fma\", \"gflops\": %.1f, \"sink\": %g}\n", t,
                avx512 ? "avx512" : "avx2", g, static_cast<double>(sink));
    if (bf16) {
      const double gb = best_gflops(t, 4.0 * 12 * 16 * kIters, run_avx512_bf16, sink);
      std::printf("{\"threads\": %d, \"isa\": \"avx512-bf16\", \"kind\": \"bf16dot\", \"gflops\": %.1f, \"sink\": %g}\n",
                  t, gb, static_cast<double>(sink));
    }
    if (amx) {
      const double ga = best_gflops(t, 16384.0 * 4 * kAmxIters, run_amx, sink);
      std::printf("{\"threads\": %d, \"isa\": \"avx512-amx\", \"kind\": \"amx\", \"gflops\": %.1f, \"sink\": %g}\n",
                  t, ga, static_cast<double>(sink));
    }
  }
  return 0;
}
