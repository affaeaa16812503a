// FT_HOST_DEVICE marks the small rule functions (mask policy, score hook, sequence info) that the CPU kernels,
// the CUDA kernels and the dispatch all call, so that each rule is written once.
#pragma once

#if defined(__CUDACC__)
#define FT_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FT_HOST_DEVICE inline
#endif
