// Runs n independent tasks over a team of threads (OpenMP, dynamic schedule), giving each thread its
// own scratch object. Exceptions from scratch construction or tasks are captured and rethrown on the
// caller's thread after the team joins: nothing escapes a parallel region.
// A team of one (threads <= 1, or a single task) runs on the calling thread without a parallel region, and a team
// is never larger than the tasks: forking and joining costs tens of microseconds where the team's threads sleep
// between regions (OMP_WAIT_POLICY=passive, as beside torch's own OpenMP runtime: ~45 us a region on the 2-vCPU
// EPYC, where a decode step of 64 cached keys computes for ~15 us).
#pragma once

#include "cpu/isa_namespace.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>

namespace flashtile::cpu {
FT_ISA_BEGIN

// The team for a phase that moves `bytes` of memory: the calling thread alone below 256 KiB (a decode step's
// append and merge, a short backward's row sums and dQ reduction), where a fork and join would cost more than the
// work (the comment above); `threads` otherwise.
inline int team_for_bytes(std::int64_t bytes, int threads) { return bytes < 256 * 1024 ? 1 : threads; }

template <class MakeScratch, class Body>
void parallel_tasks(std::int64_t n, int threads, MakeScratch make_scratch, Body body) {
  if (n <= 0) return;
  const int team = static_cast<int>(std::min<std::int64_t>(threads, n));
  if (team <= 1) {
    auto scratch = make_scratch();
    for (std::int64_t t = 0; t < n; ++t) body(scratch, t);
    return;
  }
  std::exception_ptr error;
  std::mutex error_mutex;
  std::atomic<bool> failed{false};
  auto record = [&] {
    std::lock_guard<std::mutex> lock(error_mutex);
    if (!error) error = std::current_exception();
    failed.store(true, std::memory_order_relaxed);
  };
#pragma omp parallel num_threads(team)
  {
    std::optional<decltype(make_scratch())> scratch;
    try {
      scratch.emplace(make_scratch());
    } catch (...) {
      record();
    }
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t t = 0; t < n; ++t) {
      if (!scratch || failed.load(std::memory_order_relaxed)) continue;
      try {
        body(*scratch, t);
      } catch (...) {
        record();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

FT_ISA_END
}  // namespace flashtile::cpu
