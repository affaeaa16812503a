// Run-time choice of the CPU kernel set. One binary carries a scalar (baseline x86-64 / any CPU), an
// AVX2+FMA and an AVX-512 build of the same kernels, plus an AVX-512 build whose bf16 forward, backward and
// many-row decode run on AVX512_BF16 dot products; the best one this CPU executes is used unless FLASHTILE_CPU_ISA forces another
// (tests force each path in turn). A further AVX-512 build runs bf16 forwards and backwards on AMX tiles where
// the CPU has AMX-BF16 and the kernel grants the tile state. avx2-bf16emu and avx2-amxemu (test-only emulations)
// are never chosen by themselves; avx512-bf16 only on AMD CPUs, where its dot products pay (see kSets and
// bf16_dots_pay).
#include <cstdlib>
#include <string>
#include <vector>

#include "cpu/decode_plan.h"
#include "cpu/kernels.h"
#include "flashtile/errors.h"

#if defined(_OPENMP)
#include <omp.h>
#endif
#include <thread>

#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace flashtile::cpu {
namespace {

// Linux gives a process the AMX tile registers only after it asks (arch_prctl ARCH_REQ_XCOMP_PERM for
// XTILEDATA); without that the first tile instruction raises SIGILL. Asked once; the grant is process-wide.
bool amx_granted() {
#if defined(__linux__) && defined(__x86_64__)
  static const bool granted = [] {
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return granted;
#else
  return false;
#endif
}

// Whether vdpbf16ps beats float32 FMAs on converted tiles: by vendor, as measured on four machines (figures at
// kSets' avx512-bf16 entry): twice their rate on AMD's Zen 4/5 EPYCs, half on Intel's Xeons with AMX and without.
// A rule from the vendor rather than a timing at start-up, so a machine always takes the same path (and rounding).
bool bf16_dots_pay() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_is("amd");
#else
  return false;
#endif
}

bool never() { return false; }
bool always() { return true; }

bool cpu_has(std::string_view isa) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (isa == "avx2") return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (isa == "avx2-bf16emu") return cpu_has("avx2");
  if (isa == "avx512")
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("fma");
  if (isa == "avx512-bf16") return cpu_has("avx512") && __builtin_cpu_supports("avx512bf16");
  if (isa == "avx512-amx")
    return cpu_has("avx512-bf16") && __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16") &&
           amx_granted();
  if (isa == "avx2-amxemu") return cpu_has("avx2");
#endif
  return isa == "scalar";
}

const KernelSet kSets[] = {
    {"scalar", &scalar::forward, &scalar::backward, &scalar::decode},
#if FLASHTILE_CPU_X86_ISAS
    {"avx2", &avx2::forward, &avx2::backward, &avx2::decode},
    // bf16 inputs on emulated pair products: slower than avx2, for the tests only.
    {"avx2-bf16emu", &avx2_bf16emu::forward, &avx2_bf16emu::backward, &avx2_bf16emu::decode, &never,
     &default_forward_tiles, "bf16 dot-product pairs, emulated on FMAs"},
    // bf16 inputs on emulated AMX tiles: much slower than avx2, for the tests only.
    {"avx2-amxemu", &avx2_amxemu::forward, &avx2_amxemu::backward, &avx2_amxemu::decode, &never, &amx_forward_tiles,
     "AMX tiles, emulated"},
    {"avx512", &avx512::forward, &avx512::backward, &avx512::decode, &always, &avx512_forward_tiles},
    // bf16 forward, backward and many-row decode on vdpbf16ps. Automatic only on AMD CPUs (bf16_dots_pay): on the
    // Xeon (Sapphire Rapids class) of the GPU machine vdpbf16ps peaked at 85 GFLOP/s per core against 171 for
    // float32 FMAs (bench/fma_peak.cpp) and this set's bf16 forward ran at half the float32 kernels' speed
    // (bench/results/cpu.md); on the AMD EPYC (Zen 4 class, no AMX) of 2026-12-02 vdpbf16ps peaked
    // at 227 against 113 and the forward ran 1.8-2.1x the float32 kernels on converted tiles, 304-325 GFLOP/s on 2
    // cores (bench/results/cpu_epyc_1202.md); on the AVX-512 EPYC of 2026-12-04 the backward ran 1.28-1.62x
    // (cpu_epyc512_1204_pairs_bwd.md); on a Xeon with AVX512_BF16 and no AMX (2026-12-05) vdpbf16ps peaked at 86
    // against 170 and the set ran the same bf16 calls at half avx512's speed (forward 149-158 against 270-286
    // GFLOP/s on 2 cores, Sq = 16 decode 1.6x slower; cpu_xeonvm_noamx_1205.md). Elsewhere bf16 inputs take
    // avx512's float32 kernels on tiles converted once per head; FLASHTILE_CPU_ISA=avx512-bf16 selects it.
    {"avx512-bf16", &avx512_bf16::forward, &avx512_bf16::backward, &avx512_bf16::decode, &bf16_dots_pay,
     &avx512_bf16_forward_tiles, "vdpbf16ps pairs", true},
    // bf16 forward, backward and many-row decode (speculative decoding) on AMX tiles (tdpbf16ps); float32/float16
    // as avx512.
    {"avx512-amx", &avx512_amx::forward, &avx512_amx::backward, &avx512_amx::decode, &always,
     &avx512_amx_forward_tiles, "AMX tiles (tdpbf16ps)"},
#endif
};

}  // namespace

std::vector<std::string_view> runnable_isas() {
  std::vector<std::string_view> out;
  for (const KernelSet& k : kSets)
    if (cpu_has(k.isa)) out.push_back(k.isa);
  return out;
}

const KernelSet& select_kernels() {
  const char* forced = std::getenv("FLASHTILE_CPU_ISA");
  if (forced != nullptr && *forced != '\0') {
    for (const KernelSet& k : kSets) {
      if (k.isa != forced) continue;
      if (!cpu_has(k.isa))
        throw UnsupportedError(std::string("FLASHTILE_CPU_ISA=") + forced + ": this CPU cannot execute that path");
      return k;
    }
    std::string known;
    for (const KernelSet& k : kSets) known += (known.empty() ? "" : ", ") + std::string(k.isa);
    throw InvalidArgument(std::string("FLASHTILE_CPU_ISA=") + forced + ": unknown ISA path; this build has " + known);
  }
  const KernelSet* best = &kSets[0];
  for (const KernelSet& k : kSets)
    if (cpu_has(k.isa) && k.chosen_by_itself()) best = &k;
  return *best;
}

ForwardKernel forward_kernel_choice() {
  const char* forced = std::getenv("FLASHTILE_CPU_FORWARD");
  if (forced == nullptr || *forced == '\0') return ForwardKernel::automatic;
  const std::string_view v(forced);
  if (v == "tiles") return ForwardKernel::tiles;
  if (v == "decode") return ForwardKernel::decode;
  throw InvalidArgument(std::string("FLASHTILE_CPU_FORWARD=") + forced + ": unknown forward kernel; tiles or decode");
}

int resolve_threads(int num_threads) {
  if (num_threads > 0) return num_threads;
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  const unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
#endif
}

}  // namespace flashtile::cpu
