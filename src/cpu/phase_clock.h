// Where a CPU kernel's time goes, for tuning: with -DFLASHTILE_PHASE_CLOCK=ON each forward kernel adds up the
// wall time of its phases — the S = Q·Kᵀ product, the softmax step, the P·V product, and the rest (Q tile,
// K/V cache fill, output) — over every tile and thread, and prints the shares when the program exits:
//   PHASES avx512 fp32 forward: qk 39.1% softmax 16.1% pv 42.0% other 2.8% (0.95 s)
// The backward uses the three slots for its five products, the recomputed exponentials and dS (other: the
// conversions and copies of Q, dO, K, V, dK, dV), with its own labels.
// Off by default: then PhaseTimer is empty and the calls compile to nothing.
#pragma once

#include "cpu/isa_namespace.h"

#if FLASHTILE_PHASE_CLOCK
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#endif

namespace flashtile::cpu {
FT_ISA_BEGIN

enum Phase { kPhaseQK, kPhaseSoftmax, kPhasePV, kPhaseCount };

#if FLASHTILE_PHASE_CLOCK
using PhaseClockTime = std::chrono::steady_clock;

struct PhaseTotals {
  const char* name;
  const char* labels[kPhaseCount] = {"qk", "softmax", "pv"};
  std::atomic<std::int64_t> ns[kPhaseCount + 1] = {};  // the phases, then the whole tile
  ~PhaseTotals() {
    const double total = static_cast<double>(ns[kPhaseCount].load());
    if (total <= 0) return;
    double other = total;
    for (int i = 0; i < kPhaseCount; ++i) other -= static_cast<double>(ns[i].load());
    std::fprintf(stderr, "PHASES %s: %s %.1f%% %s %.1f%% %s %.1f%% other %.1f%% (%.2f s)\n", name, labels[0],
                 100.0 * static_cast<double>(ns[kPhaseQK].load()) / total, labels[1],
                 100.0 * static_cast<double>(ns[kPhaseSoftmax].load()) / total, labels[2],
                 100.0 * static_cast<double>(ns[kPhasePV].load()) / total, 100.0 * other / total, total * 1e-9);
  }
};

// Times one query tile: mark(phase) charges the time since the previous mark (or skip) to that phase.
class PhaseTimer {
 public:
  explicit PhaseTimer(PhaseTotals& totals) : totals_(totals), start_(PhaseClockTime::now()), last_(start_) {}
  void skip() { last_ = PhaseClockTime::now(); }
  void mark(Phase phase) {
    const auto now = PhaseClockTime::now();
    ns_[phase] += std::chrono::duration_cast<std::chrono::nanoseconds>(now - last_).count();
    last_ = now;
  }
  ~PhaseTimer() {
    for (int i = 0; i < kPhaseCount; ++i) totals_.ns[i] += ns_[i];
    totals_.ns[kPhaseCount] +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(PhaseClockTime::now() - start_).count();
  }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  PhaseTotals& totals_;
  PhaseClockTime::time_point start_, last_;
  std::int64_t ns_[kPhaseCount] = {};
};
#else
struct PhaseTotals {
  const char* name;
  const char* labels[kPhaseCount] = {};
};
struct PhaseTimer {
  explicit PhaseTimer(PhaseTotals&) {}
  void skip() {}
  void mark(Phase) {}
};
#endif

FT_ISA_END
}  // namespace flashtile::cpu

#define FT_PHASE_STR2(x) #x
#define FT_PHASE_STR(x) FT_PHASE_STR2(x)
