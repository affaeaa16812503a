// Options shared by forward and backward.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "flashtile/tensor.h"

namespace flashtile {

struct Options {
  // Multiplies q·kᵀ before the softmax. Default 1/sqrt(D).
  std::optional<float> softmax_scale;
  // Causal mask aligned to the bottom-right corner: query i sees keys j <= i + Sk - Sq
  // (FlashAttention >= 2.1). With Sq > Sk the first Sq - Sk rows see no key: O = 0, LSE = -inf.
  bool causal = false;
  // Sliding window (left, right): query i sees keys j with i + Sk - Sq - left <= j <= i + Sk - Sq + right;
  // -1 = unbounded on that side. causal = true means right = 0 (with any left).
  std::array<std::int64_t, 2> window_size{-1, -1};
  // Score capping (Gemma 2, Grok): s = softcap · tanh(s / softcap) after the scale; 0 = off.
  float softcap = 0.0f;
  // Optional tensors (a default TensorView, data null and rank 0, means absent), on the operands' device:
  //   alibi_slopes [Hq] or [B, Hq] float32: s -= slope · |i + Sk - Sq - j| (after softcap);
  //   sinks [Hq] float32: one logit per query head in the softmax's denominator that adds no value;
  //   dsinks [Hq] float32: backward output, dL/dsinks (required when sinks is given);
  //   cu_seqlens_q, cu_seqlens_k [B + 1] int32: variable-length (packed) batch; q, out [total_q, Hq, D],
  //   k, v [total_k, Hkv, D], lse [Hq, total_q]; max_seqlen_q / max_seqlen_k bound every sequence's length;
  //   seqused_k [B] int32: keys of sequence b that are used (the KV-cache form), with or without cu_seqlens_k.
  TensorView alibi_slopes, sinks, dsinks;
  TensorView cu_seqlens_q, cu_seqlens_k, seqused_k;
  std::int64_t max_seqlen_q = 0, max_seqlen_k = 0;
  // "auto" or a backend name: "cpu-flash", "cpu-reference", "cuda-sm80", ...
  std::string backend = "auto";
  // Strict: a requested backend that cannot run is an error that lists its reasons; with "auto",
  // anything other than the first-choice backend for the tensors' device is an error.
  bool strict = false;
  // Backward only: bitwise identical results run to run (the CPU path always is for a fixed thread
  // count; GPU paths pay for it with a serialised dQ reduction).
  bool deterministic = false;
  // CPU worker threads; 0 = all hardware threads (or OMP_NUM_THREADS when set).
  int num_threads = 0;
  // CUDA backends: the stream (a cudaStream_t) to enqueue on; null = the default stream. The call is
  // asynchronous with respect to the host on that stream, as a CUDA library call is.
  void* cuda_stream = nullptr;
  // CUDA backends: streaming multiprocessors the call leaves to other kernels running beside it, such as the
  // transfers of context-parallel attention (as FlashAttention-3's sm_margin). It shrinks the grids the library
  // sizes to the SM count: cuda-sm90's persistent forward (one CTA per SM) and forward_kvcache's split-KV plan. A
  // kernel whose grid has one CTA per tile is spread by the hardware over whichever SMs are free and needs no margin;
  // the CPU backends ignore it. >= 0 and below the device's SM count (a CUDA backend refuses more).
  int sm_margin = 0;
  // Backward and forward_kvcache: scratch memory for the backend (device memory of the tensors' device for CUDA),
  // at least backward_workspace_bytes() (forward_kvcache_workspace_bytes()) large and 256-byte aligned. Given, the call allocates nothing, so it can be
  // captured in a CUDA graph with memory the caller's allocator owns (the Python package passes a torch
  // tensor). Null: CUDA backends take it from a per-device pool that keeps its memory between calls.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  // Backward and forward_kvcache, when `workspace` is null: called once with the bytes the chosen backend needs, returns that
  // much memory (same device and alignment rules as `workspace`), valid until the call's work on the stream is
  // done. Lets a framework hand out memory from its own allocator in the same call, without first asking
  // backward_workspace_bytes() (which validates and dispatches a second time).
  void* (*workspace_alloc)(std::size_t bytes, void* context) = nullptr;
  void* workspace_alloc_context = nullptr;
  // The caller guarantees that every tensor's data pointer is memory of the device its view declares (as a
  // framework's tensors are). CUDA backends then skip their per-operand cudaPointerGetAttributes query.
  bool device_pointers_checked = false;
};

}  // namespace flashtile
