// forward_kvcache on the host side (backend.cpp and backend_sm90.cpp call these, each with its kernel: mma.sync or
// wgmma): the split plan, the workspace, the launches and the read-back of the device-side index check.
#pragma once

#include <cstddef>
#include <string>

#include "core/backend.h"
#include "decode/params.h"

namespace flashtile::cuda::decode {

struct Plan {
  int bucket = 0;         // decode head-dim bucket
  int rows_per_tile = 16; // params.h rows_per_tile(G · Sq)
  int row_tiles = 0;      // tiles of packed rows (G · Sq) per KV head
  int splits = 1;
  std::int64_t ctas = 0;  // B · Hkv · row_tiles (before splitting)
  int sms = 0;            // SMs the plan spreads the CTAs over (runtime.h call_sms)
  int sm_margin = 0;      // Options::sm_margin, for the report
  int per_sm = 1;         // CTAs per SM that one wave counts (host.cpp plan)
  bool given = false;     // num_splits came from the caller
  std::string reason() const;
};

// The split count from host-known sizes only (B, Hkv, G · Sq, the SM count and seqlen_k, which is max_seqlen_k
// when given, else the cache's bound): no read of cache_seqlens, so a CUDA graph may capture the call.
Plan plan(const detail::AttnParams& p);

// Reasons the decode kernel `mma` cannot run this forward_kvcache call (appended to why).
void can_run(const detail::AttnParams& p, DecodeMma mma, int smem_optin, detail::Reasons& why);

// Dispatch report fields: kernel name and detail text.
void describe(const detail::AttnParams& p, DecodeMma mma, KernelInfo& k);

std::size_t workspace_bytes_of(const detail::AttnParams& p);

// Runs the call on p's stream. Not capturing: reads the index check's verdict back (one 16-byte copy and a stream
// synchronisation) and throws the CPU validation's typed error on a bad index (cache, out and lse unchanged).
// Capturing: no read-back; a bad index leaves the cache unchanged and NaN in out and lse.
void run(const detail::AttnParams& p, DecodeMma mma, const char* backend);

}  // namespace flashtile::cuda::decode
