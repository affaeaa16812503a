// The small kernels around the backward mainloop:
//  - preprocess: dsum = rowsum(dO * O) and lse_log2 = lse * log2(e) per query row (+inf for rows that see no
//    key and for the padding rows of a sequence's last block, so that P = ex2(s * scale_log2 - lse_log2) is 0
//    there); with sinks also each row's term exp(sink - lse) * dsum of dsink;
//  - sink_grad (with sinks): dsinks[h] = -sum of the terms of head h over every sequence and row, in a fixed
//    order (one CTA per head, fixed-shape tree), so the result is bitwise reproducible in every mode;
//  - dq_convert: dQ = softmax_scale * dq_accum, fp32 -> 16-bit, into dq's strides.
// Grids cover (rows of max_seqlen_q, head, sequence); the workspace slots follow common/params.h ws_row0().
// dq_convert needs the main kernel's traits (the dq_accum order follows its dQ partition), so this header is
// included after bwd_kernel.h.
#pragma once

#include "common/cute_utils.h"
#include "common/params.h"
#include "sm80/bwd_kernel.h"

namespace flashtile::cuda::sm80 {

constexpr int kAuxThreads = 256;

// kLanes threads per (b, h, row), one 8-element chunk of the head dim each (kLanes: the bucket's chunk count
// rounded up to a power of two), so a 256-thread block covers 256 / kLanes rows with 16-byte loads. The same
// threads zero the row's dq_accum slots (that replaced a separate memset: one launch and one pass less).
template <class Element, int kHeadDim>
__global__ void __launch_bounds__(kAuxThreads) bwd_preprocess_kernel(const __grid_constant__ BwdParams p) {
  constexpr int kChunks = kHeadDim / 8;
  constexpr int kLanes = kChunks <= 8 ? 8 : kChunks <= 16 ? 16 : 32;
  static_assert(kChunks <= kLanes && kHeadDim % 4 == 0);
  const detail::AttnParams& a = p.a;
  const int h = blockIdx.y, b = blockIdx.z;
  const int i = static_cast<int>((static_cast<long long>(blockIdx.x) * kAuxThreads + threadIdx.x) / kLanes);
  const int lane = threadIdx.x % kLanes;
  const detail::SeqInfo seq = detail::sequence(a, b);
  const int sq = static_cast<int>(seq.seqlen_q);
  const int padded = (sq + p.block_m - 1) / p.block_m * p.block_m;
  const bool valid = i < padded;  // no early return: the shuffles below need every lane of the warp
  float acc = 0.f;
  float lse = -INFINITY;
  if (valid && i < sq) {
    const std::int64_t r = seq.q_row0 + i;
    const int c = lane * 8;
    if (c < a.hdim_v) {
      const Element* o = static_cast<const Element*>(a.out) + b * a.out_stride.batch + h * a.out_stride.head +
                         r * a.out_stride.row + c;
      const Element* d = static_cast<const Element*>(a.dout) + b * a.dout_stride.batch +
                         h * a.dout_stride.head + r * a.dout_stride.row + c;
      const uint4 ov = *reinterpret_cast<const uint4*>(o);
      const uint4 dv = *reinterpret_cast<const uint4*>(d);
      const Element* oe = reinterpret_cast<const Element*>(&ov);
      const Element* de = reinterpret_cast<const Element*>(&dv);
      CUTE_UNROLL
      for (int j = 0; j < 8; ++j) acc += static_cast<float>(oe[j]) * static_cast<float>(de[j]);
    }
    lse = a.lse[b * a.lse_stride.batch + h * a.lse_stride.head + r * a.lse_stride.row];
  }
  CUTE_UNROLL
  for (int o = kLanes / 2; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (!valid) return;
  const std::int64_t slot = ws_row0(p, b, h) + i;
  if (lane == 0) {
    p.dsum[slot] = acc;
    p.lse_log2[slot] = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
    // A row with lse = -inf (no key, no sink) or a padding row contributes nothing to dsink.
    if (p.sink_terms != nullptr)
      p.sink_terms[slot] = lse == -INFINITY ? 0.f : expf(detail::sink_logit(a, h) - lse) * acc;
  }
  float4* dq = reinterpret_cast<float4*>(p.dq_accum + slot * kHeadDim);
  for (int c = lane; c < kHeadDim / 4; c += kLanes) dq[c] = make_float4(0.f, 0.f, 0.f, 0.f);
}

// dsinks[h] = -sum over sequences b and rows i of exp(sink_h - lse_bi) * D_bi (the preprocess's terms). One CTA
// per query head; thread t sums the rows t, t + kThreads, ... of each sequence in order, then a fixed tree.
template <int kThreads>
__global__ void __launch_bounds__(kThreads) sink_grad_kernel(const __grid_constant__ BwdParams p) {
  __shared__ float part[kThreads];
  const int h = blockIdx.x, t = threadIdx.x;
  float sum = 0.f;
  for (std::int64_t b = 0; b < p.a.batch; ++b) {
    const std::int64_t sq = detail::sequence(p.a, b).seqlen_q;
    const float* terms = p.sink_terms + ws_row0(p, b, h);
    for (std::int64_t i = t; i < sq; i += kThreads) sum += terms[i];
  }
  part[t] = sum;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (t < w) part[t] += part[t + w];
    __syncthreads();
  }
  if (t == 0) p.a.dsinks[h] = -part[0];
}

// One CTA per (query block, head, sequence), with the main kernel's thread count: each thread reads back its
// own dQ accumulator elements (the thread-major order of dq_accum_offset(), 16-byte coalesced loads), scales
// them and writes the 16-bit tile through shared memory with 16-byte stores.
template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads) dq_convert_kernel(const __grid_constant__ BwdParams p) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM, kD = Traits::kHeadDim, kThreads = Traits::kThreads;
  extern __shared__ __align__(128) char smem_raw[];
  const detail::AttnParams& a = p.a;
  const int tidx = threadIdx.x, mb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int m0 = mb * kBlockM;
  const detail::SeqInfo seq = detail::sequence(a, b);
  const int sq = static_cast<int>(seq.seqlen_q);
  if (m0 >= sq) return;
  typename Traits::TiledMmadQ mma_dq;
  Tensor acc = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kD>>{});
  const float* src = p.dq_accum + (ws_row0(p, b, h) + m0) * kD;
  const float scale = a.softmax_scale;
  CUTE_UNROLL
  for (int i = 0; i < size(acc); i += 4) {
    const float4 x = *reinterpret_cast<const float4*>(src + dq_accum_offset<kThreads>(i, tidx));
    acc(i) = x.x * scale;
    acc(i + 1) = x.y * scale;
    acc(i + 2) = x.z * scale;
    acc(i + 3) = x.w * scale;
  }
  Element* dq_bh = static_cast<Element*>(a.dq) + b * a.dq_stride.batch + seq.q_row0 * a.dq_stride.row +
                   h * a.dq_stride.head;
  Tensor mdQ = make_tensor(make_gmem_ptr(dq_bh), make_shape(sq, Int<kD>{}), make_stride(a.dq_stride.row, _1{}));
  Tensor gdQ = local_tile(mdQ, Shape<Int<kBlockM>, Int<kD>>{}, make_coord(mb, 0));
  store_acc_tile<Element, kThreads, typename Traits::SmemLayoutQ, typename Traits::GmemCopyOut>(
      acc, mma_dq, reinterpret_cast<Element*>(smem_raw), gdQ, sq - m0, static_cast<int>(a.hdim), tidx);
}

}  // namespace flashtile::cuda::sm80
