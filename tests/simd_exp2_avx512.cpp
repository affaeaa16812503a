// simd_exp2_cases.h in the AVX-512 set's flags (tests/CMakeLists.txt).
#define TEST_NAME Avx512MatchesExp2FastBitForBit
#define TEST_CPU_FEATURE "avx512f"
#include "simd_exp2_cases.h"
