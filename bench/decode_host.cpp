// Host cost of one forward_kvcache call on a CUDA device, split by what the call does, for issue 14's decode
// cells: the events that time a call also time the host work before its first kernel starts.
//
//   decode_host [iterations]
//
// Shape: one sequence, one new query token, GQA 32/8, head dim 128, bf16, 256 keys in the cache (the GPU work is
// a few microseconds, so back-to-back calls are bound by the host). Each figure is the median over 7 loops of
// `iterations` calls, in microseconds per call; the loops without waiting end with one synchronisation.
// Build: target flashtile_decode_host (bench/CMakeLists.txt, with FLASHTILE_WITH_CUDA and the apps).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "flashtile/kvcache.h"

using flashtile::DType;
using flashtile::Device;

namespace {

double median_us(int iterations, const std::function<void()>& fn, bool sync_at_end) {
  std::vector<double> t;
  for (int r = 0; r < 7; ++r) {
    const auto a = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) fn();
    if (sync_at_end) cudaDeviceSynchronize();
    const auto b = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double, std::micro>(b - a).count() / iterations);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void* device_alloc(std::size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    std::fprintf(stderr, "cudaMalloc failed\n");
    std::exit(1);
  }
  cudaMemset(p, 0, bytes);
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 2000;
  constexpr std::int64_t B = 1, Sq = 1, Hq = 32, Hkv = 8, D = 128, cap = 256;
  const auto cu = Device::cuda;
  void* q = device_alloc(B * Sq * Hq * D * 2);
  void* kc = device_alloc(B * cap * Hkv * D * 2);
  void* vc = device_alloc(B * cap * Hkv * D * 2);
  void* out = device_alloc(B * Sq * Hq * D * 2);
  void* lse = device_alloc(B * Hq * Sq * 4);
  void* seqlens = device_alloc(B * 4);
  const int len = static_cast<int>(cap - Sq);
  cudaMemcpy(seqlens, &len, 4, cudaMemcpyHostToDevice);
  void* kn = device_alloc(B * Sq * Hkv * D * 2);
  void* vn = device_alloc(B * Sq * Hkv * D * 2);
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);

  const auto qv = flashtile::make_view(q, DType::bfloat16, {B, Sq, Hq, D}, cu);
  const auto ov = flashtile::make_view(out, DType::bfloat16, {B, Sq, Hq, D}, cu);
  const auto lv = flashtile::make_view(lse, DType::float32, {B, Hq, Sq}, cu);
  flashtile::KVCache c;
  c.k_cache = flashtile::make_view(kc, DType::bfloat16, {B, cap, Hkv, D}, cu);
  c.v_cache = flashtile::make_view(vc, DType::bfloat16, {B, cap, Hkv, D}, cu);
  c.cache_seqlens = flashtile::make_view(seqlens, DType::int32, {B}, cu);
  c.k_new = flashtile::make_view(kn, DType::bfloat16, {B, Sq, Hkv, D}, cu);
  c.v_new = flashtile::make_view(vn, DType::bfloat16, {B, Sq, Hkv, D}, cu);
  flashtile::Options o;
  o.causal = true;
  o.cuda_stream = stream;

  auto call = [&](const flashtile::KVCache& cc, const flashtile::Options& oo) {
    return [&, cc, oo] { (void)flashtile::forward_kvcache(qv, cc, ov, lv, oo); };
  };
  flashtile::KVCache async = c;
  async.async_index_check = true;
  flashtile::Options checked = o;
  checked.device_pointers_checked = true;
  flashtile::Options named = checked;
  named.backend = "cuda-sm80";

  // Warm-up: the pool's workspace, the pinned verdict, the kernels' attributes.
  for (int i = 0; i < 50; ++i) call(c, o)();
  cudaDeviceSynchronize();
  const auto r = flashtile::forward_kvcache(qv, c, ov, lv, o);
  std::printf("ran: %s / %s splits=%d\n", r.ran.backend.c_str(), r.ran.kernel.c_str(), r.ran.splits);

  struct Row {
    const char* what;
    double us;
  };
  std::vector<Row> rows;
  cudaPointerAttributes pa{};
  rows.push_back({"cudaPointerGetAttributes, one pointer", median_us(n, [&] { (void)cudaPointerGetAttributes(&pa, kc); }, false)});
  rows.push_back({"cudaStreamIsCapturing", median_us(n, [&] {
                    cudaStreamCaptureStatus s;
                    (void)cudaStreamIsCapturing(stream, &s);
                  }, false)});
  rows.push_back({"cudaMemsetAsync 16 B (a launch's floor)", median_us(n, [&] { (void)cudaMemsetAsync(lse, 0, 16, stream); }, true)});
  rows.push_back({"workspace_bytes: validate + choose", median_us(n, [&] {
                    (void)flashtile::forward_kvcache_workspace_bytes(qv, async, ov, lv, o);
                  }, false)});
  rows.push_back({"workspace_bytes, device_pointers_checked", median_us(n, [&] {
                    (void)flashtile::forward_kvcache_workspace_bytes(qv, async, ov, lv, checked);
                  }, false)});
  rows.push_back({"explain: validate + choose + report", median_us(n, [&] {
                    (void)flashtile::explain_forward_kvcache(qv, async, ov, lv, o);
                  }, false)});
  rows.push_back({"call, async_index_check (no wait)", median_us(n, call(async, o), true)});
  rows.push_back({"call, async + device_pointers_checked", median_us(n, call(async, checked), true)});
  rows.push_back({"call, async + checked + backend named", median_us(n, call(async, named), true)});
  rows.push_back({"call, eager (waits for the verdict)", median_us(n, call(c, o), true)});
  rows.push_back({"call, eager + device_pointers_checked", median_us(n, call(c, checked), true)});
  for (const Row& x : rows) std::printf("%-44s %8.2f us\n", x.what, x.us);
  return 0;
}
