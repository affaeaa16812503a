// The shape sweep shared by the forward and backward tests: every head dim from 8 to 256 in steps of 8,
// Dv != D, every listed sequence length with Sq != Sk both ways, GQA ratios 1, 2, 8, causal and not,
// all three dtypes and three memory layouts. Shapes are fixed (stable test names); data is fresh per run.
#pragma once

#include <vector>

#include "support.h"

namespace ft_test {

inline std::vector<Case> sweep_cases() {
  std::vector<Case> cases;
  const DType dtypes[] = {DType::float32, DType::float16, DType::bfloat16};
  const Layout layouts[] = {Layout::contiguous, Layout::heads_major, Layout::padded};
  const std::int64_t short_lens[] = {1, 2, 17, 63, 64, 65, 127};
  const std::int64_t ratios[] = {1, 2, 8};
  int n = 0;
  // Head dims 8..256.
  for (std::int64_t d = 8; d <= 256; d += 8, ++n) {
    Case c;
    c.d = c.dv = d;
    c.sq = short_lens[n % 7];
    c.sk = short_lens[(n * 3 + 2) % 7];
    c.hkv = 1 + n % 2;
    c.hq = c.hkv * ratios[n % 3];
    c.b = 1 + (n / 3) % 2;
    c.causal = n % 2 == 1;
    c.dtype = dtypes[n % 3];
    c.layout = layouts[(n / 2) % 3];
    cases.push_back(c);
  }
  // Dv != D.
  const std::int64_t dv_pairs[][2] = {{64, 32}, {32, 64}, {128, 256}, {256, 8}, {40, 72}, {8, 200}};
  for (const auto& pr : dv_pairs) {
    for (bool causal : {false, true}) {
      Case c;
      c.d = pr[0];
      c.dv = pr[1];
      c.sq = 65;
      c.sk = 130;
      c.hq = 4;
      c.hkv = 2;
      c.causal = causal;
      c.dtype = dtypes[n % 3];
      c.layout = layouts[n % 3];
      ++n;
      cases.push_back(c);
    }
  }
  // Sequence lengths, Sq = Sk and Sq != Sk both ways, causal and not.
  const std::int64_t lens[][2] = {{1, 1},     {2, 2},   {17, 17}, {63, 63},  {64, 64},   {65, 65},
                                  {127, 127}, {1000, 1000}, {1, 1000}, {1000, 1}, {17, 129}, {129, 17},
                                  {64, 200},  {200, 64}, {65, 63}, {300, 7}};
  for (const auto& ln : lens) {
    for (bool causal : {false, true}) {
      Case c;
      c.sq = ln[0];
      c.sk = ln[1];
      const bool big = c.sq * c.sk > 100000;
      c.d = c.dv = big ? 64 : 96;
      c.hkv = big ? 1 : 2;
      c.hq = c.hkv * (big ? 2 : ratios[n % 3]);
      c.causal = causal;
      c.dtype = dtypes[n % 3];
      c.layout = layouts[(n + 1) % 3];
      ++n;
      cases.push_back(c);
    }
  }
  return cases;
}

}  // namespace ft_test
