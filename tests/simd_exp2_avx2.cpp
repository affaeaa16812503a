// simd_exp2_cases.h in the AVX2 set's flags (tests/CMakeLists.txt).
#define TEST_NAME Avx2MatchesExp2FastBitForBit
#define TEST_CPU_FEATURE "avx2"
#include "simd_exp2_cases.h"
