// Kernel traits of the sm90 (Hopper) forward: the CuTe SM90 types (GMMA tilings, shared-memory layouts in
// GMMA's swizzled atoms, TMA copies, the K/V pipeline) derived from one tile_table.h entry.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/pipeline/pipeline.hpp>

#include "sm90/tile_table.h"

namespace flashtile::cuda::sm90 {

using namespace cute;

// The global tensors as TMA sees them: (rows, head dim, heads, batch). Rows are a sequence's rows, or the
// packed rows of every sequence in a varlen call (batch extent 1; the kernel offsets to the sequence's row 0).
using GmemShape = Shape<int32_t, int32_t, int32_t, int32_t>;
using GmemStride = Stride<int64_t, _1, int64_t, int64_t>;

// The widest GMMA K-major swizzle atom (8 rows x 64, 32 or 16 elements of 16 bits) whose width divides the
// tile's K extent: 128-byte swizzling for head dims that are multiples of 64, 64-byte for 96.
template <class Element, int kK>
CUTE_HOST_DEVICE constexpr auto smem_atom_k_major() {
  if constexpr (kK % 64 == 0) return GMMA::Layout_K_SW128_Atom<Element>{};
  else if constexpr (kK % 32 == 0) return GMMA::Layout_K_SW64_Atom<Element>{};
  else {
    static_assert(kK % 16 == 0, "the tile's K extent must be a multiple of 16");
    return GMMA::Layout_K_SW32_Atom<Element>{};
  }
}

// kPlain_: the variant without mask or score hooks, whose tile may be wider (tile_table.h block_n_plain).
template <class Element_, int kHeadDim_, bool kHooks_ = false, bool kPlain_ = false>
struct FwdTraits {
  using Element = Element_;
  static constexpr FwdTile kTile = fwd_tile(kHeadDim_);
  static_assert(kTile.hdim == kHeadDim_, "no sm90 forward tile-table entry for this head dim");
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = fwd_block_m(kHeadDim_, kHooks_);
  static constexpr int kBlockN = fwd_block_n(kHeadDim_, kPlain_);
  static constexpr int kStages = kTile.stages;
  // One producer warpgroup (TMA) and one consumer warpgroup per 64 query rows (wgmma's M).
  static constexpr int kConsumerWarpgroups = kBlockM / 64;
  static constexpr int kMmaThreads = kConsumerWarpgroups * 128;
  static constexpr int kThreads = kMmaThreads + 128;
  static_assert(kBlockM % 64 == 0 && kBlockN % 16 == 0 && kHeadDim % 16 == 0);
  static constexpr int kProducerRegs = sm90::kProducerRegs;
  static constexpr int kConsumerRegs = consumer_regs(kConsumerWarpgroups);
  static_assert(kConsumerWarpgroups <= 3 && 128 * (kProducerRegs + kConsumerWarpgroups * kConsumerRegs) <= 65536);

  using TileShape = Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>;
  using AtomLayout = Layout<Shape<Int<kConsumerWarpgroups>, _1, _1>>;
  // S = Q K^T: both operands in shared memory, K-major (the head dim is contiguous in both).
  using TiledMmaQK = decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float, TileShape>(), AtomLayout{}));
  // O += P V: P from registers (A), V from shared memory as the MN-major B operand (V's head dim, the N of
  // this product, is contiguous).
  using TiledMmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kBlockN>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      AtomLayout{}));

  // The same product for one warpgroup's 64 rows (its threads' share of O; the epilogue's stmatrix copy is cut to it).
  using TiledMmaPVOneWarpgroup = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, Int<kBlockN>>, GMMA::Major::K,
                           GMMA::Major::MN>()));

  using SmemAtom = decltype(smem_atom_k_major<Element, kHeadDim>());
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  // V^T (head dim x keys x stages) over V's buffer: the B operand of P V.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutKV{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{}, Step<_2, _1, _3>{})));

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;

  // O's staging buffer, 64 rows per consumer warpgroup, where tile_table.h fwd_stages_o has it: in the swizzled
  // layout of Q's tile, which the TMA store reads and stmatrix fills without bank conflicts (each row's 16-byte
  // chunks permuted by its row index mod 8).
  using SmemLayoutO = decltype(tile_to_shape(SmemAtom{}, Shape<_64, Int<kHeadDim>>{}));
  static constexpr bool kStageO = fwd_stages_o(kHeadDim, kPlain_, kHooks_);

  struct SharedStorage {
    alignas(1024) Element q[cosize_v<SmemLayoutQ>];
    alignas(1024) Element k[cosize_v<SmemLayoutKV>];
    alignas(1024) Element v[cosize_v<SmemLayoutKV>];
    alignas(1024) Element o[kStageO ? kConsumerWarpgroups * cosize_v<SmemLayoutO> : 8];
    alignas(16) uint64_t barrier_q;
    alignas(8) uint64_t barrier_q_empty;  // the consumers' arrivals once a tile's products no longer read Q
    typename Pipeline::SharedStorage pipeline_k;
    typename Pipeline::SharedStorage pipeline_v;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));

  using GmemTensor = decltype(make_tensor(make_gmem_ptr(static_cast<const Element*>(nullptr)), GmemShape{},
                                          GmemStride{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutQ{}, select<0, 2>(TileShape{}), _1{}));
  using TmaKV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutKV{}),
                                       select<1, 2>(TileShape{}), _1{}));
  // O out of its staging buffer, 64 rows (one consumer warpgroup's) per store; rows and columns past the tensor's
  // extents (the sequence's last block, a head dim below the bucket) are not written.
  using TmaO = decltype(make_tma_copy(SM90_TMA_STORE{}, GmemTensor{}, SmemLayoutO{}, Shape<_64, Int<kHeadDim>>{},
                                      _1{}));
  static constexpr uint32_t kBytesQ = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kBytesKV = kBlockN * kHeadDim * sizeof(Element);
};

}  // namespace flashtile::cuda::sm90
