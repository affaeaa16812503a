// The CUDA runtime's own host cost per call of what a FlashTile decode call issues (issue 14: the per-call host time
// of bench/decode_host.cpp, against its floor): a one-CTA launch (the index check), a PDL launch of a 68 KB kernel
// (the decode), the pair, plus cudaFuncSetAttribute and a pool allocation (the workspace). Microseconds per call,
// median of 7 loops of 2000 calls issued without waiting. Standalone (no FlashTile code):
//   nvcc -O2 -std=c++17 -gencode=arch=compute_90,code=sm_90 bench/launch_floor.cu -o launch_floor
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>
__global__ void k1(int* p) {
  if (p && threadIdx.x == 1000) *p = 1;
}
__global__ void k2(int* p) {
  extern __shared__ int s[];
  if (p && threadIdx.x == 1000) *p = s[0];
}
double us(int n, const std::function<void()>& f) {
  std::vector<double> t;
  for (int r = 0; r < 7; ++r) {
    cudaDeviceSynchronize();
    auto a = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) f();
    auto b = std::chrono::steady_clock::now();
    cudaDeviceSynchronize();
    t.push_back(std::chrono::duration<double, std::micro>(b - a).count() / n);
  }
  std::sort(t.begin(), t.end());
  return t[3];
}
int main() {
  cudaStream_t s;
  cudaStreamCreate(&s);
  cudaMemPool_t pool;
  cudaDeviceGetDefaultMemPool(&pool, 0);
  cudaFuncSetAttribute(k2, cudaFuncAttributeMaxDynamicSharedMemorySize, 70000);
  const int n = 2000;
  printf("cudaFuncSetAttribute (same value)   %.2f us\n",
         us(n, [] { cudaFuncSetAttribute(k2, cudaFuncAttributeMaxDynamicSharedMemorySize, 70000); }));
  printf("<<<1,256>>> launch                   %.2f us\n", us(n, [&] { k1<<<1, 256, 0, s>>>(nullptr); }));
  printf("<<<128x8,128,68KB>>> launch          %.2f us\n",
         us(n, [&] { k2<<<dim3(16, 8, 1), 128, 70000, s>>>(nullptr); }));
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(16, 8, 1);
  cfg.blockDim = 128;
  cfg.dynamicSmemBytes = 70000;
  cfg.stream = s;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  int* np = nullptr;
  printf("cudaLaunchKernelEx PDL               %.2f us\n", us(n, [&] { cudaLaunchKernelEx(&cfg, k2, np); }));
  printf("check + PDL decode (pair)            %.2f us\n", us(n, [&] {
           k1<<<1, 256, 0, s>>>(nullptr);
           cudaLaunchKernelEx(&cfg, k2, np);
         }));
  printf("pair + SetAttribute                  %.2f us\n", us(n, [&] {
           k1<<<1, 256, 0, s>>>(nullptr);
           cudaFuncSetAttribute(k2, cudaFuncAttributeMaxDynamicSharedMemorySize, 70000);
           cudaLaunchKernelEx(&cfg, k2, np);
         }));
  printf("cudaMallocFromPoolAsync + FreeAsync  %.2f us\n", us(n, [&] {
           void* p;
           cudaMallocFromPoolAsync(&p, 300000, pool, s);
           cudaFreeAsync(p, s);
         }));
  printf("pair + pool alloc/free + SetAttr     %.2f us\n", us(n, [&] {
           void* p;
           cudaMallocFromPoolAsync(&p, 300000, pool, s);
           k1<<<1, 256, 0, s>>>(nullptr);
           cudaFuncSetAttribute(k2, cudaFuncAttributeMaxDynamicSharedMemorySize, 70000);
           cudaLaunchKernelEx(&cfg, k2, np);
           cudaFreeAsync(p, s);
         }));
  cudaStreamCaptureStatus c;
  printf("cudaStreamIsCapturing                %.2f us\n", us(n, [&] { cudaStreamIsCapturing(s, &c); }));
  int d;
  printf("cudaGetDevice                        %.2f us\n", us(n, [&] { cudaGetDevice(&d); }));
  printf("last error: %s\n", cudaGetErrorString(cudaGetLastError()));
}
