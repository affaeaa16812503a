// Internal entry points of the float64 oracle, on validated params (used by the cpu-reference backend
// and by the public flashtile::reference functions).
#pragma once

#include <cstdint>
#include <vector>

#include "core/params.h"
#include "flashtile/reference.h"

namespace flashtile::cpu {

reference::ForwardResult reference_forward(const detail::AttnParams& p, const std::vector<std::int64_t>& rows);
reference::BackwardResult reference_backward(const detail::AttnParams& p);

}  // namespace flashtile::cpu
