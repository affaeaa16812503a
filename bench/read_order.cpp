// The read bandwidth of a KV cache in the orders a CPU decode can read it (issue 14's CPU target: batch 1, 32k keys
// at >= 80 % of the read bandwidth). The cache is (keys, Hkv = 8, D = 128) bf16, K and V (the layout of
// forward_kvcache's contiguous and paged caches: a key's heads are adjacent, one head's rows 2 KB apart), and the
// threads split the keys as the decode's splits do. Orders:
//   ascending   every key's 8 heads in address order (the sequential read a bandwidth test makes)
//   blocks:N    N keys of head 0, then of head 1, ... (src/cpu/flash_decode.cpp reads a 64-key block so)
//   per-head    all of a split's keys of one head, then the next head (one head per task)
//   blocks:64, H heads per pass   a 64-key block H heads at a time (their rows adjacent, H x 256 bytes per key)
//   blocks:64, one pass ahead     blocks:64 with flash_decode.cpp's requests (Ahead, into L2): this head's V rows
//                                 while its K rows are read, the next (block, head)'s K rows while its V rows are
//   blocks:64, next block's share blocks:64 requesting an eighth of the next block per head pass, in address order
// Only loads and adds: the bound each order puts on a decode, whatever its arithmetic.
//
//   g++ -O2 -fopenmp bench/read_order.cpp -o read_order && OMP_NUM_THREADS=2 ./read_order
#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

constexpr int kHeads = 8, kRowBytes = 256, kKeyBytes = kHeads * kRowBytes;
constexpr int kAheadPass = -100, kAheadBlock = -101;  // the orders with software requests (below -1 - kHeads)

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Sums the 256 bytes of one row into acc (32-byte loads).
__attribute__((target("avx2"))) inline __m256 add_row(__m256 acc, const char* p) {
  for (int c = 0; c < kRowBytes; c += 32) acc = _mm256_add_ps(acc, _mm256_load_ps(reinterpret_cast<const float*>(p + c)));
  return acc;
}

// GB/s of reading K and V (keys x 2 KB each) in `order` (0 ascending, > 0 blocks of that many keys, -1 per head).
__attribute__((target("avx2"))) double read(const char* k, const char* v, std::size_t keys, int order, float& sink) {
  const double t0 = now();
  float total = 0.f;
#pragma omp parallel reduction(+ : total)
  {
    __m256 acc = _mm256_setzero_ps();
    const std::size_t n = static_cast<std::size_t>(omp_get_num_threads()), t = static_cast<std::size_t>(omp_get_thread_num());
    const std::size_t k0 = t * keys / n, k1 = (t + 1) * keys / n;
    if (order == 0) {
      for (std::size_t j = k0; j < k1; ++j)
        for (int h = 0; h < kHeads; ++h) acc = add_row(acc, k + j * kKeyBytes + h * kRowBytes);
      for (std::size_t j = k0; j < k1; ++j)
        for (int h = 0; h < kHeads; ++h) acc = add_row(acc, v + j * kKeyBytes + h * kRowBytes);
    } else if (order < -1 && order > kAheadPass) {
      // blocks of 64 keys, -order heads per pass (their rows adjacent: -order x 256 bytes)
      const int group = -order;
      for (std::size_t jb = k0; jb < k1; jb += 64)
        for (int h0 = 0; h0 < kHeads; h0 += group) {
          const std::size_t je = jb + 64 < k1 ? jb + 64 : k1;
          for (std::size_t j = jb; j < je; ++j)
            for (int h = h0; h < h0 + group; ++h) acc = add_row(acc, k + j * kKeyBytes + h * kRowBytes);
          for (std::size_t j = jb; j < je; ++j)
            for (int h = h0; h < h0 + group; ++h) acc = add_row(acc, v + j * kKeyBytes + h * kRowBytes);
        }
    } else if (order == kAheadPass || order == kAheadBlock) {  // blocks of 64 keys with software requests
      for (std::size_t jb = k0; jb < k1; jb += 64) {
        const std::size_t je = jb + 64 < k1 ? jb + 64 : k1, jn = je + 64 < k1 ? je + 64 : k1;
        for (int h = 0; h < kHeads; ++h) {
          // Request i of the pass's K loop (part 0) or V loop (part 1), or null. kAheadPass: this head's V rows, then
          // the next (block, head)'s K rows; kAheadBlock: rows h·n .. (h + 1)·n of the next block's n keys x 8 heads
          // in address order (key-major), K then V.
          const auto ahead = [&](int part, std::size_t i) -> const char* {
            if (order == kAheadPass) {
              if (part == 0) return v + (jb + i) * kKeyBytes + h * kRowBytes;
              const bool last = h + 1 == kHeads;
              const std::size_t key = (last ? je : jb) + i;
              return key < (last ? jn : je) ? k + key * kKeyBytes + (last ? 0 : h + 1) * kRowBytes : nullptr;
            }
            const std::size_t n = jn - je, g = h * n + i;
            return i < n ? (part == 0 ? k : v) + (je + g / kHeads) * kKeyBytes + (g % kHeads) * kRowBytes : nullptr;
          };
          // The requests are written out in the loops: GCC took a request lambda for pure and deleted its calls.
          for (std::size_t j = jb; j < je; ++j) {
            if (const char* r = ahead(0, j - jb))
              for (int c = 0; c < kRowBytes; c += 64) _mm_prefetch(r + c, _MM_HINT_T1);
            acc = add_row(acc, k + j * kKeyBytes + h * kRowBytes);
          }
          for (std::size_t j = jb; j < je; ++j) {
            if (const char* r = ahead(1, j - jb))
              for (int c = 0; c < kRowBytes; c += 64) _mm_prefetch(r + c, _MM_HINT_T1);
            acc = add_row(acc, v + j * kKeyBytes + h * kRowBytes);
          }
        }
      }
    } else {
      const std::size_t block = order > 0 ? static_cast<std::size_t>(order) : k1 - k0;
      for (std::size_t jb = k0; jb < k1; jb += block)
        for (int h = 0; h < kHeads; ++h) {
          const std::size_t je = jb + block < k1 ? jb + block : k1;
          for (std::size_t j = jb; j < je; ++j) acc = add_row(acc, k + j * kKeyBytes + h * kRowBytes);
          for (std::size_t j = jb; j < je; ++j) acc = add_row(acc, v + j * kKeyBytes + h * kRowBytes);
        }
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc);
    for (float x : lanes) total += x;
  }
  sink += total;
  return 2.0 * static_cast<double>(keys) * kKeyBytes / (now() - t0) / 1e9;
}

}  // namespace

int main() {
  const std::size_t bytes = std::size_t{1} << 29;  // 512 MiB each for K and V: far past the caches
  char* k = static_cast<char*>(std::aligned_alloc(4096, bytes));
  char* v = static_cast<char*>(std::aligned_alloc(4096, bytes));
  if (k == nullptr || v == nullptr) return 1;
  std::memset(k, 0, bytes);
  std::memset(v, 0, bytes);
  const std::size_t keys = bytes / kKeyBytes;
  const int orders[] = {0, 1, 2, 4, 16, 64, 256, -1, -2, -4, kAheadPass, kAheadBlock};
  float sink = 0.f;
  std::printf("threads %d; K and V of %zu keys x %d heads x %d bytes; GB/s, best of 3\n", omp_get_max_threads(), keys,
              kHeads, kRowBytes);
  for (int order : orders) {
    double best = 0.0;
    for (int rep = 0; rep < 3; ++rep) {
      const double g = read(k, v, keys, order, sink);
      best = g > best ? g : best;
    }
    if (order == 0) std::printf("  ascending      %6.1f\n", best);
    else if (order > 0) std::printf("  blocks:%-4d    %6.1f\n", order, best);
    else if (order == -1) std::printf("  per-head       %6.1f\n", best);
    else if (order == kAheadPass) std::printf("  blocks:64, one pass ahead      %6.1f\n", best);
    else if (order == kAheadBlock) std::printf("  blocks:64, next block's share  %6.1f\n", best);
    else std::printf("  blocks:64, %d heads per pass %6.1f\n", -order, best);
  }
  std::free(k);
  std::free(v);
  return sink == 1.f ? 2 : 0;  // the sums are used
}
