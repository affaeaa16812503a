// The pieces both decode kernels are made of (decode/kernel.h on mma.sync, decode/kernel_sm90.h on wgmma): the
// CTA's place and start (verdict, append), its key tiles, the K/V loader with its page gathers, the packed Q
// rows, the per-row mask, hook and sink, and the epilogue that merges the parts and writes O and LSE (or this
// split's part). What differs between the kernels is only how the products are issued and where in shared
// memory a row lands (each loader is given the offset of (row, column) in its own layout).
#pragma once

#include "common/mask.h"
#include "common/softmax.h"
#include "core/merge_rule.h"
#include "decode/dependent_launch.h"
#include "decode/params.h"
#include "decode/verdict.h"

namespace flashtile::cuda::decode {

using detail::merged_lse;
using detail::part_weight;

// 16 bytes global -> shared, asynchronously; valid = false writes zeros and reads nothing.
CUTE_DEVICE void cp_async16(void* smem, const void* gmem, bool valid) {
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
}

// The new rows of KV head hk of sequence b (k_new / v_new [b, j, hk]) to keys cache_seqlens[b] + j of the cache
// (kv_row, the one address rule), shared among the `count` CTAs of (b, hk), this one being number `index`. 16-bit
// elements, moved as 16-byte chunks, by the CTA's first kThreads threads.
template <class Element>
CUTE_DEVICE void append_head(const detail::AttnParams& a, int b, int hk, int index, int count) {
  if (threadIdx.x >= kThreads) return;
  const std::int64_t kc = a.hdim / 8, per_row = kc + a.hdim_v / 8, n = a.seqlen_new * per_row;
  const std::int64_t held = a.cache_seqlens[b];
  for (std::int64_t i = std::int64_t{index} * kThreads + threadIdx.x; i < n; i += std::int64_t{count} * kThreads) {
    const std::int64_t j = i / per_row, c = i % per_row;
    const bool is_k = c < kc;
    const std::int64_t e = (is_k ? c : c - kc) * 8;
    const detail::KvRow at = detail::kv_row(a, b, held + j);
    const detail::Strides& ns = is_k ? a.k_new_stride : a.v_new_stride;
    const auto* src = static_cast<const Element*>(is_k ? a.k_new : a.v_new) + b * ns.batch + j * ns.row +
                      hk * ns.head + e;
    auto* dst = static_cast<Element*>(const_cast<void*>(is_k ? a.k : a.v)) + (is_k ? at.k : at.v) +
                hk * (is_k ? a.k_stride.head : a.v_stride.head) + e;
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
  }
}

// A barrier among the threads that copy a stage and read it: the warp, or the CTA.
template <bool kWarp>
CUTE_DEVICE void sync_copiers() {
  if constexpr (kWarp) __syncwarp();
  else __syncthreads();
}

// Packed row R of KV head hk: its token and query head.
struct PackedRow {
  int token, head;
};
CUTE_DEVICE PackedRow packed_row(int R, int group, int hk) { return {R / group, hk * group + R % group}; }

// This CTA's place in the grid (decode_launch.h: x = row tile + split, y = KV head, z = sequence) and its rows.
struct CtaPlace {
  int split, hk, b, group, r0, nrows;
};
CUTE_DEVICE CtaPlace cta_place(const DecodeParams& p, int tile_rows) {
  CtaPlace c;
  const int rt = blockIdx.x % p.row_tiles;
  c.split = blockIdx.x / p.row_tiles;
  c.hk = blockIdx.y;
  c.b = blockIdx.z;
  c.group = p.group;
  c.r0 = rt * tile_rows;
  c.nrows = min(tile_rows, c.group * static_cast<int>(p.a.seqlen_q) - c.r0);
  return c;
}

// What every CTA does first: waits for the index check's verdict (publishing it after a grid-wide check), stops
// on a bad one (NaN in out and lse where the host does not read the verdict back, written by split 0's CTA of the
// rows), appends its share of the new
// rows. False: the CTA has nothing more to do. Every thread of the CTA calls it; its writes are the first kThreads
// threads'.
template <class Element>
CUTE_DEVICE bool begin_cta(const DecodeParams& p, const CtaPlace& c) {
  const detail::AttnParams& a = p.a;
  wait_for_prior_grid();  // the check's verdict
  if (p.decode_publishes && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x == 0)
    publish(p, p.status->first_bad, p.status->longest);
  if (c.hk >= a.heads_kv) return false;  // the one CTA of a grid without KV heads, there to publish
  if (status_bad(*p.status, a.seqlen_k)) {  // the check kernel refused an index: nothing is read or written
    if (p.nan_on_bad && c.split == 0 && threadIdx.x < kThreads) {  // one CTA of the splits writes the rows' NaN
      const int hdim_v = static_cast<int>(a.hdim_v);
      Element* out = static_cast<Element*>(a.out);
      for (int i = threadIdx.x; i < c.nrows * hdim_v; i += kThreads) {
        const PackedRow pr = packed_row(c.r0 + i / hdim_v, c.group, c.hk);
        out[c.b * a.out_stride.batch + pr.token * a.out_stride.row + pr.head * a.out_stride.head + i % hdim_v] =
            Element(NAN);
        if (i % hdim_v == 0 && a.lse != nullptr)
          a.lse[c.b * a.lse_stride.batch + pr.head * a.lse_stride.head + pr.token * a.lse_stride.row] = NAN;
      }
    }
    return false;
  }
  if (a.k_new != nullptr) append_head<Element>(a, c.b, c.hk, blockIdx.x, gridDim.x);
  return c.nrows > 0;  // else an append without query rows
}

// The CTA's keys: the split's part of the key tiles its rows see (core/mask.h key_tiles; tiles outside the mask are
// never loaded), and the tiles every row sees whole. Keys from `fresh` on are this call's new ones: read from
// k_new / v_new, which hold the same values as the cache rows the append writes, so no CTA depends on another's
// append.
struct CtaKeys {
  detail::SeqInfo seq;
  detail::MaskPolicy pol;
  int sk, fresh, it_begin, it_end;
  detail::Range full;
};
CUTE_DEVICE CtaKeys cta_keys(const DecodeParams& p, const CtaPlace& c) {
  const detail::AttnParams& a = p.a;
  CtaKeys k;
  k.seq = detail::sequence(a, c.b);
  k.sk = static_cast<int>(k.seq.seqlen_k);
  k.fresh = a.k_new != nullptr ? k.sk - static_cast<int>(a.seqlen_new) : k.sk;
  k.pol = detail::MaskPolicy::make(a, k.seq);
  const int t0 = c.r0 / c.group, t1 = (c.r0 + c.nrows - 1) / c.group + 1;  // the tile's tokens
  const detail::Range tiles = k.pol.key_tiles(t0, t1 - t0, kBlockN);
  k.full = k.pol.full_key_tiles(t0, t1 - t0, kBlockN);
  const int per_split = static_cast<int>((tiles.size() + p.splits - 1) / p.splits);
  k.it_begin = static_cast<int>(tiles.begin) + c.split * per_split;
  k.it_end = min(k.it_begin + per_split, static_cast<int>(tiles.end));
  return k;
}

// Q: the tile's packed rows into shared memory (zero past the last row and past hdim); offset(r, c) is element
// (r, c)'s place in the kernel's layout. One cp.async group.
template <class Element, int kD, int kTileRows, class Offset>
CUTE_DEVICE void load_q(const DecodeParams& p, const CtaPlace& c, Element* smem_q, Offset offset) {
  const detail::AttnParams& a = p.a;
  constexpr int kChunks = kD / 8;  // 16-byte chunks per row
  const int hdim = static_cast<int>(a.hdim);
  for (int i = threadIdx.x; i < kTileRows * kChunks; i += kThreads) {
    const int r = i / kChunks, col = i % kChunks * 8;
    const bool ok = r < c.nrows && col < hdim;
    const Element* src = static_cast<const Element*>(a.q);
    if (ok) {
      const PackedRow pr = packed_row(c.r0 + r, c.group, c.hk);
      src += c.b * a.q_stride.batch + pr.token * a.q_stride.row + pr.head * a.q_stride.head + col;
    }
    cp_async16(smem_q + offset(r, col), src, ok);
  }
  cp_async_fence();
}

// K and V of key tiles into a ring of stages, 16-byte cp.async per chunk. The copier threads (a warp or the CTA)
// take kGroups 16-row groups of every tile, from group0 on; a copier moves one chunk (cc) of rows rr +
// kRowsPerPass · q of each group, so its offsets are fixed for the whole loop. Where a group lives (kv_place: a
// paged cache's block-table reads; page_size is a multiple of 16) is known one tile before the group's copies
// are issued (place()), its block-table entry read 32 groups earlier still where one warp copies, so the gather's
// dependent load stays out of the copies' latency. Rows past `fresh` come
// from k_new / v_new and rows past sk are zero-filled: only the last tiles hold either, so the row tests are
// compiled into their copy loop alone (kEdge).
template <class Element, int kD, int kCopyThreads, int kGroups>
struct KvLoader {
  static constexpr int kChunks = kD / 8;
  static constexpr int kRowsPerPass = kCopyThreads / kChunks;
  static constexpr int kPasses = 16 / kRowsPerPass;
  static_assert(kCopyThreads % kChunks == 0 && 16 % kRowsPerPass == 0);

  const detail::AttnParams& a;
  int b, sk, fresh, group0, cc, rr, stage_elems, group_elems;
  bool k_col, v_col;
  const Element *k_head, *v_head, *k_fresh, *v_fresh;
  Element *smem_k, *smem_v;
  std::int64_t k_off, v_off;
  int s_off[kPasses];
  detail::KvPlace ahead[kGroups];
  // Where the groups live. Contiguous: the sequence's slot. Paged: with one copier warp (kWarpPages), the
  // block-table entries of its next 64 groups sit in its lanes' registers, unit u = tile · kGroups + group, lane l
  // holding unit win + l (cur) and win + 32 + l (next), each window read 32 units before its first use: the gather's
  // dependent load then never waits in front of the copies (was one tile ahead; on an H100, 2026-12-07, paged 16
  // 0.7 % faster at batch 8, paged 64 the same).
  static constexpr bool kWarpPages = kCopyThreads == 32;
  static_assert(32 % kGroups == 0);
  const std::int32_t* pages = nullptr;  // the sequence's block-table row
  std::int64_t slot = 0;
  int win = -1, cur = 0, next = 0;

  // offset(r, c): element (r, c) of a stage, for rows 0..15; group g's rows lie group_elems further on.
  template <class Offset>
  CUTE_DEVICE KvLoader(const DecodeParams& p, const CtaPlace& c, const CtaKeys& keys, int copier, int group0_,
                       Element* smem_k_, Element* smem_v_, int stage_elems_, int group_elems_, Offset offset)
      : a(p.a), b(c.b), sk(keys.sk), fresh(keys.fresh), group0(group0_), stage_elems(stage_elems_),
        group_elems(group_elems_), smem_k(smem_k_), smem_v(smem_v_) {
    cc = copier % kChunks * 8;
    rr = copier / kChunks;
    k_col = cc < a.hdim;
    v_col = cc < a.hdim_v;
    k_head = static_cast<const Element*>(a.k) + c.hk * a.k_stride.head;
    v_head = static_cast<const Element*>(a.v) + c.hk * a.v_stride.head;
    k_fresh = static_cast<const Element*>(a.k_new) + c.b * a.k_new_stride.batch + c.hk * a.k_new_stride.head;
    v_fresh = static_cast<const Element*>(a.v_new) + c.b * a.v_new_stride.batch + c.hk * a.v_new_stride.head;
    k_off = rr * a.k_stride.row + cc;
    v_off = rr * a.v_stride.row + cc;
    CUTE_UNROLL
    for (int q = 0; q < kPasses; ++q) s_off[q] = offset(q * kRowsPerPass + rr, cc);
    if constexpr (kWarpPages) {  // (the CTA's copiers ask kv_place: no registers held for it across the loop)
      if (a.page_table != nullptr) pages = a.page_table + b * a.page_table_batch_stride;
      else slot = detail::kv_place(a, b, 0).slot;
    }
  }

  CUTE_DEVICE int unit_key(int u) const { return u / kGroups * kBlockN + 16 * (group0 + u % kGroups); }
  // Unit u's block-table entry, for the keys the sequence holds (the ones the index check read).
  CUTE_DEVICE int fetch(int u) const {
    const int j = unit_key(u);
    return j < sk ? pages[j / a.page_size] : 0;
  }

  // The places of the copier's groups of key tile n, for the next load(); n rises by one per call.
  CUTE_DEVICE void place(int n) {
    const int u0 = n * kGroups;
    if constexpr (kWarpPages) {
      if (pages != nullptr && (win < 0 || u0 >= win + 32)) {  // the first two windows, or the next one
        const int lane = threadIdx.x % 32;
        const bool first = win < 0;
        win = first ? u0 : win + 32;
        cur = first ? fetch(win + lane) : next;
        next = fetch(win + 32 + lane);
      }
    }
    CUTE_UNROLL
    for (int i = 0; i < kGroups; ++i) {
      const int j0 = unit_key(u0 + i);
      detail::KvPlace at{};
      // A group past the keys reads no block-table entry (kv_place would read past the sequence's row when
      // page_size < 64 and the last tile reaches beyond max_pages); j0 is uniform over the copiers, which shuffle
      // together.
      if (j0 < sk) {
        if constexpr (kWarpPages) {
          at = pages != nullptr ? detail::paged_place(a, __shfl_sync(~0u, cur, u0 + i - win), j0)
                                : detail::KvPlace{slot, j0};
        } else {
          at = detail::kv_place(a, b, j0);
        }
      }
      ahead[i] = at;
    }
  }

  template <bool kEdge>
  CUTE_DEVICE void copy(int n, int stage) const {
    Element* sk_stage = smem_k + stage * stage_elems;
    Element* sv_stage = smem_v + stage * stage_elems;
    CUTE_UNROLL
    for (int i = 0; i < kGroups; ++i) {
      const int g = group0 + i;
      const detail::KvRow base = detail::kv_offsets(a, ahead[i]);
      CUTE_UNROLL
      for (int q = 0; q < kPasses; ++q) {
        const int so = g * group_elems + s_off[q];
        const Element* ks = k_head + base.k + k_off + q * kRowsPerPass * a.k_stride.row;
        const Element* vs = v_head + base.v + v_off + q * kRowsPerPass * a.v_stride.row;
        bool row_ok = true;
        if constexpr (kEdge) {
          const int j = n * kBlockN + 16 * g + q * kRowsPerPass + rr;
          row_ok = j < sk;
          if (!row_ok) {
            ks = k_head;
            vs = v_head;
          } else if (j >= fresh) {
            ks = k_fresh + (j - fresh) * a.k_new_stride.row + cc;
            vs = v_fresh + (j - fresh) * a.v_new_stride.row + cc;
          }
        }
        cp_async16(sk_stage + so, ks, row_ok && k_col);
        cp_async16(sv_stage + so, vs, row_ok && v_col);
      }
    }
  }

  // Key tile n (its places fetched by place(n)) into ring stage `stage`.
  CUTE_DEVICE void load(int n, int stage) const {
    if ((n + 1) * kBlockN > fresh) copy<true>(n, stage);
    else copy<false>(n, stage);
  }

  // The first kStages tiles from `begin` in flight, one cp.async group per stage (empty or not, so that the
  // kernels' wait counts hold), and the places of the tile after them fetched.
  template <int kStages>
  CUTE_DEVICE void start(int begin, int end) {
    CUTE_UNROLL
    for (int s = 0; s < kStages; ++s) {
      if (begin + s < end) {
        place(begin + s);
        load(begin + s, s);
      }
      cp_async_fence();
    }
    if (begin + kStages < end) place(begin + kStages);
  }
};

// Per thread row (coordinates from the accumulator's identity tensor in (row, col) view): its visible keys, score
// hook (ALiBi's slope is per query head), token, and the sink, which starts the row's softmax in part 0 of split 0
// only, so that the merges count it once. Rows past the tile's last see no key.
template <int kRows, bool kMasked, bool kHooks>
struct PackedRows {
  RowKeys<kRows> keys;
  TileHook hooks[kRows];
  int tokens[kRows];

  template <class Coord>
  CUTE_DEVICE void init(const DecodeParams& p, const CtaPlace& c, const CtaKeys& k, Coord const& coord_rc, int part,
                        float score_scale, OnlineSoftmax<kRows>& softmax) {
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      const int r = get<0>(coord_rc(mi, 0));
      const bool real = r < c.nrows;
      const PackedRow pr = packed_row(c.r0 + (real ? r : 0), c.group, c.hk);
      tokens[mi] = pr.token;
      if (real) {
        row_keys<kMasked>(k.pol, k.sk, pr.token, keys.lo[mi], keys.hi[mi]);
      } else {
        keys.lo[mi] = keys.hi[mi] = 0;
      }
      if constexpr (kHooks) hooks[mi] = TileHook::make(detail::ScoreHook::make(p.a, k.seq, c.b, pr.head));
      if (real && part == 0 && c.split == 0) {
        const OnlineSoftmax<1> one(detail::sink_logit(p.a, pr.head), score_scale);
        softmax.row_max[mi] = one.row_max[0];
        softmax.row_sum[mi] = one.row_sum[0];
      }
    }
  }

  // The score hook on a tile of scores whose keys start at n0.
  template <class S, class Coord>
  CUTE_DEVICE void apply_hooks(S& s_rc, Coord const& coord_rc, int n0) const {
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(s_rc); ++ni) {
        const int j = n0 + get<1>(coord_rc(mi, ni));
        float unused;
        s_rc(mi, ni) = hooks[mi].template apply<AnyHook>(s_rc(mi, ni),
                                                         static_cast<float>(tokens[mi] + hooks[mi].shift - j), unused);
      }
    }
  }
};

// The epilogue of a tile held whole by one thread group (one part): each thread writes its own rows of O straight
// from the accumulator, as pairs of adjacent columns, to out or as this split's part to the workspace, and the
// first lane of each quad their LSE. Through shared memory (store_rows as it was then, with the merge's expf and
// logf per element), the 64-row kernels' epilogue cost each CTA about 30 us: batch 1, 32k keys, Sq 16 took 73.4 us
// against 44.9 us written from registers (bench/results/h200-decode-ab.md, 2026-12-04).
template <class Element, class O, class Coord>
CUTE_DEVICE void store_own_rows(const DecodeParams& p, const CtaPlace& c, O const& acc_o_rc, Coord const& coord_rc,
                                const float* lse) {
  const detail::AttnParams& a = p.a;
  constexpr int kRows = decltype(size<0>(acc_o_rc))::value;
  const int hdim_v = static_cast<int>(a.hdim_v);
  const std::int64_t part_rows = a.batch * a.heads_q * a.seqlen_q;
  CUTE_UNROLL
  for (int mi = 0; mi < kRows; ++mi) {
    const int r = get<0>(coord_rc(mi, 0));
    if (r >= c.nrows) continue;
    const PackedRow pr = packed_row(c.r0 + r, c.group, c.hk);
    if (p.splits == 1) {
      Element* dst = static_cast<Element*>(a.out) + c.b * a.out_stride.batch + pr.token * a.out_stride.row +
                     pr.head * a.out_stride.head;
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(acc_o_rc); ni += 2) {
        const int col = get<1>(coord_rc(mi, ni));  // even; col + 1 is this thread's next value
        if (col < hdim_v) {
          cutlass::Array<Element, 2> pair;
          pair[0] = Element(acc_o_rc(mi, ni));
          pair[1] = Element(acc_o_rc(mi, ni + 1));
          *reinterpret_cast<cutlass::Array<Element, 2>*>(dst + col) = pair;
        }
      }
      if (threadIdx.x % 4 == 0 && a.lse != nullptr)
        a.lse[c.b * a.lse_stride.batch + pr.head * a.lse_stride.head + pr.token * a.lse_stride.row] = lse[mi];
    } else {
      const std::int64_t row = c.split * part_rows + (c.b * a.heads_q + pr.head) * a.seqlen_q + pr.token;
      float* dst = p.o_part + row * hdim_v;
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(acc_o_rc); ni += 2) {
        const int col = get<1>(coord_rc(mi, ni));
        if (col < hdim_v) *reinterpret_cast<float2*>(dst + col) = make_float2(acc_o_rc(mi, ni), acc_o_rc(mi, ni + 1));
      }
      if (threadIdx.x % 4 == 0) p.lse_part[row] = lse[mi];
    }
  }
}

// Four adjacent columns [col, col + 4) of O for packed row pr of sequence b, to out in its dtype.
template <class Element>
CUTE_DEVICE void store_out4(const detail::AttnParams& a, int b, const PackedRow& pr, int col, float4 o) {
  cutlass::Array<Element, 4> v;
  v[0] = Element(o.x);
  v[1] = Element(o.y);
  v[2] = Element(o.z);
  v[3] = Element(o.w);
  *reinterpret_cast<cutlass::Array<Element, 4>*>(static_cast<Element*>(a.out) + b * a.out_stride.batch +
                                                 pr.token * a.out_stride.row + pr.head * a.out_stride.head + col) = v;
}

// The epilogue of a tile split into parts along the keys: each part's normalised O and LSE through shared memory
// `so` (the K/V ring, free once every copy has landed: fp32 [parts][rows][kD], then the LSEs, the weights (both
// [parts][rows]) and the merged LSEs [rows]), merged over the parts (core/merge_rule.h) and written to out / lse, or
// as this split's part to the workspace. The merged LSE and the parts' weights are computed once per row, then O
// four columns at a time. Call after cp_async_wait<0>() and a CTA barrier.
template <int kTileRows, int kD, int kParts>
constexpr int merge_smem_bytes() {
  return (kParts * kTileRows * (kD + 2) + kTileRows) * 4;
}
template <class Element, int kTileRows, int kD, int kParts, class O, class Coord>
CUTE_DEVICE void store_rows(const DecodeParams& p, const CtaPlace& c, O const& acc_o_rc, Coord const& coord_rc,
                            const float* lse, int part, float* so) {
  const detail::AttnParams& a = p.a;
  constexpr int kRows = decltype(size<0>(acc_o_rc))::value;
  float* sl = so + kParts * kTileRows * kD;  // [parts][rows]: each part's LSE
  float* sw = sl + kParts * kTileRows;       // [parts][rows]: its weight in the merge
  float* sm = sw + kParts * kTileRows;       // [rows]: the merged LSE
  CUTE_UNROLL
  for (int mi = 0; mi < kRows; ++mi) {
    const int r = get<0>(coord_rc(mi, 0));
    CUTE_UNROLL
    for (int di = 0; di < size<1>(acc_o_rc); ++di)
      so[(part * kTileRows + r) * kD + get<1>(coord_rc(mi, di))] = acc_o_rc(mi, di);
    if (threadIdx.x % 4 == 0) sl[part * kTileRows + r] = lse[mi];
  }
  __syncthreads();
  const std::int64_t part_rows = a.batch * a.heads_q * a.seqlen_q;
  auto part_row = [&](const PackedRow& pr) {
    return c.split * part_rows + (c.b * a.heads_q + pr.head) * a.seqlen_q + pr.token;
  };
  for (int r = threadIdx.x; r < c.nrows; r += kThreads) {
    const float l = merged_lse([&](int w) { return sl[w * kTileRows + r]; }, kParts);
    sm[r] = l;
    CUTE_UNROLL
    for (int w = 0; w < kParts; ++w) sw[w * kTileRows + r] = part_weight(sl[w * kTileRows + r], l);
    const PackedRow pr = packed_row(c.r0 + r, c.group, c.hk);
    if (p.splits > 1) p.lse_part[part_row(pr)] = l;
    else if (a.lse != nullptr)
      a.lse[c.b * a.lse_stride.batch + pr.head * a.lse_stride.head + pr.token * a.lse_stride.row] = l;
  }
  __syncthreads();
  const int quads = static_cast<int>(a.hdim_v) / 4;  // hdim_v is a multiple of 8
  for (int i = threadIdx.x; i < c.nrows * quads; i += kThreads) {
    const int r = i / quads, col = i % quads * 4;
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
    CUTE_UNROLL
    for (int w = 0; w < kParts; ++w) {
      const float wt = sw[w * kTileRows + r];
      const float4 x = *reinterpret_cast<const float4*>(so + (w * kTileRows + r) * kD + col);
      o.x += wt * x.x;
      o.y += wt * x.y;
      o.z += wt * x.z;
      o.w += wt * x.w;
    }
    const PackedRow pr = packed_row(c.r0 + r, c.group, c.hk);
    if (p.splits == 1) {
      store_out4<Element>(a, c.b, pr, col, o);
    } else {
      *reinterpret_cast<float4*>(p.o_part + part_row(pr) * a.hdim_v + col) = o;
    }
  }
}

// The split-KV merge in the decode kernel itself: each split's CTA leaves its normalised part (o_part, lse_part)
// and counts itself in its group's split count (zeroed by the index check of the same call); the CTA that counts
// last merges the group's parts (core/merge_rule.h) into out and lse. It replaced a combine kernel, which at batch 1,
// 32k keys (16 splits) ended 7.9 us after the decode kernel on the H200 (bench/results/h200-decode-chain.json): a
// launch and a grid-completion wait, for 32 rows of reads. The last CTA's merge reads what the others wrote after
// their fence and count (the threadFenceReduction pattern), from L2 (__ldcg). One warp per row, each lane four
// adjacent columns, the splits' loads kInFlight at a time. Called by the `threads` threads that wrote the part (sync:
// their barrier), with `scratch` shared memory no longer in use (the K/V ring) of 32 + kMaxSplits floats per warp.
// kEarly: the first kInFlight parts are loaded together with the LSEs, before the weights are known (the 16-row
// kernels, 16 in flight: at batch 1's 16 splits the merge waits on L2 once, not three times). The 64-row mma.sync
// kernel has no registers for that: 16 early parts spilled 28 bytes with hooks and masks (ptxas, sm_80), 8 early
// parts too; it loads its parts after the LSEs, 8 at a time. The sum runs in split order either way.
constexpr int split_merge_smem_bytes(int threads) { return (32 + threads / 32 * kMaxSplits) * 4; }
template <class Element, int kInFlight, bool kEarly, class Sync>
CUTE_DEVICE void merge_splits(const DecodeParams& p, const CtaPlace& c, int threads, float* scratch, Sync sync) {
  if (p.splits == 1) return;
  const detail::AttnParams& a = p.a;
  int* last = reinterpret_cast<int*>(scratch);
  __threadfence();  // this thread's part, device-wide, before the CTA counts itself in
  sync();
  if (threadIdx.x == 0) {
    int* count = p.split_counts + (std::int64_t{c.b} * a.heads_kv + c.hk) * p.row_tiles + blockIdx.x % p.row_tiles;
    *last = atomicAdd(count, 1) == p.splits - 1;
  }
  sync();
  if (*last == 0) return;
  __threadfence();  // the other splits' parts were counted in after their fences
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* w = scratch + 32 + warp * kMaxSplits;
  const std::int64_t rows = a.batch * a.heads_q * a.seqlen_q;
  const int dv = static_cast<int>(a.hdim_v);
  const int col = 4 * lane;  // hdim_v is a multiple of 8 and at most 128: the lanes below dv / 4 own the columns
  const bool owns = col < dv;
  for (int r = warp; r < c.nrows; r += threads / 32) {
    const PackedRow pr = packed_row(c.r0 + r, c.group, c.hk);
    const std::int64_t row = (c.b * a.heads_q + pr.head) * a.seqlen_q + pr.token;
    float4 part[kInFlight];
    auto load_parts = [&](int s0) {
      CUTE_UNROLL
      for (int i = 0; i < kInFlight; ++i)
        part[i] = owns && s0 + i < p.splits
                      ? __ldcg(reinterpret_cast<const float4*>(p.o_part + ((s0 + i) * rows + row) * dv + col))
                      : make_float4(0.f, 0.f, 0.f, 0.f);
    };
    if constexpr (kEarly) load_parts(0);
    for (int s = lane; s < p.splits; s += 32) w[s] = __ldcg(p.lse_part + s * rows + row);
    __syncwarp();
    const float l = merged_lse([&](int s) { return w[s]; }, p.splits);
    __syncwarp();  // every lane has read the LSEs before they become weights
    for (int s = lane; s < p.splits; s += 32) w[s] = part_weight(w[s], l);
    __syncwarp();
    if (owns) {
      float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int s0 = 0; s0 < p.splits; s0 += kInFlight) {
        if (s0 > 0 || !kEarly) load_parts(s0);
        CUTE_UNROLL
        for (int i = 0; i < kInFlight; ++i) {
          const float wi = s0 + i < p.splits ? w[s0 + i] : 0.f;
          o.x += wi * part[i].x;
          o.y += wi * part[i].y;
          o.z += wi * part[i].z;
          o.w += wi * part[i].w;
        }
      }
      store_out4<Element>(a, c.b, pr, col, o);
    }
    if (lane == 0 && a.lse != nullptr)
      a.lse[c.b * a.lse_stride.batch + pr.head * a.lse_stride.head + pr.token * a.lse_stride.row] = l;
    __syncwarp();  // the weights are read before the next row's LSEs take their place
  }
}

}  // namespace flashtile::cuda::decode
