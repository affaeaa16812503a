// Host-side launcher of the sm90 forward kernel (included by the generated instance files only): builds the
// TMA descriptors of Q, K, V and O from the call's pointers and strides (no device work, no allocation) and
// launches the persistent kernel, one CTA per SM.
#pragma once

#include <algorithm>

#include "runtime/runtime.h"
#include "sm90/fwd_kernel.h"
#include "sm90/launch.h"

namespace flashtile::cuda::sm90 {

// The (rows, d, heads, batch) view TMA reads: varlen calls see the packed rows as one sequence of batch 1.
// Extents are at least 1 (a call without keys visits no key tile, but the descriptor must be valid), and an
// extent-1 mode gets a harmless positive stride (TMA takes no zero strides; backend_sm90.cpp refuses them
// for larger extents).
template <class Element>
auto gmem_view(const void* ptr, const detail::Strides& s, const detail::AttnParams& a, std::int64_t rows,
               std::int64_t hdim, std::int64_t heads, GmemShape& shape) {
  const std::int64_t batch = a.is_varlen() ? 1 : a.batch;
  rows = std::max<std::int64_t>(rows, 1);
  const std::int64_t row = s.row > 0 ? s.row : 16;
  const std::int64_t head = heads > 1 ? s.head : row * rows;
  const std::int64_t bstride = batch > 1 ? s.batch : head * std::max<std::int64_t>(heads, 1);
  shape = GmemShape(static_cast<int32_t>(rows), static_cast<int32_t>(hdim), static_cast<int32_t>(heads),
                    static_cast<int32_t>(batch));
  return make_tensor(make_gmem_ptr(static_cast<const Element*>(ptr)), shape, GmemStride(row, _1{}, head, bstride));
}

template <class Element, int kHeadDim, class V>
cudaError_t run_fwd(const FwdParams& p, cudaStream_t stream) {
  constexpr bool kPlain = !V::kMasked && !V::kHooks;
  using Traits = FwdTraits<Element, kHeadDim, V::kHooks, kPlain>;
  const detail::AttnParams& a = p.a;
  KernelParams<Traits> kp;
  kp.f = p;
  // Persistent: one CTA per SM the call may use (the kernel's shared memory allows one), each walking its tiles.
  kp.sched = StaticTileScheduler::make(static_cast<int>((a.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM),
                                       static_cast<int>(a.heads_q), static_cast<int>(a.batch), V::kMasked,
                                       call_sms(a));
  if (kp.sched.count() == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(kp.sched.grid));
  const bool varlen = a.is_varlen();
  const std::int64_t rows_q = varlen ? a.total_q : a.seqlen_q, rows_k = varlen ? a.total_k : a.seqlen_k;
  auto mQ = gmem_view<Element>(a.q, a.q_stride, a, rows_q, a.hdim, a.heads_q, kp.shape_q);
  auto mK = gmem_view<Element>(a.k, a.k_stride, a, rows_k, a.hdim, a.heads_kv, kp.shape_k);
  auto mV = gmem_view<Element>(a.v, a.v_stride, a, rows_k, a.hdim_v, a.heads_kv, kp.shape_v);
  using TileShape = typename Traits::TileShape;
  kp.tma_q = make_tma_copy(SM90_TMA_LOAD{}, mQ, typename Traits::SmemLayoutQ{}, select<0, 2>(TileShape{}), _1{});
  kp.tma_k = make_tma_copy(SM90_TMA_LOAD{}, mK, take<0, 2>(typename Traits::SmemLayoutKV{}),
                           select<1, 2>(TileShape{}), _1{});
  kp.tma_v = make_tma_copy(SM90_TMA_LOAD{}, mV, take<0, 2>(typename Traits::SmemLayoutKV{}),
                           select<1, 2>(TileShape{}), _1{});
  if constexpr (Traits::kStageO) {  // O's store (the kernel uses it in batch mode)
    auto mO = gmem_view<Element>(a.out, a.out_stride, a, rows_q, a.hdim_v, a.heads_q, kp.shape_o);
    kp.tma_o = make_tma_copy(SM90_TMA_STORE{}, mO, typename Traits::SmemLayoutO{}, Shape<_64, Int<kHeadDim>>{}, _1{});
  }
  auto kernel = fwd_kernel<Traits, V>;
  constexpr int smem = Traits::kSmemBytes;
  static_assert(smem <= fwd_smem_bytes(kHeadDim, kPlain, V::kHooks));
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  kernel<<<grid, Traits::kThreads, smem, stream>>>(kp);
  return cudaGetLastError();
}

}  // namespace flashtile::cuda::sm90
