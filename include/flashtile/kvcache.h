// Attention against a KV cache, the call serving code makes at every decode step (FlashAttention's
// flash_attn_with_kvcache): a few new query tokens per sequence against that sequence's cached keys, after
// appending the new keys and values to the cache in place.
//
// Layouts (any strides on the first dims, last dim contiguous):
//   q          [B, Sq, Hq, D]
//   k_cache    [B_cache, capacity, Hkv, D]   v_cache [B_cache, capacity, Hkv, Dv]        contiguous cache
//              [num_pages, page_size, Hkv, D] v_cache [num_pages, page_size, Hkv, Dv]    paged cache
//   block_table [B, max_pages] int32: page block_table[b][j / page_size] holds key j of sequence b (paged)
//   cache_batch_idx [B] int32: the cache slot of sequence b (contiguous only; default b)
//   cache_seqlens [B] int32: keys each sequence holds before the append (default: the whole cache)
//   k_new [B, Snew, Hkv, D], v_new [B, Snew, Hkv, Dv]: appended at cache_seqlens[b], then attended
//   out [B, Sq, Hq, Dv]   lse [B, Hq, Sq] float32 (optional)
//
// Semantics (one definition, ../docs/semantics.md): sequence b attends to keys [0, L_b) of its cache with
// L_b = cache_seqlens[b] + Snew, after the append; every option of forward() applies with Sk = L_b, so causal is
// bottom-right over the new tokens (query i sees keys j <= i + L_b - Sq). Page sizes: any multiple of 16.
// Every argument is checked before anything is written: a refused call leaves the cache unchanged.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashtile/dispatch.h"
#include "flashtile/options.h"
#include "flashtile/tensor.h"

namespace flashtile {

struct KVCache {
  TensorView k_cache, v_cache;  // written in place when k_new / v_new are given
  TensorView cache_seqlens;     // [B] int32; absent: every sequence fills its cache (capacity or max_pages pages)
  TensorView block_table;       // [B, max_pages] int32; present: the cache is paged
  TensorView cache_batch_idx;   // [B] int32, contiguous caches only
  TensorView k_new, v_new;      // [B, Snew, Hkv, D] / [B, Snew, Hkv, Dv], both or neither (needs cache_seqlens)
  // Split-KV: the keys of each sequence are cut into this many parts computed in parallel and merged (as
  // merge_attention_states does); 0 lets the backend choose from its core / SM count, B·Hkv and the lengths.
  int num_splits = 0;
  // CUDA: the index values (cache_seqlens, block_table, cache_batch_idx) live on the device, so a bad one is found
  // by a check kernel. false: the call waits for its verdict (a 16-byte copy and a synchronisation of the stream)
  // and throws the typed error. true: no synchronisation, for eager decode loops on the hot path; a bad index
  // then leaves the cache unchanged and NaN in out and lse, as it always does under CUDA-graph capture. The CPU
  // reads the values on the host and ignores this.
  bool async_index_check = false;
};

// out = attention of q over the (appended) cache; lse = log Σ exp(scores) per query row when given.
// Options: softmax_scale, causal, window_size, softcap, alibi_slopes, sinks, backend, strict, num_threads,
// cuda_stream; max_seqlen_k, when > 0, bounds every L_b (lets a GPU backend size its splits without reading
// cache_seqlens). Varlen, seqused_k, deterministic and the backward options do not apply and are refused.
DispatchReport forward_kvcache(const TensorView& q, const KVCache& cache, const TensorView& out,
                               const TensorView& lse = {}, const Options& options = {});

// Bytes of scratch memory the call needs on the backend these arguments select (0 on the CPU; on CUDA the index
// check's verdict and, with splits, the partial results): pass that much as Options::workspace so that the call
// allocates nothing, e.g. in a captured CUDA graph. Validates like forward_kvcache (bad arguments throw).
std::size_t forward_kvcache_workspace_bytes(const TensorView& q, const KVCache& cache, const TensorView& out,
                                            const TensorView& lse = {}, const Options& options = {});

// What forward_kvcache would run (backend, splits and why), validating like the real call; writes nothing.
DispatchReport explain_forward_kvcache(const TensorView& q, const KVCache& cache, const TensorView& out,
                                       const TensorView& lse = {}, const Options& options = {});

}  // namespace flashtile
