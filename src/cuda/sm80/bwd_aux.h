// The two small kernels around the backward mainloop:
//  - preprocess: dsum = rowsum(dO * O) and lse_log2 = lse * log2(e) per query row (+inf for rows that see no
//    key and for the padding rows up to seqlen_q_pad, so that P = ex2(s * scale_log2 - lse_log2) is 0 there);
//  - dq_convert: dQ = softmax_scale * dq_accum, fp32 -> 16-bit, into dq's strides.
#pragma once

#include "common/cute_utils.h"
#include "common/params.h"

namespace flashtile::cuda::sm80 {

constexpr int kAuxThreads = 256;

// One warp per (b, h, row); lanes stride over 8-element chunks of the head dim.
template <class Element>
__global__ void __launch_bounds__(kAuxThreads) bwd_preprocess_kernel(const __grid_constant__ BwdParams p) {
  const long long warp = (static_cast<long long>(blockIdx.x) * kAuxThreads + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  const long long total = static_cast<long long>(p.batch) * p.heads_q * p.seqlen_q_pad;
  if (warp >= total) return;
  const int i = static_cast<int>(warp % p.seqlen_q_pad);
  const int bh = static_cast<int>(warp / p.seqlen_q_pad);
  const int b = bh / p.heads_q, h = bh % p.heads_q;
  float acc = 0.f;
  float lse2 = INFINITY;
  if (i < p.seqlen_q) {
    const Element* o = static_cast<const Element*>(p.out) + b * p.out_stride.batch + h * p.out_stride.head +
                       i * p.out_stride.row;
    const Element* d = static_cast<const Element*>(p.dout) + b * p.dout_stride.batch + h * p.dout_stride.head +
                       i * p.dout_stride.row;
    for (int c = lane * 8; c < p.hdim_v; c += 32 * 8) {
      const uint4 ov = *reinterpret_cast<const uint4*>(o + c);
      const uint4 dv = *reinterpret_cast<const uint4*>(d + c);
      const Element* oe = reinterpret_cast<const Element*>(&ov);
      const Element* de = reinterpret_cast<const Element*>(&dv);
      CUTE_UNROLL
      for (int j = 0; j < 8; ++j) acc += static_cast<float>(oe[j]) * static_cast<float>(de[j]);
    }
    const float lse = p.lse[b * p.lse_batch + h * p.lse_head + i * p.lse_row];
    lse2 = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
  }
  CUTE_UNROLL
  for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) {
    p.dsum[warp] = acc;
    p.lse_log2[warp] = lse2;
  }
}

// One thread per 8-element chunk of dQ.
template <class Element>
__global__ void __launch_bounds__(kAuxThreads) dq_convert_kernel(const __grid_constant__ BwdParams p) {
  const int chunks = p.hdim / 8;
  const long long idx = static_cast<long long>(blockIdx.x) * kAuxThreads + threadIdx.x;
  const long long total = static_cast<long long>(p.batch) * p.heads_q * p.seqlen_q * chunks;
  if (idx >= total) return;
  const int c = static_cast<int>(idx % chunks) * 8;
  const long long row = idx / chunks;  // (b, h, i)
  const int i = static_cast<int>(row % p.seqlen_q);
  const int bh = static_cast<int>(row / p.seqlen_q);
  const int b = bh / p.heads_q, h = bh % p.heads_q;
  const float* src = p.dq_accum + (static_cast<long long>(bh) * p.seqlen_q_pad + i) * p.hdim_pad + c;
  const float4 x0 = *reinterpret_cast<const float4*>(src);
  const float4 x1 = *reinterpret_cast<const float4*>(src + 4);
  cutlass::Array<float, 8> in;
  in[0] = x0.x * p.scale; in[1] = x0.y * p.scale; in[2] = x0.z * p.scale; in[3] = x0.w * p.scale;
  in[4] = x1.x * p.scale; in[5] = x1.y * p.scale; in[6] = x1.z * p.scale; in[7] = x1.w * p.scale;
  cutlass::NumericArrayConverter<Element, float, 8> conv;
  const cutlass::Array<Element, 8> out = conv(in);
  Element* dst = static_cast<Element*>(p.dq) + b * p.dq_stride.batch + h * p.dq_stride.head + i * p.dq_stride.row + c;
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(&out);
}

}  // namespace flashtile::cuda::sm80
