// What the CUDA kernels do with core/mask.h's MaskPolicy and core/score.h's ScoreHook (the rules themselves
// live there, once, for every backend): the kernel variants, and the element-wise application of the mask and
// of the score hook to an accumulator tile in (row, col) view.
//
// Variants (one explicit instantiation each, src/cuda/instances/):
//   Plain  - no window or causal mask, no hook: trip count = every key tile, only the sequence's key tail is
//            masked; the unmasked mainloop steps carry no mask or hook code (today's kernels' speed);
//   Masked - the policy is runtime data (causal = window right 0, any window, either side): trip counts from
//            key_tiles / query_tiles, tile() decides which tiles need element masking;
//   Hooks  - Masked plus the score hook (softcap, ALiBi). Calls with a hook and no mask run it too (the policy
//            of an unbounded window masks only the key tail).
#pragma once

#include <cute/tensor.hpp>

#include "common/cute_utils.h"
#include "core/mask.h"
#include "core/score.h"

namespace flashtile::cuda {

template <bool kMasked_, bool kHooks_>
struct Variant {
  static constexpr bool kMasked = kMasked_;
  static constexpr bool kHooks = kHooks_;
};
using Plain = Variant<false, false>;
using Masked = Variant<true, false>;
using Hooks = Variant<true, true>;

// Keys [lo, hi) of query row `row` (index within its sequence) that the tile keeps: the policy's range when
// masked, else every key before the sequence's end sk (the plain kernels never touch the policy, so it does
// not occupy registers there).
template <bool kMasked>
CUTE_DEVICE void row_keys(const detail::MaskPolicy& pol, int sk, int row, int& lo, int& hi) {
  if constexpr (kMasked) {
    lo = static_cast<int>(pol.key_begin(row));
    hi = static_cast<int>(pol.key_end(row));
  } else {
    lo = 0;
    hi = sk;
  }
}

// Sets the elements of a tile (rows from m0, keys from n0) that row_keys() excludes to `value` (-inf before
// the softmax; 0 for P and dS after it). acc_rc and coord_rc: the accumulator and its identity tensor in
// (row, col) view.
template <bool kMasked, class Acc, class Coord>
CUTE_DEVICE void mask_tile(Acc& acc_rc, Coord const& coord_rc, int m0, int n0, const detail::MaskPolicy& pol,
                           int sk, float value) {
  CUTE_UNROLL
  for (int mi = 0; mi < cute::size<0>(acc_rc); ++mi) {
    int lo, hi;
    row_keys<kMasked>(pol, sk, m0 + cute::get<0>(coord_rc(mi, 0)), lo, hi);
    CUTE_UNROLL
    for (int ni = 0; ni < cute::size<1>(acc_rc); ++ni) {
      const int col = n0 + cute::get<1>(coord_rc(mi, ni));
      if (col < lo || col >= hi) acc_rc(mi, ni) = value;
    }
  }
}

// This thread's rows' visible keys [lo, hi), asked from the policy once per CTA (row_keys), so that the
// forward's masked steps do no int64 policy arithmetic in the mainloop. rows(mi): the row of accumulator row mi.
template <int kRows>
struct RowKeys {
  int lo[kRows], hi[kRows];
  template <bool kMasked, class Coord>
  CUTE_DEVICE void init(const detail::MaskPolicy& pol, int sk, Coord const& coord_rc, int m0) {
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) row_keys<kMasked>(pol, sk, m0 + cute::get<0>(coord_rc(mi, 0)), lo[mi], hi[mi]);
  }
  // Sets the elements outside each row's range to `value` (keys from n0).
  template <class Acc, class Coord>
  CUTE_DEVICE void apply(Acc& acc_rc, Coord const& coord_rc, int n0, float value) const {
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      CUTE_UNROLL
      for (int ni = 0; ni < cute::size<1>(acc_rc); ++ni) {
        const int col = n0 + cute::get<1>(coord_rc(mi, ni));
        if (col < lo[mi] || col >= hi[mi]) acc_rc(mi, ni) = value;
      }
    }
  }
};

// The score hook, exactly ScoreHook::operator() of core/score.h with its constants folded: 1 / softcap as a
// multiplication, the ALiBi distance |i + Sk - Sq - j| in int32 (|distance| < 2^30 by can_run; exact in float
// below 2^24, as the float conversion in ScoreHook). dscore receives d s / d (scale q·k) = 1 - tanh² (1
// without softcap): the backward multiplies dS by it and applies softmax_scale to dQ and dK at the end, as the
// plain kernels do.
struct TileHook {
  float scale = 1.f, cap = 0.f, inv_cap = 0.f, slope = 0.f;
  int shift = 0;

  CUTE_DEVICE static TileHook make(const detail::ScoreHook& h) {
    TileHook t;
    t.scale = h.scale;
    t.cap = h.softcap;
    t.inv_cap = h.softcap > 0.f ? 1.f / h.softcap : 0.f;
    t.slope = h.slope;
    t.shift = static_cast<int>(h.shift);
    return t;
  }
  // raw = q_i·k_j; dist = i + Sk - Sq - j as a float (exact: |dist| < 2^24, the conversion ScoreHook makes).
  // Kind: HookKind (which hooks are on, known at compile time: the callers branch once per tile with
  // with_hook_kind, since a per-element runtime test is predicated and every call then pays for both hooks;
  // on the H200 the sm80 kernels are instruction-issue bound) or AnyHook (both, tested at run time).
  template <class Kind>
  CUTE_DEVICE float apply(float raw, float dist, float& dscore) const {
    float s = raw * scale;
    dscore = 1.f;
    if (Kind::kCap && (!Kind::kTest || cap > 0.f)) {
      // tanh(x) = 1 - 2 / (2^(2 x log2 e) + 1), branch-free on the special-function unit (ex2.approx and
      // rcp.approx: 2^(+big) = inf gives 1, 2^(-big) = 0 gives -1): absolute error about 2e-7, far below the
      // scores' 16-bit rounding. tanh.approx.f32 (one instruction) is off by up to 2^-11 relative, as much as
      // fp16's rounding of P, so it is not used; libdevice's tanhf (a separate polynomial for small |x|) made
      // the hdim 64 hook forward spill 756 bytes; an IEEE reciprocal (__frcp_rn) has a slow path.
      const float t = 1.f - 2.f * rcp(ex2(s * inv_cap * 2.8853900817779268f) + 1.f);
      s = cap * t;
      dscore = 1.f - t * t;
    }
    if constexpr (Kind::kAlibi) s = fmaf(-slope, fabsf(dist), s);  // slope 0 adds 0
    return s;
  }
};

template <bool kCap_, bool kAlibi_>
struct HookKind {
  static constexpr bool kCap = kCap_, kAlibi = kAlibi_, kTest = false;
};
struct AnyHook {
  static constexpr bool kCap = true, kAlibi = true, kTest = true;
};

// Calls f(kCap, kAlibi) with the hook's kind as compile-time constants (softcap only, ALiBi only, both).
template <class F>
CUTE_DEVICE void with_hook_kind(const TileHook& hook, F&& f) {
  if (hook.cap > 0.f) {
    if (hook.slope != 0.f) f(cute::true_type{}, cute::true_type{});
    else f(cute::true_type{}, cute::false_type{});
  } else {
    f(cute::false_type{}, cute::true_type{});
  }
}

// Calls f(mi, ni, dist) for each element of a tile in (row, col) view (rows from m0, keys from n0), with dist
// = i + Sk - Sq - j as a float. One int-to-float conversion per row: the column offsets within a thread's
// fragment are compile-time constants. Conversions issue at a quarter of the FMA rate or less; with one per
// element the ALiBi forward ran at half of plain's speed on the H200.
template <class Coord, class F>
CUTE_DEVICE void for_each_dist(Coord const& coord_rc, int m0, int n0, int shift, F&& f) {
  CUTE_UNROLL
  for (int mi = 0; mi < cute::size<0>(coord_rc); ++mi) {
    const int col0 = cute::get<1>(coord_rc(mi, 0));
    const float base = static_cast<float>(m0 + cute::get<0>(coord_rc(mi, 0)) + shift - n0 - col0);
    CUTE_UNROLL
    for (int ni = 0; ni < cute::size<1>(coord_rc); ++ni)
      f(mi, ni, base - static_cast<float>(cute::get<1>(coord_rc(mi, ni)) - col0));
  }
}

// The hook of kind Kind (HookKind) on a tile of raw scores (rows from m0, keys from n0), in place (forward).
template <class Kind, class Acc, class Coord>
CUTE_DEVICE void apply_hook(Acc& s_rc, Coord const& coord_rc, int m0, int n0, const TileHook& hook) {
  for_each_dist(coord_rc, m0, n0, hook.shift, [&](int mi, int ni, float dist) {
    float unused;
    s_rc(mi, ni) = hook.template apply<Kind>(s_rc(mi, ni), dist, unused);
  });
}

}  // namespace flashtile::cuda
