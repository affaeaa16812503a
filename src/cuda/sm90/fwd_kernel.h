// Forward kernel of the sm90 path (Hopper, sm_90a): warp-specialised, TMA-fed, wgmma.
//
// Persistent: one CTA per SM walks its (query block, query head, sequence) tiles from the tile scheduler
// (common/scheduler.h, longest first under a causal mask); the producer loads the next tile's Q and first keys
// while the consumers finish the last one's softmax and P V products and write its O.
// Warpgroup 0 is the producer: one thread issues the TMA loads of Q (once per tile) and of K_j, V_j into a
// kStages-deep ring of shared-memory buffers, each stage signalled by an mbarrier (PipelineTmaAsync); it
// gives its registers to the consumers (setmaxnreg). Warpgroups 1.. are consumers, 64 query rows each; per
// key tile j (S = Q K^T with both operands in shared memory, O += P V with P from registers):
//   wait K_j | [turn] issue S_j = Q K_j^T, rescale O, issue O += P_{j-1} V_{j-1} [pass turn] | S_j done:
//   release K_j | hook, mask, online softmax of S_j | P V done: release V_{j-1} | P_j to 16 bits
// The turns (TurnTaking) cycle the consumer warpgroups' matrix products, so one's softmax hides
// under the others' products.
// The key tiles are those of core/mask.h's policy, visited from the last down to the first as in the sm80
// kernel, so the tiles that need element masking (key tail, diagonal) come first and the window's left edge
// last; every other tile runs without masking code.
#pragma once

#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "common/mask.h"
#include "common/params.h"
#include "common/scheduler.h"
#include "common/softmax.h"
#include "sm90/traits.h"

namespace flashtile::cuda::sm90 {

template <class Traits>
struct KernelParams {
  FwdParams f;
  StaticTileScheduler sched;  // the grid's tiles: (query block, query head, sequence)
  typename Traits::TmaQ tma_q;
  typename Traits::TmaKV tma_k, tma_v;
  typename Traits::TmaO tma_o;
  GmemShape shape_q, shape_k, shape_v, shape_o;
};

// The wgmma accumulator ((2, 2, N / 8), MMA_M, MMA_N) viewed as (rows, cols) = ((2, MMA_M), (2, N / 8, MMA_N)):
// per 8-column atom each thread holds two adjacent columns of rows r and r + 8, as the sm80 m16n8 atom.
template <class L>
CUTE_HOST_DEVICE constexpr auto acc_rowcol(L const& l) {
  static_assert(decltype(rank(l))::value == 3);
  static_assert(decltype(rank<0>(l))::value == 3);
  auto m = get<0>(l);
  return make_layout(make_layout(get<1>(m), get<1>(l)), make_layout(get<0>(m), get<2>(m), get<2>(l)));
}

// The same registers as the A operand of an RS wgmma with K = N: ((2, 2, 2), MMA_M, N / 16 * MMA_N). Two
// adjacent 8-column atoms are one 16-wide k slice, in the order the A fragment wants, so only the view changes.
template <class L>
CUTE_HOST_DEVICE constexpr auto acc_as_a(L const& l) {
  static_assert(decltype(size<0, 2>(l))::value % 2 == 0);
  auto m = logical_divide(get<0>(l), Shape<Underscore, Underscore, _2>{});  // (2, 2, (2, N / 16))
  return make_layout(make_layout(get<0>(m), get<1>(m), get<2, 0>(m)), get<1>(l),
                     coalesce(make_layout(get<2, 1>(m), get<2>(l))));
}

// acc (+)= A B on wgmma, for one warpgroup: A from shared memory (descriptors) or registers, B from shared
// memory; kZero starts from zero. kWait >= 0: waits until at most kWait batches are in flight; -1: returns
// with this one in flight (the caller waits with warpgroup_wait before touching c or a's registers).
template <bool kZero, int kWait, class Mma, class A, class B, class C>
CUTE_DEVICE void wg_gemm(Mma& mma, A const& a, B const& b, C& c) {
  constexpr bool kRegA = !is_same_v<typename A::iterator, GMMA::DescriptorIterator>;
  if constexpr (kRegA) warpgroup_fence_operand(const_cast<A&>(a));
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  if constexpr (kZero) mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(a); ++k) {
    cute::gemm(mma, a(_, _, k), b(_, _, k), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  if constexpr (kWait >= 0) warpgroup_wait<kWait>();
  warpgroup_fence_operand(c);
  if constexpr (kRegA) warpgroup_fence_operand(const_cast<A&>(a));
}

// Named barriers 5.. (one per consumer warpgroup): each warpgroup's own, around its staged O rows (1.. are the
// turns').
constexpr int kOutBarrier = 5;

// Turns of the consumer warpgroups (named barrier 1 + i is warpgroup i's, 256 threads: its own 128 and the 128 of
// the warpgroup before it in the cycle 0, 1, .., n-1, 0): a warpgroup waits for its turn before issuing its matrix
// products and hands the turn to the next right after issuing them, so the others' softmax runs while its products
// occupy the tensor cores. Every sync of a warpgroup is matched by one arrive of the one before it: the last
// warpgroup gives the first its first turn at the start, and the first takes one more turn at the end, so no
// arrival is left pending at exit. A warpgroup cannot arrive twice on its successor's barrier before that one
// synced: to pass again it must get the turn back, which goes through the successor.
template <int kConsumers>
struct TurnTaking {
  static_assert(kConsumers >= 1 && kConsumers + 1 < kOutBarrier);
  int self = 0;  // this consumer warpgroup, 0 .. kConsumers - 1
  CUTE_DEVICE void start() const {
    if constexpr (kConsumers > 1)
      if (self == kConsumers - 1) cutlass::arch::NamedBarrier::arrive(256, 1);
  }
  CUTE_DEVICE void wait_turn() const {
    if constexpr (kConsumers > 1) cutlass::arch::NamedBarrier::sync(256, 1 + self);
  }
  CUTE_DEVICE void pass_turn() const {
    if constexpr (kConsumers > 1) cutlass::arch::NamedBarrier::arrive(256, 1 + (self + 1) % kConsumers);
  }
  CUTE_DEVICE void finish() const {
    if constexpr (kConsumers > 1)
      if (self == 0) cutlass::arch::NamedBarrier::sync(256, 1);
  }
};

template <class Traits, class V>
__global__ void __launch_bounds__(Traits::kThreads, 1) fwd_kernel(const __grid_constant__ KernelParams<Traits> kp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename Traits::Element;
  using Pipeline = typename Traits::Pipeline;
  using Storage = typename Traits::SharedStorage;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kD = Traits::kHeadDim;
  constexpr bool kMasked = V::kMasked, kHooks = V::kHooks;
  extern __shared__ __align__(1024) char smem_raw[];
  Storage& ss = *reinterpret_cast<Storage*>(smem_raw);
  const FwdParams& p = kp.f;
  const detail::AttnParams& a = p.a;

  const int warp = cutlass::canonical_warp_idx_sync();
  const int warpgroup = cutlass::canonical_warp_group_idx();
  const bool lane_leader = cute::elect_one_sync();
  if (warp == 0 && lane_leader) {
    cute::prefetch_tma_descriptor(kp.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_v.get_tma_descriptor());
    if constexpr (Traits::kStageO) cute::prefetch_tma_descriptor(kp.tma_o.get_tma_descriptor());
    cutlass::arch::ClusterTransactionBarrier::init(&ss.barrier_q, 1);
    cutlass::arch::ClusterBarrier::init(&ss.barrier_q_empty, Traits::kMmaThreads);
  }
  typename Pipeline::Params pp;
  pp.transaction_bytes = Traits::kBytesKV;
  pp.role = warpgroup == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pp.is_leader = threadIdx.x == 0;
  pp.num_consumers = Traits::kMmaThreads;
  Pipeline pipeline_k(ss.pipeline_k, pp, Shape<_1, _1, _1>{});
  Pipeline pipeline_v(ss.pipeline_v, pp, Shape<_1, _1, _1>{});
  __syncthreads();  // barriers initialised

  // The tiles of this CTA (common/scheduler.h). Per tile, the same facts on every role: the query block's rows,
  // its sequence, and the key tiles its mask pairs with it (none: O = 0, no load).
  const StaticTileScheduler& sched = kp.sched;
  struct Tile {
    int m_block, h, b, m0, sq, sk, n_first, n_last;
    detail::SeqInfo seq;
    detail::MaskPolicy pol;
  };
  auto tile_at = [&](int t) __attribute__((always_inline)) {
    Tile w;
    const TileCoord c = sched.at(t);
    w.m_block = c.block;
    w.h = c.head;
    w.b = c.batch;
    w.m0 = w.m_block * kBlockM;
    w.seq = detail::sequence(a, w.b);
    w.sq = static_cast<int>(w.seq.seqlen_q);
    w.sk = static_cast<int>(w.seq.seqlen_k);
    w.pol = detail::MaskPolicy::make(a, w.seq);
    w.n_first = 0;
    w.n_last = (w.sk + kBlockN - 1) / kBlockN;
    if constexpr (kMasked) {
      if (w.m0 < w.sq) {
        const detail::Range r = w.pol.key_tiles(w.m0, min(kBlockM, w.sq - w.m0), kBlockN);
        w.n_first = static_cast<int>(r.begin);
        w.n_last = static_cast<int>(r.end);
      }
    }
    return w;
  };

  Tensor sQ = make_tensor(make_smem_ptr(ss.q), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k), typename Traits::SmemLayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v), typename Traits::SmemLayoutKV{});
  Tensor sVt = make_tensor(make_smem_ptr(ss.v), typename Traits::SmemLayoutVt{});

  if (warpgroup == 0) {
    // Producer. 24 registers are enough for address arithmetic; the consumers get the rest.
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    if (warp == 0 && lane_leader) {
      // Per tile: its first K/V tile into the ring (a stage frees as soon as the consumers release one of the last
      // tile's), then Q once the consumers' last S product of the last tile is in (barrier_q_empty), then the other
      // keys. K and V run on through the ring across tiles, so the next tile's loads overlap this tile's last
      // products and its epilogue.
      cutlass::PipelineState<Traits::kStages> write = cutlass::make_producer_start_state<Pipeline>();
      int q_loads = 0;
      for (int k = 0, t = sched.tile(0); t < sched.count(); t = sched.tile(++k)) {
        const Tile w = tile_at(t);
        if (w.m0 >= w.sq || w.n_first >= w.n_last) continue;  // no rows, or no keys: nothing to load
        // Batch mode: tensor (rows, d, heads, batch) at batch b. Varlen: the packed rows, from the sequence's row 0.
        const int hk = w.h / p.group;
        const int bq = a.cu_seqlens_q != nullptr ? 0 : w.b;
        Tensor mQ = domain_offset(make_coord(static_cast<int>(w.seq.q_row0), _0{}),
                                  kp.tma_q.get_tma_tensor(kp.shape_q)(_, _, w.h, bq));
        Tensor mK = domain_offset(make_coord(static_cast<int>(w.seq.k_row0), _0{}),
                                  kp.tma_k.get_tma_tensor(kp.shape_k)(_, _, hk, bq));
        Tensor mV = domain_offset(make_coord(static_cast<int>(w.seq.k_row0), _0{}),
                                  kp.tma_v.get_tma_tensor(kp.shape_v)(_, _, hk, bq));
        Tensor gQ = local_tile(mQ, Shape<Int<kBlockM>, Int<kD>>{}, make_coord(w.m_block, _0{}));
        Tensor gK = local_tile(mK, Shape<Int<kBlockN>, Int<kD>>{}, make_coord(_, _0{}));  // (N, D, n_blocks)
        Tensor gV = local_tile(mV, Shape<Int<kBlockN>, Int<kD>>{}, make_coord(_, _0{}));
        auto [tQg, tQs] = tma_partition(kp.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
        auto [tKg, tKs] = tma_partition(kp.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
        auto [tVg, tVs] = tma_partition(kp.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
        auto load_kv = [&](int n) {
          pipeline_k.producer_acquire(write);
          copy(kp.tma_k.with(*pipeline_k.producer_get_barrier(write), 0), tKg(_, n), tKs(_, write.index()));
          pipeline_v.producer_acquire(write);
          copy(kp.tma_v.with(*pipeline_v.producer_get_barrier(write), 0), tVg(_, n), tVs(_, write.index()));
          ++write;
        };
        load_kv(w.n_last - 1);
        if (q_loads > 0) cutlass::arch::ClusterBarrier::wait(&ss.barrier_q_empty, (q_loads - 1) & 1);
        cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&ss.barrier_q, Traits::kBytesQ);
        copy(kp.tma_q.with(ss.barrier_q, 0), tQg, tQs);
        ++q_loads;
        for (int n = w.n_last - 2; n >= w.n_first; --n) load_kv(n);
      }
    }
    return;
  }

  // Consumers.
  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
  const int tidx = threadIdx.x - 128;
  typename Traits::TiledMmaQK mma_qk;
  typename Traits::TiledMmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(tidx);
  auto thr_pv = mma_pv.get_thread_slice(tidx);
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);
  Tensor tSrK = thr_qk.partition_fragment_B(sK);   // (MMA, MMA_N, MMA_K, stages)
  Tensor tOrV = thr_pv.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K, stages)
  Tensor acc_o = partition_fragment_C(mma_pv, Shape<Int<kBlockM>, Int<kD>>{});
  Tensor acc_o_rc = make_tensor(acc_o.data(), acc_rowcol(acc_o.layout()));
  Tensor tScS = thr_qk.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
  Tensor tScS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));
  Tensor tOcO = thr_pv.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kD>>{}));
  Tensor tOcO_rc = make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));
  const float mult = kHooks ? 1.4426950408889634f : p.scale_log2;
  const float score_scale = kHooks ? 1.f : a.softmax_scale;
  const int hdim_v = static_cast<int>(a.hdim_v);
  const bool tma_store = a.cu_seqlens_q == nullptr;  // batch mode: O's tensor ends where the sequence does
  constexpr int kRows = decltype(size<0>(acc_o_rc))::value;
  TurnTaking<Traits::kConsumerWarpgroups> turns{warpgroup - 1};
  cutlass::PipelineState<Traits::kStages> read, prev;  // run on across tiles, as the producer's
  Tensor acc_s = partition_fragment_C(mma_qk, Shape<Int<kBlockM>, Int<kBlockN>>{});
  Tensor s_rc = make_tensor(acc_s.data(), acc_rowcol(acc_s.layout()));
  Tensor rP = make_tensor<Element>(acc_s.layout());
  Tensor tOrP = make_tensor(rP.data(), acc_as_a(rP.layout()));  // the same registers as P V's A operand
  int q_loads = 0;
  // The turns alternate across tiles too: both warpgroups take the same number per tile, so the first warpgroup's
  // first turn of a tile follows the second's last of the tile before (start once, finish once: a second
  // warpgroup that arrived for its next tile before the first had synced for its last would fill the barrier alone).
  turns.start();

  for (int k = 0, t = sched.tile(0); t < sched.count(); t = sched.tile(++k)) {
    const Tile w = tile_at(t);
    if (w.m0 >= w.sq) continue;  // varlen: this sequence is shorter than max_seqlen_q
    const int m0 = w.m0, sq = w.sq, sk = w.sk, b = w.b, h = w.h;
    // O's and LSE's rows of this (sequence, head), computed where they are written (not kept across the mainloop).
    auto o_ptr = [&]() __attribute__((always_inline)) {
      return static_cast<Element*>(a.out) + b * a.out_stride.batch + w.seq.q_row0 * a.out_stride.row +
             h * a.out_stride.head;
    };
    auto lse_ptr = [&]() __attribute__((always_inline)) {
      return a.lse + b * a.lse_stride.batch + w.seq.q_row0 * a.lse_stride.row + h * a.lse_stride.head;
    };
    const float sink = detail::sink_logit(a, h);
    if (w.n_first >= w.n_last) {  // no row of this block sees a key: O = 0, LSE = sink (-inf without sinks)
      const int rows = min(kBlockM, sq - m0);
      Element* o_bh = o_ptr();
      float* lse_bh = lse_ptr();
      for (int i = tidx; i < rows * hdim_v; i += Traits::kMmaThreads)
        o_bh[(m0 + i / hdim_v) * a.out_stride.row + i % hdim_v] = Element(0.f);
      for (int r = tidx; r < rows; r += Traits::kMmaThreads) lse_bh[(m0 + r) * a.lse_stride.row] = sink;
      continue;
    }
    // Key tiles every row of the block sees whole: no element mask (asked once per tile, not per key tile).
    detail::Range full{};
    if constexpr (kMasked) full = w.pol.full_key_tiles(m0, min(kBlockM, sq - m0), kBlockN);
    const detail::MaskPolicy& pol = w.pol;
    clear(acc_o);
    TileHook hook;
    if constexpr (kHooks) hook = TileHook::make(detail::ScoreHook::make(a, w.seq, b, h));
    OnlineSoftmax<kRows> softmax(sink, score_scale);
    RowKeys<kRows> row_keys;
    row_keys.template init<kMasked>(pol, sk, tScS_rc, m0);

    int n_block = w.n_last - 1;
    // Mainloop, software-pipelined within the warpgroup: while S_j = Q K_j^T runs on the tensor cores, the
    // previous tile's P_{j-1} V_{j-1} is issued behind it, and the softmax of S_j overlaps P_{j-1} V_{j-1}.
    // O is rescaled by tile j-1's factor just before P_{j-1} V_{j-1} is added (FlashAttention-3's order).
    cutlass::arch::ClusterTransactionBarrier::wait(&ss.barrier_q, q_loads & 1);
    ++q_loads;
    float alpha[kRows];
    // Scores of tile n_block into P (in acc_s): hook, mask, online softmax.
    auto scores = [&](auto first, auto masked) __attribute__((always_inline)) {
      const int n0 = n_block * kBlockN;
      // The hook kind is branched on once per key tile (one of three element loops), not tested per element:
      // with AnyHook every element paid for both hooks (softcap_4k took 2.35x the causal call's time, ALiBi 1.36x).
      if constexpr (kHooks)
        with_hook_kind(hook, [&](auto cap, auto alibi) {
          apply_hook<HookKind<decltype(cap)::value, decltype(alibi)::value>>(s_rc, tScS_rc, m0, n0, hook);
        });
      if constexpr (decltype(masked)::value) row_keys.apply(s_rc, tScS_rc, n0, -INFINITY);
      softmax.template fold<decltype(first)::value>(s_rc, mult, alpha);
    };
    auto to_p = [&]() __attribute__((always_inline)) {
      Tensor p16 = convert_to<Element>(acc_s);
      CUTE_UNROLL
      for (int i = 0; i < size(rP); ++i) rP(i) = p16(i);
    };
    // Q is read by the S products only: once the tile's last one is in, its buffer may take the next tile's Q, whose
    // load then overlaps this tile's last softmax, last P V and epilogue instead of following them (at hdim 256 Q
    // is 64 KB, and a short causal tile has only a few key tiles to hide its load behind).
    auto release_q_after = [&](int nb) __attribute__((always_inline)) {
      if (nb == w.n_first) cutlass::arch::ClusterBarrier::arrive(&ss.barrier_q_empty);
    };
    // First tile: S_0 alone.
    pipeline_k.consumer_wait(read);
    turns.wait_turn();
    wg_gemm<true, -1>(mma_qk, tSrQ, tSrK(_, _, _, read.index()), acc_s);
    turns.pass_turn();
    warpgroup_wait<0>();
    pipeline_k.consumer_release(read);
    release_q_after(n_block);
    scores(cute::true_type{}, cute::true_type{});
    to_p();
    prev = read;
    ++read;
    auto step = [&](auto masked) __attribute__((always_inline)) {
      pipeline_k.consumer_wait(read);
      turns.wait_turn();
      wg_gemm<true, -1>(mma_qk, tSrQ, tSrK(_, _, _, read.index()), acc_s);
      softmax.rescale(acc_o_rc, alpha);
      pipeline_v.consumer_wait(prev);
      wg_gemm<false, -1>(mma_pv, tOrP, tOrV(_, _, _, prev.index()), acc_o);
      turns.pass_turn();
      warpgroup_wait<1>();  // S_j is in
      pipeline_k.consumer_release(read);
      release_q_after(n_block);
      scores(cute::false_type{}, masked);
      warpgroup_wait<0>();  // P_{j-1} V_{j-1} is in: tOrP and V_{j-1}'s buffer are free
      pipeline_v.consumer_release(prev);
      to_p();
      prev = read;
      ++read;
    };
    auto needs_mask = [&](int nb) {
      if constexpr (kMasked) return nb < full.begin || nb >= full.end;  // past Sk: never full
      return nb * kBlockN + kBlockN > sk;
    };
    for (--n_block; n_block >= w.n_first && needs_mask(n_block); --n_block) step(cute::true_type{});
    for (; n_block >= w.n_first && (!kMasked || !needs_mask(n_block)); --n_block) step(cute::false_type{});
    if constexpr (kMasked)
      for (; n_block >= w.n_first; --n_block) step(cute::true_type{});
    // Last tile's P V.
    softmax.rescale(acc_o_rc, alpha);
    pipeline_v.consumer_wait(prev);
    turns.wait_turn();
    wg_gemm<false, -1>(mma_pv, tOrP, tOrV(_, _, _, prev.index()), acc_o);
    turns.pass_turn();
    warpgroup_wait<0>();
    pipeline_v.consumer_release(prev);

    // Epilogue: normalise; LSE from the lanes that own each row; O through shared memory where tile_table.h
    // fwd_stages_o has it, else as pairs of 16-bit values from the accumulator. Staged, each warpgroup writes its 64
    // rows to its own buffer and one of its threads stores them with TMA, which clips the rows past the sequence and
    // the columns past the head dim; the warpgroup goes on to its next tile while the store runs. A varlen call's
    // rows are packed (a block's last rows belong to the next sequence, which TMA's bounds cannot tell), so there
    // the warpgroup stores its rows itself, in 16-byte vectors.
    float lse[kRows];
    softmax.finalize(acc_o_rc, score_scale, lse);
    if (tidx % 4 == 0) {
      float* lse_bh = lse_ptr();
      CUTE_UNROLL
      for (int mi = 0; mi < kRows; ++mi) {
        const int row = m0 + get<0>(tScS_rc(mi, 0));
        if (row < sq) lse_bh[row * a.lse_stride.row] = lse[mi];
      }
    }
    if constexpr (Traits::kStageO) {
      const int wg = warpgroup - 1, r0 = wg * 64;
      // The buffer's offset and the thread's place in it are made opaque to the optimiser, so that the stmatrix
      // addresses below (loop-invariant) are computed here, not hoisted out of the tile loop into registers the
      // mainloop needs (hdim 64's kernel, three consumer warpgroups of 160 registers, spilled 72 bytes with them
      // hoisted).
      int o_offset = wg * cosize_v<typename Traits::SmemLayoutO>, wg_tid = tidx % 128;
      asm volatile("" : "+r"(o_offset), "+r"(wg_tid));
      Tensor sO = make_tensor(make_smem_ptr(ss.o + o_offset), typename Traits::SmemLayoutO{});
      const int wg_barrier = kOutBarrier + wg;
      if (tma_store && tidx % 128 == 0) tma_store_wait<0>();  // the last tile's store has read the buffer
      cutlass::arch::NamedBarrier::sync(128, wg_barrier);
      // stmatrix through a one-warpgroup copy: each thread holds only its warpgroup's 64 rows of O, in the
      // fragment layout of a 64-row product.
      auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, typename Traits::TiledMmaPVOneWarpgroup{});
      auto thr_r2s = r2s.get_thread_slice(wg_tid);
      Tensor o16 = convert_to<Element>(acc_o);
      copy(r2s, thr_r2s.retile_S(o16), thr_r2s.partition_D(sO));
      if (tma_store) tma_store_fence();  // the writes above, visible to the TMA unit
      cutlass::arch::NamedBarrier::sync(128, wg_barrier);
      if (tma_store) {
        if (tidx % 128 == 0) {
          Tensor mO = kp.tma_o.get_tma_tensor(kp.shape_o)(_, _, h, b);
          Tensor gO = local_tile(mO, Shape<_64, Int<kD>>{}, make_coord((m0 + r0) / 64, _0{}));
          auto [tOg, tOs] = tma_partition(kp.tma_o, _0{}, Layout<_1>{}, group_modes<0, 2>(sO), group_modes<0, 2>(gO));
          copy(kp.tma_o, tOs, tOg);
          tma_store_arrive();
        }
      } else {
        Element* dst = o_ptr() + (m0 + r0) * a.out_stride.row;
        const int rows = min(64, sq - m0 - r0);
        constexpr int kChunks = kD / 8;
        for (int c = wg_tid; c < 64 * kChunks; c += 128) {
          const int r = c / kChunks, col = (c % kChunks) * 8;
          if (r < rows && col < hdim_v)
            *reinterpret_cast<uint4*>(dst + r * a.out_stride.row + col) = *reinterpret_cast<const uint4*>(&sO(r, col));
        }
      }
    } else {
      Element* o_bh = o_ptr();
      CUTE_UNROLL
      for (int mi = 0; mi < size<0>(acc_o_rc); ++mi) {
        const int row = m0 + get<0>(tOcO_rc(mi, 0));
        if (row >= sq) continue;
        Element* o_row = o_bh + row * a.out_stride.row;
        CUTE_UNROLL
        for (int ni = 0; ni < size<1>(acc_o_rc); ni += 2) {
          const int col = get<1>(tOcO_rc(mi, ni));  // even; col + 1 is this thread's next value
          if (col < hdim_v) {
            cutlass::Array<Element, 2> pair;
            pair[0] = Element(acc_o_rc(mi, ni));
            pair[1] = Element(acc_o_rc(mi, ni + 1));
            *reinterpret_cast<cutlass::Array<Element, 2>*>(o_row + col) = pair;
          }
        }
      }
    }
  }
  turns.finish();
  if constexpr (Traits::kStageO)
    if (tma_store && tidx % 128 == 0) tma_store_wait<0>();  // shared memory stays until the last store has read it
#endif
}

}  // namespace flashtile::cuda::sm90
