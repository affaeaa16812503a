// Test support: owning host tensors with chosen layouts, seeded random data, the float64 oracle's
// results, "standard attention" in the test's precision (the tolerance yardstick) and comparisons.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "flashtile/flashtile.h"

namespace ft_test {

using flashtile::DType;
using flashtile::TensorView;

// The run's seed: FLASHTILE_TEST_SEED if set, else fresh; printed once so a failure can be replayed.
std::uint64_t run_seed();
// A generator for the current test: run seed mixed with the test's full name.
std::mt19937_64 test_rng();

enum class Layout { contiguous, heads_major, padded };
const char* layout_name(Layout l);

// A host tensor [d0, d1, d2(, d3)] whose memory layout follows `layout`:
//   contiguous:  row-major;
//   heads_major: dims 1 and 2 swapped in memory (like a [B, H, S, D] tensor viewed as [B, S, H, D]);
//   padded:      every row of the last dim padded, plus a gap between batches.
class Tensor {
 public:
  Tensor(DType dtype, std::vector<std::int64_t> shape, Layout layout = Layout::contiguous);
  const TensorView& view() const { return view_; }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  std::int64_t numel() const;

  double get(std::int64_t flat) const;  // logical row-major index
  void set(std::int64_t flat, double x);
  void fill_normal(std::mt19937_64& rng, double stddev = 1.0);
  void fill(double x);  // e.g. NaN poison
  std::vector<double> to_double() const;  // logical row-major order

 private:
  std::int64_t offset(std::int64_t flat) const;
  DType dtype_;
  std::vector<std::int64_t> shape_;
  std::vector<unsigned char> storage_;
  TensorView view_;
};

struct Case {
  std::int64_t b = 1, sq = 1, sk = 1, hq = 1, hkv = 1, d = 64, dv = 64;
  bool causal = false;
  DType dtype = DType::float32;
  Layout layout = Layout::contiguous;
  std::optional<float> softmax_scale;  // unset: 1 / sqrt(d), the library's default; not part of name()
  std::string name() const;
};
// GoogleTest prints a parameter with this instead of its bytes.
inline void PrintTo(const Case& c, std::ostream* os) { *os << c.name(); }

// The operands of one case, filled with N(0, 1) data.
struct Problem {
  Case c;
  Tensor q, k, v, out, lse, dout, dq, dk, dv;
  explicit Problem(const Case& cs, std::mt19937_64& rng);
  flashtile::Options options(const std::string& backend = "auto") const;
};

// Float64 results, in logical row-major order of out [B,Sq,Hq,Dv], lse [B,Hq,Sq], dq, dk, dv.
struct Results {
  std::vector<double> out, lse, dq, dk, dv;
  double out_score_sensitivity = 0.0;  // standard attention's: see row_score_sensitivity
};

// The first-order size of a query row's output error from the rounding of its scores. ∂O_c/∂s_j = p_j·(v_jc − O_c),
// and each score's float32 rounding error is a multiple of eps times mag_j, the size of the terms it is summed from
// (scale · Σ_e |q_e·k_je|, as score_magnitude); the scores are separate dot products, so their errors add as
// independent terms: sqrt(Σ_j (p_j·mag_j·(v_jc − O_c))²), the largest over the columns c. It matters when one key
// dominates a row: the output then moves with that one score's rounding, which no sum over keys averages, and
// FlashTile's error and standard attention's are two unrelated draws of it (a drawn float32 decode case had
// 5× standard attention's error, over a tolerance that held only max|O| for this). p, mag: the row's [sk];
// v(j, c): value j's column c; o: the row's output [dv]. Keys with p_j = 0 or non-finite terms add nothing.
template <class VAt>
double row_score_sensitivity(std::int64_t sk, std::int64_t dv, const float* p, const double* mag, VAt v, const double* o) {
  double worst = 0.0;
  for (std::int64_t c = 0; c < dv; ++c) {
    double sum = 0.0;
    for (std::int64_t j = 0; j < sk; ++j) {
      if (p[j] == 0.0f) continue;
      const double t = static_cast<double>(p[j]) * mag[j] * (v(j, c) - o[c]);
      if (std::isfinite(t)) sum += t * t;
    }
    worst = std::max(worst, std::sqrt(sum));
  }
  return worst;
}

Results oracle(const Problem& p, bool with_backward);
// Standard attention (materialises S and P) in the case's precision: float32 arithmetic, with S, P, O,
// dP, dS and the gradients rounded to the case's dtype where eager frameworks store them.
Results standard_attention(const Problem& p, bool with_backward);

// Max |got - ref| over all elements; infinite if NaN appears where the reference has none (or vice
// versa), or if infinities differ.
double max_abs_error(const std::vector<double>& got, const std::vector<double>& ref);
double max_abs(const std::vector<double>& x);
// The `magnitude` for gradients: the largest gradient, times (1 + max|LSE|). The backward recomputes
// P = exp(s - LSE) from the stored LSE, so P carries a relative error of about eps·|LSE| that standard
// attention (which keeps P) does not have; that is the price of recomputation and is allowed for.
double backward_magnitude(const Results& ref);
// The `magnitude` for LSE: the largest scale · Σ_c |q_ic · k_jc| over visible (i, j), the size of the terms a
// score is summed from. LSE is 1-Lipschitz in a row's scores (∂LSE/∂s_j = p_j, Σ p_j = 1), so its error is
// the error of the scores plus the log-sum's own rounding; a score's rounding error, in any evaluation order
// (standard attention's included), is a multiple of eps times these terms, not of eps·|s|, which cancellation
// can make far smaller. With Sk = 1 the LSE is one score: a floor of 8·eps·|LSE| was below the rounding of
// the dot product itself, and the test failed by chance (issue 11).
double score_magnitude(const Problem& p);

// A forward and backward already run on p (out, lse, dq, dk, dv) against the float64 oracle, each within
// expect_close's tolerance tied to standard attention in the same precision.
void compare_with_oracle(const Problem& p);
// Machine epsilon of the dtype.
double eps(DType t);

// What a CPU kernel set's bf16 products run on, as its dispatch report names them (src/cpu/isa.cpp kSets): the
// expectation of the report tests.
std::string bf16_products_of(std::string_view isa);

// Sets FLASHTILE_CPU_ISA (value non-null) or clears it (null) for a scope, and restores what it was: a test
// that forces or clears the path must leave the rest of a one-process run (a forced-ISA run of the whole
// binary) on the path that run was started with.
class ScopedCpuIsa {
 public:
  explicit ScopedCpuIsa(const char* value);
  ~ScopedCpuIsa();
  ScopedCpuIsa(const ScopedCpuIsa&) = delete;
  ScopedCpuIsa& operator=(const ScopedCpuIsa&) = delete;
  void set(const char* value);

 private:
  bool had_ = false;
  std::string old_;
};

// The tolerance every comparison uses: 2 · std_err + 8 · eps · max(max|ref|, magnitude, 1e-3)
// + 8 · eps(float32) · score_sensitivity. `magnitude` is the scale of the quantities the output is summed from
// (for gradients: the largest of the three gradients), so an output that is exactly 0 in theory (a softmax over
// one key has dq = dk = 0) is allowed the rounding of the terms that cancel. `score_sensitivity` (for O:
// row_score_sensitivity's largest) is in float32's eps whatever the dtype: every backend, and standard attention
// before it rounds S, sums the scores in float32. std_err: standard attention's max_abs_error against ref.
double tolerance(double std_err, const std::vector<double>& ref, DType dtype, double magnitude = 0.0,
                 double score_sensitivity = 0.0);
// FLASHTILE_TEST_VERBOSE=1 prints every comparison (error, standard error, tolerance, their ratio).
// Asserts err(got) <= tolerance(...) and prints both errors on failure.
void expect_close(const char* what, const std::vector<double>& got, const std::vector<double>& standard,
                  const std::vector<double>& ref, DType dtype, double magnitude = 0.0, double score_sensitivity = 0.0);

}  // namespace ft_test
