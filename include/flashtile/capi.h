/* A C ABI over flashtile::forward / flashtile::backward / flashtile::forward_kvcache (library libflashtile_capi.so) for callers that
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

#include <stddef.h>
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

/* The variants (window, softcap, ALiBi, sinks, varlen, seqused_k), with the semantics of the C++ Options fields of
 * the same names (docs/semantics.md). Passed by pointer to ft_forward_ex / ft_backward_ex; NULL = none of them.
 *
 * ABI: set struct_size = sizeof(ft_variants) as your header declares it (FT_VARIANTS_INIT does). The library reads
 * the fields that struct_size covers and gives any later field (a newer header's) its default, so callers built
 * against this header keep working when fields are appended. It refuses (FT_ERR_INVALID_ARGUMENT) a struct_size
 * below this first version's, and a larger one whose bytes past the fields it knows are not all zero: a newer
 * caller asking for something this library cannot do.
 *
 * Tensors: NULL = absent. alibi_slopes, sinks and dsinks are float32, cu_seqlens_q / _k and seqused_k int32, all in
 * the memory that `device` names. With cu_seqlens_q and cu_seqlens_k (a packed batch of B sequences) q, k, v, out,
 * dout, dq, dk and dv have rank 3 ([total_q, Hq, D], [total_k, Hkv, D], ...) and lse rank 2 ([Hq, total_q]). */
typedef struct ft_variants {
  uint64_t struct_size;
  int64_t window_left, window_right; /* sliding window, -1 = unbounded; causal = 1 means window_right = 0 */
  double softcap;                    /* s = softcap * tanh(s / softcap); 0 = off; finite and >= 0 */
  const ft_tensor* alibi_slopes;     /* [Hq] or [B, Hq]: s -= slope * |i + Sk - Sq - j| */
  const ft_tensor* sinks;            /* [Hq]: one logit per query head in the softmax's denominator */
  const ft_tensor* dsinks;           /* [Hq]: backward output dL/dsinks, required there with sinks; forward ignores it */
  const ft_tensor* cu_seqlens_q;     /* [B + 1]: sequence b owns packed rows cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1 */
  const ft_tensor* cu_seqlens_k;     /* [B + 1] */
  const ft_tensor* seqused_k;        /* [B]: keys of sequence b that are used (varlen or batched) */
  int64_t max_seqlen_q, max_seqlen_k; /* varlen: no sequence longer than these */
  int64_t sm_margin;                 /* CUDA: SMs left to other kernels (Options::sm_margin); 0 = none. Version 2 */
} ft_variants;

#define FT_VARIANTS_INIT {sizeof(ft_variants), -1, -1, 0.0, NULL, NULL, NULL, NULL, NULL, NULL, 0, 0, 0}

/* ft_forward / ft_backward with the variants; variants NULL gives exactly ft_forward / ft_backward. */
FT_CAPI_EXPORT int ft_forward_ex(const ft_tensor* q, const ft_tensor* k, const ft_tensor* v, const ft_tensor* out,
                                 const ft_tensor* lse, int dtype, int device, double scale, int causal,
                                 const char* backend, int strict, const ft_variants* variants, char* msg, int msg_len);

FT_CAPI_EXPORT int ft_backward_ex(const ft_tensor* q, const ft_tensor* k, const ft_tensor* v, const ft_tensor* out,
                                  const ft_tensor* dout, const ft_tensor* lse, const ft_tensor* dq, const ft_tensor* dk,
                                  const ft_tensor* dv, int dtype, int device, double scale, int causal,
                                  int deterministic, const char* backend, int strict, const ft_variants* variants,
                                  char* msg, int msg_len);

/* flashtile::forward_kvcache (include/flashtile/kvcache.h): q [B, Sq, Hq, D] against a KV cache, contiguous
 * (k_cache [B_cache, capacity, Hkv, D]) or paged (block_table given: [num_pages, page_size, Hkv, D]), after appending
 * k_new / v_new [B, Snew, Hkv, D] at cache_seqlens [B] (int32) in place. NULL = absent for k_new, v_new,
 * cache_seqlens, block_table (int32 [B, max_pages]), cache_batch_idx (int32 [B]) and lse. num_splits: 0 = automatic.
 * async_index_check: KVCache::async_index_check (CUDA: 1 = do not wait for the device-side index check).
 * variants: window, softcap, alibi_slopes, sinks and max_seqlen_k apply (the varlen fields are refused). */
FT_CAPI_EXPORT int ft_forward_kvcache(const ft_tensor* q, const ft_tensor* k_cache, const ft_tensor* v_cache,
                                      const ft_tensor* k_new, const ft_tensor* v_new, const ft_tensor* cache_seqlens,
                                      const ft_tensor* block_table, const ft_tensor* cache_batch_idx,
                                      const ft_tensor* out, const ft_tensor* lse, int num_splits,
                                      int async_index_check, int dtype, int device,
                                      double scale, int causal, const char* backend, int strict,
                                      const ft_variants* variants, char* msg, int msg_len);

#ifdef __cplusplus
}
#endif

#endif /* FLASHTILE_CAPI_H */
