// Kernel traits of the sm80 path: the CuTe types (MMA tilings, shared-memory layouts, copy atoms) derived
// from one tile_table.h entry. Everything here is a type; the kernels only combine them.
#pragma once

#include "common/cute_utils.h"
#include "sm80/tile_table.h"

namespace flashtile::cuda::sm80 {

// Shared-memory tiles are row-major in 8 x (32 or 64) swizzled atoms so that ldmatrix reads and 16-byte
// cp.async writes are bank-conflict free.
template <class Element, int kCols>
struct SmemAtom {
  static constexpr int kWidth = kCols % 64 == 0 ? 64 : 32;
  static constexpr int kSwizzle = kWidth == 64 ? 3 : 2;
  using Layout = decltype(composition(Swizzle<kSwizzle, 3, 3>{},
                                      cute::Layout<Shape<_8, Int<kWidth>>, Stride<Int<kWidth>, _1>>{}));
  // Global-memory copies: each thread moves 16 bytes (8 elements); kWidth / 8 threads cover one atom row.
  template <int kThreads>
  using GmemThreads = cute::Layout<Shape<Int<kThreads / (kWidth / 8)>, Int<kWidth / 8>>, Stride<Int<kWidth / 8>, _1>>;
};

template <class Element_, int kHeadDim_>
struct FwdTraits {
  using Element = Element_;
  static constexpr FwdTile kTile = fwd_tile(kHeadDim_);
  static_assert(kTile.hdim == kHeadDim_, "no forward tile-table entry for this head dim");
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kWarps = kTile.warps;
  static constexpr int kThreads = kWarps * 32;
  static_assert(kBlockM % (16 * kWarps) == 0 && kBlockN % 16 == 0 && kHeadDim % 32 == 0);

  // Warps split the query rows; each warp owns kBlockM / kWarps rows of S and O.
  using TiledMma = TiledMMA<MmaAtomFor<Element>, Layout<Shape<Int<kWarps>, _1, _1>>, Tile<Int<16 * kWarps>, _16, _16>>;

  using Atom = SmemAtom<Element, kHeadDim>;
  using SmemLayoutQ = decltype(tile_to_shape(typename Atom::Layout{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(tile_to_shape(typename Atom::Layout{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  // V^T (hdim x block_n) as the B operand of P V, read with ldmatrix.trans.
  using SmemLayoutVt =
      decltype(composition(SmemLayoutKV{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));
  using SmemLayoutVtNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutVt{}));

  using SmemCopyAtom = Copy_Atom<SM75_U32x4_LDSM_N, Element>;
  using SmemCopyAtomT = Copy_Atom<SM75_U16x8_LDSM_T, Element>;
  using SmemCopyAtomO = Copy_Atom<DefaultCopy, Element>;

  using GmemCopyIn = decltype(make_tiled_copy(Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>, Element>{},
                                              typename Atom::template GmemThreads<kThreads>{},
                                              Layout<Shape<_1, _8>>{}));
  using GmemCopyOut = decltype(make_tiled_copy(Copy_Atom<UniversalCopy<cute::uint128_t>, Element>{},
                                               typename Atom::template GmemThreads<kThreads>{},
                                               Layout<Shape<_1, _8>>{}));

  static constexpr int kSmemQ = kBlockM * kHeadDim;  // elements
  static constexpr int kSmemKV = kBlockN * kHeadDim;
  static constexpr int kSmemBytes = (kSmemQ + 2 * kSmemKV) * int(sizeof(Element));
  static_assert(kSmemBytes == fwd_smem_bytes(kHeadDim_));
};

template <class Element_, int kHeadDim_, bool kLarge_ = false>
struct BwdTraits {
  using Element = Element_;
  static constexpr BwdTile kTile = bwd_tile(kHeadDim_, kLarge_);
  static_assert(kTile.hdim == kHeadDim_, "no backward tile-table entry for this head dim");
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kWarps = kTile.warps;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kStagesQ = kTile.stages_q;
  static constexpr int kAtomMSdP = kTile.atom_m_sdp, kAtomNdKV = kTile.atom_n_dkv, kAtomMdQ = kTile.atom_m_dq;

  using Mma = MmaAtomFor<Element>;
  using TiledMmaSdP = TiledMMA<Mma, Layout<Shape<Int<kAtomMSdP>, Int<kWarps / kAtomMSdP>, _1>>,
                               Tile<Int<16 * kAtomMSdP>, Int<16 * kWarps / kAtomMSdP>, _16>>;
  using TiledMmadKV = TiledMMA<Mma, Layout<Shape<Int<kAtomNdKV>, Int<kWarps / kAtomNdKV>, _1>>,
                               Tile<Int<16 * kAtomNdKV>, Int<16 * kWarps / kAtomNdKV>, _16>>;
  using TiledMmadQ = TiledMMA<Mma, Layout<Shape<Int<kAtomMdQ>, Int<kWarps / kAtomMdQ>, _1>>,
                              Tile<Int<16 * kAtomMdQ>, Int<16 * kWarps / kAtomMdQ>, _16>>;
  static_assert(kBlockM % (16 * kAtomMSdP) == 0 && kBlockN % (16 * kWarps / kAtomMSdP) == 0);
  static_assert(kBlockN % (16 * kAtomNdKV) == 0 && kHeadDim % (16 * kWarps / kAtomNdKV) == 0);
  static_assert(kBlockM % (16 * kAtomMdQ) == 0 && kHeadDim % (16 * kWarps / kAtomMdQ) == 0);

  using Atom = SmemAtom<Element, kHeadDim>;
  using SmemLayoutQ = decltype(tile_to_shape(typename Atom::Layout{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutQt =
      decltype(composition(SmemLayoutQ{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockM>>{}, GenRowMajor{})));
  using SmemLayoutQtNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutQt{}));
  using SmemLayoutKV = decltype(tile_to_shape(typename Atom::Layout{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutKt =
      decltype(composition(SmemLayoutKV{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));
  using SmemLayoutKtNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutKt{}));

  using AtomPdS = SmemAtom<Element, kBlockN>;
  static_assert(kBlockN % 64 == 0);
  using SmemLayoutPdS = decltype(tile_to_shape(typename AtomPdS::Layout{}, Shape<Int<kBlockM>, Int<kBlockN>>{}));
  using SmemLayoutPdSt =
      decltype(composition(SmemLayoutPdS{}, make_layout(Shape<Int<kBlockN>, Int<kBlockM>>{}, GenRowMajor{})));
  using SmemLayoutPdStNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutPdSt{}));

  using SmemCopyAtom = Copy_Atom<SM75_U32x4_LDSM_N, Element>;
  using SmemCopyAtomT = Copy_Atom<SM75_U16x8_LDSM_T, Element>;
  using SmemCopyAtomStore = Copy_Atom<DefaultCopy, Element>;

  using GmemCopyIn = decltype(make_tiled_copy(Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>, Element>{},
                                              typename Atom::template GmemThreads<kThreads>{},
                                              Layout<Shape<_1, _8>>{}));
  using GmemCopyOut = decltype(make_tiled_copy(Copy_Atom<UniversalCopy<cute::uint128_t>, Element>{},
                                               typename Atom::template GmemThreads<kThreads>{},
                                               Layout<Shape<_1, _8>>{}));

  static constexpr int kSmemQ = kBlockM * kHeadDim;  // elements, one stage of Q (dO is the same)
  static constexpr int kSmemKV = kBlockN * kHeadDim;
  static constexpr int kSmemPdS = kBlockM * kBlockN;
  static constexpr int kSmemBytes = (2 * kStagesQ * kSmemQ + 2 * kSmemKV + 2 * kSmemPdS) * int(sizeof(Element));
  static_assert(kSmemBytes == bwd_smem_bytes(kHeadDim_, kLarge_));
};

}  // namespace flashtile::cuda::sm80
