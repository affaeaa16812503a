// The online softmax of the forward pass, in registers, over accumulator tiles in (row, col) view.
// Plain and masked kernels keep the scores unscaled in the accumulator; one FFMA per score applies
// softmax_scale * log2(e) and subtracts the running max before ex2 (requires softmax_scale > 0, which can_run
// checks). The hook kernels hand in scores the hook already scaled: their multiplier is log2(e) and their
// score scale 1. Attention sinks start every row at max = sink (in the accumulator's unit: sink / scale) and
// sum = exp(sink - max) = 1, so the sink is one more term of the denominator that adds no value.
#pragma once

#include "common/cute_utils.h"

namespace flashtile::cuda {

template <int kRows>
struct OnlineSoftmax {
  float row_max[kRows];
  float row_sum[kRows];  // this thread's partial sum; the quad reduction happens once, in finalize()

  // sink: the head's sink logit, -inf without sinks; score_scale: the unit of the scores (see above).
  CUTE_DEVICE OnlineSoftmax(float sink, float score_scale) {
    // The quad's partial sums add up in finalize(): one lane carries the sink's 1.
    const bool has_sink = sink != -INFINITY;
    const float m0 = has_sink ? sink / score_scale : -INFINITY;
    const float l0 = has_sink && threadIdx.x % 4 == 0 ? 1.f : 0.f;
    CUTE_UNROLL
    for (int i = 0; i < kRows; ++i) {
      row_max[i] = m0;
      row_sum[i] = l0;
    }
  }

  // Folds one score tile into the running state: scores (rows x cols) become P = exp(scale * s - max), and
  // alpha[mi] = exp(scale * (old max - new max)) is the factor the output accumulator's rows must be rescaled
  // by (rescale(); the sm90 kernel does it later, while the tensor cores are busy). kFirst: the first tile of
  // the row (the sum is still rescaled, since a sink may have started it).
  template <bool kFirst, class S>
  CUTE_DEVICE void fold(S& s, float scale_log2, float (&alpha)[kRows]) {
    static_assert(decltype(size<0>(s))::value == kRows);
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      float m = row_max[mi];
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(s); ++ni) m = fmaxf(m, s(mi, ni));
      m = quad_max(m);
      // A row that has seen no visible key keeps max = -inf; use 0 so that -inf - max stays -inf.
      const float m_scaled = m == -INFINITY ? 0.f : m * scale_log2;
      alpha[mi] = ex2(row_max[mi] * scale_log2 - m_scaled);  // ex2(-inf) = 0 on the first visible tile
      row_sum[mi] *= alpha[mi];
      row_max[mi] = m;
      float sum = 0.f;
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(s); ++ni) {
        const float p = ex2(s(mi, ni) * scale_log2 - m_scaled);
        s(mi, ni) = p;
        sum += p;
      }
      row_sum[mi] += sum;
    }
  }

  template <class O>
  CUTE_DEVICE static void rescale(O& acc_o, const float (&alpha)[kRows]) {
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      CUTE_UNROLL
      for (int di = 0; di < size<1>(acc_o); ++di) acc_o(mi, di) *= alpha[mi];
    }
  }

  // fold() and rescale() at once. kFirst skips the rescale of the (still zero) output accumulator.
  template <bool kFirst, class S, class O>
  CUTE_DEVICE void update(S& s, O& acc_o, float scale_log2) {
    float alpha[kRows];
    fold<kFirst>(s, scale_log2, alpha);
    if constexpr (!kFirst) rescale(acc_o, alpha);
  }

  // O = acc / l and LSE = max * scale + ln(l); a row with no visible key gets O = 0 and LSE = -inf, or with a
  // sink O = 0 and LSE = sink (max = sink / scale, l = 1).
  template <class O>
  CUTE_DEVICE void finalize(O& acc_o, float scale, float (&lse)[kRows]) {
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      const float l = quad_sum(row_sum[mi]);
      // l = 0: no visible key, or every visible score -inf (O = 0, LSE = -inf). l = NaN: a NaN or +inf score; the
      // NaN reaches O and LSE (docs/semantics.md).
      const bool empty = l == 0.f;
      const float inv = empty ? 0.f : 1.f / l;
      lse[mi] = empty ? -INFINITY : row_max[mi] * scale + logf(l);
      CUTE_UNROLL
      for (int di = 0; di < size<1>(acc_o); ++di) acc_o(mi, di) *= inv;
    }
  }
};

}  // namespace flashtile::cuda
