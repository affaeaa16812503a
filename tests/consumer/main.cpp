// Runs one small causal forward with GQA on the CPU through the installed FlashTile and checks it against a
// naive float64 computation written here (not the library's oracle, so the check does not share its code).
// Exit status 0 when every output and LSE value is within the tolerance, 1 otherwise.
#include <flashtile/flashtile.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

int main() {
  using namespace flashtile;
  constexpr std::int64_t B = 2, Sq = 37, Sk = 45, Hq = 4, Hkv = 2, D = 16;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<float> q(B * Sq * Hq * D), k(B * Sk * Hkv * D), v(B * Sk * Hkv * D);
  std::vector<float> out(B * Sq * Hq * D), lse(B * Hq * Sq);
  std::uint32_t state = 12345;  // fixed inputs in [-1, 1): the check must not depend on chance
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / static_cast<float>(1u << 23) - 1.0f;
  };
  for (auto* t : {&q, &k, &v})
    for (float& x : *t) x = next();

  Options o;
  o.causal = true;
  const DispatchReport rep = forward(make_view(q.data(), DType::float32, {B, Sq, Hq, D}),
                                     make_view(k.data(), DType::float32, {B, Sk, Hkv, D}),
                                     make_view(v.data(), DType::float32, {B, Sk, Hkv, D}),
                                     make_view(out.data(), DType::float32, {B, Sq, Hq, D}),
                                     make_view(lse.data(), DType::float32, {B, Hq, Sq}), o);
  std::printf("%s\n", rep.to_string().c_str());

  // |q|, |k|, |v| < 1 and D = 16: |s| <= 4, each output a convex combination of v rows (|o| < 1). float32
  // rounding in the D-term dot products, the exps and the Sk-term sums costs a few times (D + Sk) * 2^-24
  // ~ 4e-6 relative; 1e-4 leaves a 25x margin and still catches any wrong mask, scale or head mapping
  // (those change values by O(0.1)).
  const double tol = 1e-4;
  double max_err = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < Hq; ++h) {
      const std::int64_t hk = h / (Hq / Hkv);
      for (std::int64_t i = 0; i < Sq; ++i) {
        const std::int64_t last = i + Sk - Sq;  // causal, bottom-right aligned
        std::vector<double> s(static_cast<std::size_t>(last + 1));
        double m = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j <= last; ++j) {
          double dot = 0;
          for (std::int64_t d = 0; d < D; ++d)
            dot += double(q[((b * Sq + i) * Hq + h) * D + d]) * double(k[((b * Sk + j) * Hkv + hk) * D + d]);
          s[static_cast<std::size_t>(j)] = dot * scale;
          m = std::max(m, dot * scale);
        }
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - m));
        for (std::int64_t d = 0; d < D; ++d) {
          double o_ref = 0;
          for (std::int64_t j = 0; j <= last; ++j)
            o_ref += s[static_cast<std::size_t>(j)] * double(v[((b * Sk + j) * Hkv + hk) * D + d]);
          o_ref /= sum;
          max_err = std::max(max_err, std::abs(o_ref - double(out[((b * Sq + i) * Hq + h) * D + d])));
        }
        max_err = std::max(max_err, std::abs(m + std::log(sum) - double(lse[(b * Hq + h) * Sq + i])));
      }
    }
  const bool ok = max_err <= tol;  // false for NaN too
  std::printf("consumer: max |FlashTile - naive float64| = %.3g (tolerance %.0e): %s\n", max_err, tol,
              ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
