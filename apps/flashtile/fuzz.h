// `flashtile fuzz`: random calls of the public C++ API (forward, backward, explain_*, make_view) with
// random shapes, layouts, dtypes, options, special values and injected faults. Each call must either
// succeed and agree with the float64 oracle (flashtile::reference) within the tolerance of fuzz_check.h,
// or throw the typed error its fault calls for, leaving every buffer unchanged. Anything else is a
// failure: the seed, the call number and a one-line replay command are printed, and the exit code is 1.
#pragma once

#include <string>
#include <vector>

namespace flashtile::app {

// argv after "fuzz": --calls N --seed S --skip K --max-seqlen N --verbose --buckets. Returns the exit code.
int run_fuzz(const std::vector<std::string>& argv);

}  // namespace flashtile::app
