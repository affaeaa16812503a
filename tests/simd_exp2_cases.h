// simd::exp2 (cpu/simd.h) against exp2_fast (cpu/exp2.h), bit for bit: the SIMD softmaxes and the scalar path must
// round alike. Included by one translation unit per vector ISA (simd_exp2_avx2.cpp, simd_exp2_avx512.cpp), each
// compiled with that ISA's flags and FT_ISA_NS set, as the kernel libraries are; TEST_NAME names its test.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu/simd.h"

namespace {

TEST(SimdExp2, TEST_NAME) {
  if (!__builtin_cpu_supports(TEST_CPU_FEATURE)) GTEST_SKIP() << "this CPU lacks " TEST_CPU_FEATURE;
  using namespace flashtile::cpu;
  constexpr float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  // Ties (k + 0.5, where rounding to even matters), the clamp's edges, the softmax range, and values outside it.
  std::vector<float> xs = {-inf, inf, nan, -nan, -1000.0f, -128.0f, -127.5f, -127.0f, -126.5f, -126.0f, -125.5f, -0.5f,
                           0.5f, 1.5f, 2.5f, 127.0f, 127.5f, 128.0f, 129.0f, 1000.0f, -0.0f, 0.0f};
  for (float x = -130.0f; x <= 130.0f; x += 0.013671875f) xs.push_back(x);
  for (int i = 0; i < 4000; ++i) xs.push_back(-20.0f * static_cast<float>(i) / 4000.0f - 1e-7f * static_cast<float>(i));
  while (xs.size() % simd::W != 0) xs.push_back(0.25f);
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < xs.size(); i += simd::W) {
    alignas(64) float out[simd::W];
    simd::store(out, simd::exp2(simd::load(xs.data() + i)));
    for (int j = 0; j < simd::W; ++j) {
      const float want = exp2_fast(xs[i + j]);
      const bool same = std::isnan(want) ? std::isnan(out[j])
                                         : std::bit_cast<std::uint32_t>(out[j]) == std::bit_cast<std::uint32_t>(want);
      if (!same && ++mismatches <= 5)
        ADD_FAILURE() << "x = " << xs[i + j] << ": simd " << out[j] << ", exp2_fast " << want;
    }
  }
  EXPECT_EQ(mismatches, 0u) << "of " << xs.size() << " values";
}

}  // namespace
