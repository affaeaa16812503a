// Heap probe for tests and the CLI: replaces the global operator new/delete of the executable that links
// it and counts live bytes. Every heap allocation in the process is seen, the library's included (its
// scratch, std::vector buffers), so "peak extra memory" of a call is measured rather than estimated.
#pragma once

#include <cstdint>

namespace flashtile::probe {

// Bytes currently live through operator new.
std::int64_t live_bytes();
// Starts a measurement window: the peak is reset to the current live bytes.
void reset_peak();
// Highest live bytes since reset_peak(), minus the live bytes at reset: the extra memory of the window.
std::int64_t peak_extra_bytes();

}  // namespace flashtile::probe
