// What `flashtile fuzz` compares a successful call against: the float64 oracle (flashtile::reference) and
// "standard attention" in the call's precision, the yardstick its tolerance is tied to.
#pragma once

#include <array>

#include <cstdint>
#include <string>
#include <vector>

#include "flashtile/tensor.h"

namespace flashtile::app::fuzz {

// One element of a view as double, read with memcpy (any alignment): (i0, i1, i2, i3) of a rank-4 view,
// (i0, i1, i2) of a rank-3 one, (i0, i1) of a rank-2 one, (i0) of a rank-1 one.
double read_elem(const TensorView& t, std::int64_t i0, std::int64_t i1 = 0, std::int64_t i2 = 0, std::int64_t i3 = 0);
// A rank-1 or rank-2 view's elements in row-major order (alibi_slopes, sinks, cu_seqlens, seqused_k).
std::vector<double> load_flat(const TensorView& t);
// A packed varlen operand [total, H, D] seen as [1, total, H, D], and lse [Hq, total_q] as [1, Hq, total_q]
// (batch stride 0): the batched readers below then read varlen calls too. Other views are returned as they are.
TensorView as_batched(const TensorView& t, bool lse);

// A [B, S, H, D] view copied to contiguous doubles (the dtype's exact values).
struct Dense {
  std::int64_t b = 0, s = 0, h = 0, d = 0;
  std::vector<double> x;
  const double* at(std::int64_t bi, std::int64_t si, std::int64_t hi) const { return x.data() + ((bi * s + si) * h + hi) * d; }
};
Dense load(const TensorView& t);
// Rows `rows` of every (batch, head) of a [B, S, H, D] view, laid out [B, rows, H, D] as the oracle's out.
std::vector<double> load_rows(const TensorView& t, const std::vector<std::int64_t>& rows);
// lse [B, H, S] at `rows`, laid out [B, H, rows].
std::vector<double> load_lse_rows(const TensorView& t, const std::vector<std::int64_t>& rows);

struct Problem {
  Dense q, k, v, dout;  // dout empty for a forward; varlen: [1, total, H, D] (as_batched)
  float scale = 1.0f;
  bool causal = false;
  DType dtype = DType::float32;
  std::array<std::int64_t, 2> window{-1, -1};  // Options::window_size
  float softcap = 0.0f;                        // 0 = off
  std::vector<double> alibi;                   // slopes [Hq] or [B, Hq] (alibi_batched); empty = off
  bool alibi_batched = false;
  std::vector<double> sinks;                   // [Hq]; empty = off
  std::vector<std::int64_t> cu_q, cu_k;        // varlen: [B + 1] each; empty = batched
  std::vector<std::int64_t> seqused;           // seqused_k [B]; empty = every key
};

// Standard attention as an eager framework computes it in the call's dtype: float32 arithmetic, S, P, O,
// dP and the gradients rounded to the dtype where a framework stores them; rows follow the semantics
// (README): no visible key or all visible scores -inf -> O = 0, LSE = -inf, no gradient contribution;
// a NaN or +inf visible score -> NaN row (IEEE arithmetic gives that by itself).
// `score_scale` is max over visible (i, j) of |scale| * sum_c |q_ic k_jc| (finite terms): the size the
// score's rounding error is proportional to.
struct StdForward {
  std::vector<double> out, lse;  // oracle layouts for `rows`
  double score_scale = 0;
};
StdForward standard_forward(const Problem& p, const std::vector<std::int64_t>& rows);
struct StdBackward {
  std::vector<double> dq, dk, dv;
  std::vector<double> dsinks;  // [Hq] with sinks: -sum_i exp(sink_h - LSE_i) delta_i
  double score_scale = 0;
  // Largest sum of |terms| of one gradient element, for dq, dk, dv, from the float64 row (no overflow):
  // dq_i: |scale| sum_j P_ij (sum_c |dO_ic v_jc| + sum_c |dO_ic O_ic|) r_ij |k_j|, dk likewise with q,
  // dv_j: sum_i P_ij |dO_i| r_ij, where r_ij = 1 + |s_ij| + |LSE_i| is the relative error of P recomputed
  // as exp(s - LSE) in units of eps. A gradient that cancels to a small value (or to 0 under a one-hot
  // softmax) still carries the rounding of the terms it was made from. With softcap, |s| is the capped score
  // and r_ij adds c. abs_sum[3], dsinks_h: sum_i P_sink,i (sum_c |dO_ic O_ic| + sum_c |dO_ic| sum_j P_ij |v_jc|)
  // (1 + |sink_h| + |LSE_i|).
  double abs_sum[4] = {0, 0, 0, 0};
};
StdBackward standard_backward(const Problem& p);

// THE tolerance rule of the fuzzer (the test suite's rule, tests/support.cpp expect_close, written again
// here because apps/ cannot link tests/; plus the score term, see fuzz_check.cpp):
//   |got - ref| <= 2 * err(standard) + 8 * eps(dtype) * max(max|ref|, magnitude, 1e-3)
// elementwise over finite references; NaN must meet NaN and an infinity the same infinity, except where
// standard attention in the same precision departs from the oracle the same way (counted apart), and an
// infinity where the oracle's value is within tolerance of the largest finite value of `storage`.
struct Verdict {
  std::string name;
  bool ok = true;
  double err = 0, tol = 0, std_err = 0;
  std::int64_t precision_limited = 0;  // non-finite results that standard attention shares
  std::string detail;                  // first failing element, when !ok
};
Verdict compare(const char* name, const std::vector<double>& got, const std::vector<double>& standard,
                const std::vector<double>& ref, DType dtype, double magnitude, DType storage);

double eps(DType t);
double max_abs_finite(const std::vector<double>& x);

}  // namespace flashtile::app::fuzz
