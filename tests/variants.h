// Test support for the variants of issue 12: a problem with any mix of varlen (cu_seqlens, seqused_k), window,
// softcap, ALiBi and sinks; the float64 oracle's results for it; and standard attention in the case's precision
// with the same variants (the tolerance yardstick, as support.h's standard_attention is for plain calls).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "support.h"

namespace ft_test {

struct VarCase {
  std::string label;                      // the test name
  std::int64_t b = 1, sq = 1, sk = 1;     // batched shape (ignored when lens_q is given)
  std::vector<std::int64_t> lens_q, lens_k;  // varlen: per-sequence lengths (packed tensors, cu_seqlens)
  std::vector<std::int64_t> seqused_k;    // keys used per sequence (empty: all)
  std::int64_t hq = 1, hkv = 1, d = 32, dv = 32;
  bool causal = false;
  std::array<std::int64_t, 2> window{-1, -1};
  float softcap = 0.0f;
  int alibi = 0;      // 0 off, 1 slopes [Hq], 2 slopes [B, Hq]
  bool sinks = false;
  DType dtype = DType::float32;
  Layout layout = Layout::contiguous;
  double data_scale = 1.0;  // stddev of q and k (large: scores past the softcap)

  bool varlen() const { return !lens_q.empty(); }
  std::int64_t batch() const { return varlen() ? static_cast<std::int64_t>(lens_q.size()) : b; }
};
inline void PrintTo(const VarCase& c, std::ostream* os) { *os << c.label; }

struct VarProblem {
  VarCase c;
  std::int64_t total_q = 0, total_k = 0, max_q = 0, max_k = 0;
  std::vector<std::int64_t> cu_q, cu_k;  // B + 1 entries (varlen)
  std::unique_ptr<Tensor> q, k, v, out, lse, dout, dq, dk, dv;
  std::unique_ptr<Tensor> alibi, sinks, dsinks, cu_seqlens_q, cu_seqlens_k, seqused;
  VarProblem(const VarCase& cs, std::mt19937_64& rng);
  flashtile::Options options(const std::string& backend = "auto", bool backward = false) const;
  // Sequence b: first packed row (varlen) and lengths (keys: those used).
  std::int64_t q_row0(std::int64_t b) const { return c.varlen() ? cu_q[static_cast<std::size_t>(b)] : 0; }
  std::int64_t k_row0(std::int64_t b) const { return c.varlen() ? cu_k[static_cast<std::size_t>(b)] : 0; }
  std::int64_t len_q(std::int64_t b) const;
  std::int64_t len_k(std::int64_t b) const;
  void forward(const std::string& backend = "auto");
  void backward(const std::string& backend = "auto");
};

struct VarResults {
  std::vector<double> out, lse, dq, dk, dv, dsinks;  // logical row-major order of the tensors
  double out_score_sensitivity = 0.0;  // standard attention's (support.h row_score_sensitivity)
};

VarResults var_oracle(const VarProblem& p, bool with_backward);
// Standard attention with the variants, in float32 arithmetic with S, P, O, dP, dS and gradients rounded to the
// dtype as support.h's standard_attention does; the score hooks (softcap, ALiBi) in float32 after S is rounded,
// as a fused score modifier computes them.
VarResults var_standard(const VarProblem& p, bool with_backward);
// The LSE magnitude (support.h score_magnitude) over the keys each row sees, ALiBi terms and sinks included.
double var_score_magnitude(const VarProblem& p);

// Whether the kernel's results are within the tolerance of support.h's expect_close (no gtest assertion).
bool var_close(const std::vector<double>& got, const std::vector<double>& standard, const std::vector<double>& ref,
               DType dtype, double magnitude, double score_sensitivity = 0.0);
// Compares out and lse (and, with_backward, dq, dk, dv, dsinks) with expect_close.
void expect_var_close(const VarProblem& p, const VarResults& ref, const VarResults& standard, bool with_backward);

}  // namespace ft_test
