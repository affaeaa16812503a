// The two small kernels around the backward mainloop:
//  - preprocess: dsum = rowsum(dO * O) and lse_log2 = lse * log2(e) per query row (+inf for rows that see no
//    key and for the padding rows up to seqlen_q_pad, so that P = ex2(s * scale_log2 - lse_log2) is 0 there);
//  - dq_convert: dQ = softmax_scale * dq_accum, fp32 -> 16-bit, into dq's strides.
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
  const long long row = (static_cast<long long>(blockIdx.x) * kAuxThreads + threadIdx.x) / kLanes;
  const int lane = threadIdx.x % kLanes;
  const long long total = static_cast<long long>(p.batch) * p.heads_q * p.seqlen_q_pad;
  const bool valid = row < total;  // no early return: the shuffles below need every lane of the warp
  const int i = valid ? static_cast<int>(row % p.seqlen_q_pad) : 0;
  const int bh = valid ? static_cast<int>(row / p.seqlen_q_pad) : 0;
  const int b = bh / p.heads_q, h = bh % p.heads_q;
  float acc = 0.f;
  float lse2 = INFINITY;
  if (valid && i < p.seqlen_q) {
    const int c = lane * 8;
    if (c < p.hdim_v) {
      const Element* o = static_cast<const Element*>(p.out) + b * p.out_stride.batch + h * p.out_stride.head +
                         i * p.out_stride.row + c;
      const Element* d = static_cast<const Element*>(p.dout) + b * p.dout_stride.batch +
                         h * p.dout_stride.head + i * p.dout_stride.row + c;
      const uint4 ov = *reinterpret_cast<const uint4*>(o);
      const uint4 dv = *reinterpret_cast<const uint4*>(d);
      const Element* oe = reinterpret_cast<const Element*>(&ov);
      const Element* de = reinterpret_cast<const Element*>(&dv);
      CUTE_UNROLL
      for (int j = 0; j < 8; ++j) acc += static_cast<float>(oe[j]) * static_cast<float>(de[j]);
    }
    const float lse = p.lse[b * p.lse_batch + h * p.lse_head + i * p.lse_row];
    lse2 = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
  }
  CUTE_UNROLL
  for (int o = kLanes / 2; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (!valid) return;
  if (lane == 0) {
    p.dsum[row] = acc;
    p.lse_log2[row] = lse2;
  }
  float4* dq = reinterpret_cast<float4*>(p.dq_accum + row * kHeadDim);
  for (int c = lane; c < kHeadDim / 4; c += kLanes) dq[c] = make_float4(0.f, 0.f, 0.f, 0.f);
}

// One CTA per (query block, head, batch), with the main kernel's thread count: each thread reads back its own
// dQ accumulator elements (the thread-major order of dq_accum_offset(), 16-byte coalesced loads), scales them
// and writes the 16-bit tile through shared memory with 16-byte stores.
template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads) dq_convert_kernel(const __grid_constant__ BwdParams p) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM, kD = Traits::kHeadDim, kThreads = Traits::kThreads;
  extern __shared__ __align__(128) char smem_raw[];
  const int tidx = threadIdx.x, mb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int m0 = mb * kBlockM;
  typename Traits::TiledMmadQ mma_dq;
  Tensor acc = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kD>>{});
  const float* src = p.dq_accum + ((static_cast<long long>(b) * p.heads_q + h) * p.seqlen_q_pad + m0) * kD;
  CUTE_UNROLL
  for (int i = 0; i < size(acc); i += 4) {
    const float4 x = *reinterpret_cast<const float4*>(src + dq_accum_offset<kThreads>(i, tidx));
    acc(i) = x.x * p.scale;
    acc(i + 1) = x.y * p.scale;
    acc(i + 2) = x.z * p.scale;
    acc(i + 3) = x.w * p.scale;
  }
  Element* dq_bh = static_cast<Element*>(p.dq) + b * p.dq_stride.batch + h * p.dq_stride.head;
  Tensor mdQ = make_tensor(make_gmem_ptr(dq_bh), make_shape(p.seqlen_q, Int<kD>{}), make_stride(p.dq_stride.row, _1{}));
  Tensor gdQ = local_tile(mdQ, Shape<Int<kBlockM>, Int<kD>>{}, make_coord(mb, 0));
  store_acc_tile<Element, kThreads, typename Traits::SmemLayoutQ, typename Traits::GmemCopyOut>(
      acc, mma_dq, reinterpret_cast<Element*>(smem_raw), gdQ, p.seqlen_q - m0, p.hdim, tidx);
}

}  // namespace flashtile::cuda::sm80
