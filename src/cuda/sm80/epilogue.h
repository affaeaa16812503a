// Epilogues of the sm80 kernels: register accumulators -> 16-bit -> shared memory (swizzled) -> 16-byte
// predicated global stores; the forward also writes LSE. Also the path for a query block with no visible key.
#pragma once

#include "common/cute_utils.h"
#include "common/params.h"

namespace flashtile::cuda::sm80 {

// Writes a (kRows x kCols) fp32 accumulator tile, partitioned by tiled_mma, to gmem rows [0, max_row) and
// columns [0, max_col) of `g` through the shared-memory buffer `smem` (layout SmemLayout). Caller syncs
// before (smem free) as needed; this function syncs between the shared-memory write and the global read.
template <class Element, int kThreads, class SmemLayout, class GmemCopyOut, class TiledMma, class Acc, class G>
CUTE_DEVICE void store_acc_tile(Acc const& acc, TiledMma const& tiled_mma, Element* smem, G&& g, int max_row,
                                int max_col, int tidx) {
  Tensor s = make_tensor(make_smem_ptr(smem), SmemLayout{});
  Tensor r = convert_to<Element>(acc);
  auto copy_r2s = make_tiled_copy_C(Copy_Atom<DefaultCopy, Element>{}, tiled_mma);
  auto thr_r2s = copy_r2s.get_thread_slice(tidx);
  Tensor tRs_src = thr_r2s.retile_S(r);
  Tensor tRs_dst = thr_r2s.partition_D(s);
  copy(copy_r2s, tRs_src, tRs_dst);
  __syncthreads();
  GmemCopyOut copy_out;
  auto thr_out = copy_out.get_thread_slice(tidx);
  Tensor tOs = thr_out.partition_S(s);
  Tensor tOg = thr_out.partition_D(g);
  Tensor c = make_identity_tensor(make_shape(size<0>(s), size<1>(s)));
  Tensor tOc = thr_out.partition_D(c);
  Tensor tOr = make_tensor<Element>(shape(tOs));
  copy(copy_out, tOs, tOr);  // shared -> registers in 16-byte vectors, then predicated global stores
  store_tile(copy_out, tOr, tOg, tOc, max_row, max_col);
}

// A query block in which no row sees any key: O = 0 and LSE = sink (-inf without sinks) for its rows
// [m0, min(m0 + kBlockM, seqlen_q)). out_bh and lse_bh point at the sequence's row 0 of this head.
template <class Element, int kBlockM, int kThreads>
CUTE_DEVICE void write_empty_rows(FwdParams const& p, Element* out_bh, float* lse_bh, int m0, int seqlen_q,
                                  float sink, int tidx) {
  const int rows = min(kBlockM, seqlen_q - m0);
  const int hdim_v = static_cast<int>(p.a.hdim_v);
  for (int i = tidx; i < rows * hdim_v; i += kThreads) {
    const int r = i / hdim_v, c = i % hdim_v;
    out_bh[(m0 + r) * p.a.out_stride.row + c] = Element(0.f);
  }
  for (int r = tidx; r < rows; r += kThreads) lse_bh[(m0 + r) * p.a.lse_stride.row] = sink;
}

}  // namespace flashtile::cuda::sm80
