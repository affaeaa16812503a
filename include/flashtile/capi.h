/* A C ABI over flashtile::forward / flashtile::backward (library libflashtile_capi.so) for callers that
 * cannot use C++: ctypes (bench/gpu_bench.py, tests/gpu/test_torch_parity.py load it next to PyTorch, so
 * both run in one process), or C.
 *
 * Every function returns FT_OK (0) on success, otherwise 1 + flashtile::ErrorCode (FT_ERR_*), or FT_ERR_OTHER
 * for any other exception; `msg` (msg_len bytes, may be NULL) receives the dispatch report or the error text.
 * Integer arguments are checked before use: dtype one of FT_DTYPE_*; device -1 (host memory) or a CUDA
 * device index >= 0; causal, deterministic and strict 0 or 1; every tensor pointer non-NULL with rank 0..4.
 * An argument out of range returns FT_ERR_INVALID_ARGUMENT with a message naming it and its value, and
 * writes nothing else. */
#ifndef FLASHTILE_CAPI_H
#define FLASHTILE_CAPI_H

#include <stdint.h>

#if defined(__GNUC__)
#define FT_CAPI_EXPORT __attribute__((visibility("default"))) /* the library hides everything else */
#else
#define FT_CAPI_EXPORT
#endif

#ifdef __cplusplus
extern "C" {
#endif

enum { FT_DTYPE_FLOAT32 = 0, FT_DTYPE_FLOAT16 = 1, FT_DTYPE_BFLOAT16 = 2 };
enum { FT_DEVICE_HOST = -1 };
enum {
  FT_OK = 0,
  FT_ERR_INVALID_ARGUMENT = 1,
  FT_ERR_DTYPE = 2,
  FT_ERR_DEVICE = 3,
  FT_ERR_UNSUPPORTED = 4,
  FT_ERR_BACKEND = 5,
  FT_ERR_OTHER = 99
};

/* A tensor: the first `rank` entries of shape and stride (in elements) are used. */
typedef struct ft_tensor {
  void* data;
  int64_t shape[4];
  int64_t stride[4];
  int rank;
} ft_tensor;

/* q, k, v, out in `dtype`; lse float32. scale: NaN for the default 1/sqrt(D). backend: NULL for "auto". */
FT_CAPI_EXPORT int ft_forward(const ft_tensor* q, const ft_tensor* k, const ft_tensor* v, const ft_tensor* out, const ft_tensor* lse,
                              int dtype, int device, double scale, int causal, const char* backend, int strict,
                              char* msg, int msg_len);

FT_CAPI_EXPORT int ft_backward(const ft_tensor* q, const ft_tensor* k, const ft_tensor* v, const ft_tensor* out,
                               const ft_tensor* dout, const ft_tensor* lse, const ft_tensor* dq, const ft_tensor* dk,
                               const ft_tensor* dv, int dtype, int device, double scale, int causal,
                               int deterministic, const char* backend, int strict, char* msg, int msg_len);

#ifdef __cplusplus
}
#endif

#endif /* FLASHTILE_CAPI_H */
