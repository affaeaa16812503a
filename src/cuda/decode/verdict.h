// The eager call's verdict to the host: the index check's result written to pinned host memory (mapped), the
// fields first, a system-wide fence, then the call's ticket the host waits for (decode/host.cpp Readback). CUDA
// sources only.
#pragma once

#include "decode/params.h"

namespace flashtile::cuda::decode {

__device__ inline void publish(const DecodeParams& p, unsigned long long first_bad, int longest) {
  if (p.host_status == nullptr) return;
  p.host_status->first_bad = first_bad;
  p.host_status->longest = longest;
  __threadfence_system();
  *static_cast<volatile unsigned*>(&p.host_status->ticket) = p.ticket;
}

}  // namespace flashtile::cuda::decode
