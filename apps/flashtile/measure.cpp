#include "measure.h"

#include <cmath>
#include <cstdio>
#include <set>

namespace flashtile::app {

std::string bytes_str(std::int64_t b) {
  char buf[64];
  const double x = static_cast<double>(b);
  if (b >= (1 << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", x / (1 << 30));
  else if (b >= (1 << 20)) std::snprintf(buf, sizeof buf, "%.1f MiB", x / (1 << 20));
  else std::snprintf(buf, sizeof buf, "%.1f KiB", x / 1024);
  return buf;
}

std::vector<std::int64_t> sample_rows(std::int64_t sq, std::int64_t n) {
  std::set<std::int64_t> rows;
  if (sq <= 0) return {};
  rows.insert(0);
  rows.insert(sq - 1);
  for (std::int64_t i = 1; i <= n; ++i) rows.insert(i * (sq - 1) / (n + 1));
  return {rows.begin(), rows.end()};
}

Accuracy compare_rows(const std::vector<float>& out, const reference::ForwardResult& ref, std::int64_t batch,
                      std::int64_t sq, std::int64_t heads, std::int64_t dv) {
  Accuracy a;
  double num = 0, den = 0;
  const auto nr = static_cast<std::int64_t>(ref.rows.size());
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t r = 0; r < nr; ++r)
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t c = 0; c < dv; ++c) {
          const double want = ref.out[static_cast<std::size_t>(((b * nr + r) * heads + h) * dv + c)];
          const double got = out[static_cast<std::size_t>(((b * sq + ref.rows[static_cast<std::size_t>(r)]) * heads + h) * dv + c)];
          const double e = std::abs(got - want);
          a.max_abs = std::isnan(e) ? INFINITY : std::max(a.max_abs, e);
          num += e * e;
          den += want * want;
        }
  a.rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return a;
}

}  // namespace flashtile::app
