// Timing, memory and accuracy measurements shared by the CLI commands.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <string>
#include <vector>

#include "flashtile/flashtile.h"
#include "probe/alloc_probe.h"

namespace flashtile::app {

struct Run {
  double seconds = 0;          // median over iterations
  std::int64_t peak_extra = 0;  // heap bytes above the inputs and outputs, max over iterations
};

// Runs f `iters` times (after `warmup` untimed runs) and returns the median time and the peak extra heap.
template <class F>
Run measure(F&& f, int iters, int warmup, const char* label) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> t;
  Run r;
  for (int i = 0; i < iters; ++i) {
    probe::reset_peak();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    r.peak_extra = std::max(r.peak_extra, probe::peak_extra_bytes());
    if (iters > 1 && t.back() > 0.5) std::fprintf(stderr, "  %s: run %d/%d %.3f s\n", label, i + 1, iters, t.back());
  }
  std::sort(t.begin(), t.end());
  r.seconds = t[t.size() / 2];
  return r;
}

std::string bytes_str(std::int64_t b);

// Sampled query rows: the first, the last and `n` spread between them.
std::vector<std::int64_t> sample_rows(std::int64_t sq, std::int64_t n);

struct Accuracy {
  double max_abs = 0, rel = 0;  // max |x - ref| and ||x - ref||_2 / ||ref||_2 over the sampled rows
};

// `out` is a contiguous [B, Sq, Hq, Dv] float array; `ref` holds [B, rows, Hq, Dv] for the sampled rows.
Accuracy compare_rows(const std::vector<float>& out, const reference::ForwardResult& ref, std::int64_t batch,
                      std::int64_t sq, std::int64_t heads, std::int64_t dv);

}  // namespace flashtile::app
