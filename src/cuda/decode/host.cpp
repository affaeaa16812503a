// See host.h.
#include "decode/host.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <sstream>
#include <vector>

#include "flashtile/errors.h"
#include "kernel_switch.h"
#include "checks.h"
#include "decode/launch.h"
#include "runtime/runtime.h"

namespace flashtile::cuda::decode {
namespace {

using detail::AttnParams;

// One value of device memory at src, for a refusal's message: waits for the stream (the decode kernels queued
// behind the check do nothing on a bad verdict, so this wait is the error path's only).
template <class T>
T read_device(const T* src, cudaStream_t stream, const char* backend) {
  T v{};
  check(cudaMemcpyAsync(&v, src, sizeof(T), cudaMemcpyDeviceToHost, stream), backend, "cudaMemcpyAsync (kvcache index)");
  check(cudaStreamSynchronize(stream), backend, "cudaStreamSynchronize (kvcache index)");
  return v;
}

// The CPU validation's message (src/core/validate_kvcache.cpp) for the check kernel's first bad index.
[[noreturn]] void refuse(const AttnParams& p, const Status& s, cudaStream_t stream, const char* backend) {
  std::ostringstream m;
  if (s.first_bad == ~0ull) {
    m << "max_seqlen_k: " << p.seqlen_k << " is smaller than the longest sequence's " << s.longest
      << " keys (cache_seqlens + Snew)";
    throw InvalidArgument(m.str());
  }
  const auto b = static_cast<std::int64_t>(s.first_bad >> 35);
  const auto t = static_cast<std::int64_t>(s.first_bad >> 3 & 0xffffffffull);
  const auto code = static_cast<unsigned>(s.first_bad & 7);
  const bool paged = p.page_table != nullptr;
  auto seqlen = [&] { return read_device(p.cache_seqlens + b, stream, backend); };
  switch (code) {
    case kSeqlenNegative:
      m << "cache_seqlens: cache_seqlens[" << b << "] = " << seqlen() << " is negative";
      break;
    case kSeqlenTooLong:
      m << "cache_seqlens: cache_seqlens[" << b << "] = " << seqlen() << " plus " << p.seqlen_new
        << " new keys exceeds the " << (paged ? p.max_pages * p.page_size : p.capacity) << " rows "
        << (paged ? "of block_table's pages (max_pages · page_size)" : "of the cache (capacity)");
      break;
    case kPageOutOfRange: {
      const std::int64_t len = p.cache_seqlens != nullptr ? seqlen() + p.seqlen_new : p.seqlen_k;
      m << "block_table: block_table[" << b << "][" << t << "] = "
        << read_device(p.page_table + b * p.page_table_batch_stride + t, stream, backend)
        << " is outside [0, num_pages) (sequence " << b << " holds " << len << " keys)";
      break;
    }
    default:
      m << "cache_batch_idx: cache_batch_idx[" << b << "] = " << read_device(p.cache_batch_idx + b, stream, backend)
        << " is outside [0, slots) (the cache's batch)";
  }
  throw InvalidArgument(m.str());
}

// The eager call's read-back of the verdict: pinned host memory mapped into the device's address space, which the
// prepare (or append) kernel writes with the call's ticket. The host waits for the ticket, not for a stream
// operation, so nothing sits between the check and the decode on the stream and the decode runs on while the host
// reads the verdict. One per thread and device (a thread waits on one call at a time), made on the thread's first
// call and freed when it exits.
struct Readback {
  Status* host = nullptr;
  Status* device = nullptr;  // the same memory, as the kernels address it
  unsigned ticket = 0;       // the last call's number
  Readback() = default;
  Readback(const Readback&) = delete;
  Readback& operator=(const Readback&) = delete;
  ~Readback() {
    if (host != nullptr) (void)cudaFreeHost(host);
  }
};

Readback& readback(int device, const char* backend) {
  thread_local std::vector<std::unique_ptr<Readback>> slots;  // by device index
  if (slots.size() <= static_cast<std::size_t>(device)) slots.resize(static_cast<std::size_t>(device) + 1);
  auto& r = slots[static_cast<std::size_t>(device)];
  if (r == nullptr) {
    auto made = std::make_unique<Readback>();
    check(cudaHostAlloc(reinterpret_cast<void**>(&made->host), sizeof(Status), cudaHostAllocMapped), backend,
          "cudaHostAlloc (kvcache index check)");
    made->host->ticket = 0;
    check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&made->device), made->host, 0), backend,
          "cudaHostGetDevicePointer (kvcache index check)");
    r = std::move(made);
  }
  return *r;
}

// Waits until the kernels published call `ticket`'s verdict. The stream is asked now and then, so that a failed
// launch or a faulting kernel before it surfaces as an error instead of a wait without end.
Status wait_verdict(const Readback& r, unsigned ticket, cudaStream_t stream, const char* backend) {
  const volatile Status* seen = r.host;
  for (unsigned spins = 1; seen->ticket != ticket; ++spins) {
    if (spins % 256 != 0) continue;
    const cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaErrorNotReady) continue;
    check(e, backend, "cudaStreamQuery (kvcache index check)");
    if (seen->ticket != ticket) throw BackendError(std::string(backend) + ": the kvcache index check's verdict never "
                                                   "arrived (the stream completed without it)");
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  return Status{seen->first_bad, seen->longest, ticket};
}

}  // namespace

std::string Plan::reason() const {
  if (given) return "num_splits as given";
  using std::to_string;
  std::string s = "auto: " + to_string(ctas) + " CTAs (B·Hkv·row_tiles) on " + to_string(sms) + " SMs";
  if (sm_margin > 0) s += " (the device's less sm_margin = " + to_string(sm_margin) + ")";
  s += " x " + to_string(per_sm) +
       " per wave; the fewest splits within 95 % of the best wave efficiency, at most one per 4 key tiles (256 keys)"
       " of the seqlen_k bound";
  return s;
}

// FlashAttention's split heuristic: the wave efficiency of s splits is waves / ceil(waves) with waves = ctas · s /
// (SMs · CTAs per SM); the fewest splits reaching 95 % of the best efficiency win (a partial last wave leaves SMs
// idle, more splits cost a larger merge). A wave counts one 16-row CTA per SM: one such CTA draws its SM's share
// of the memory bandwidth alone, so a second on the same SM adds nothing and SMs holding two finish last. Measured
// on the H200 (bench/results/h200-decode-ab.md, 2026-12-04): batch 8, 32k keys, 2 splits (128 CTAs) as fast as 4;
// batch 1, 32k keys, 16 splits (128 CTAs) 37.7 us against 39.0 us for 29 (232 CTAs, 100 SMs holding two). The
// 64-row CTAs (Sq x G > 16) do more arithmetic per byte and need two per SM: at batch 8, Sq = 16, 2 splits took
// 461 us against 329 us for 4.
Plan plan(const AttnParams& p) {
  Plan d;
  d.bucket = decode_bucket(std::max(p.hdim, p.hdim_v));
  const std::int64_t rows = p.group() * p.seqlen_q;
  d.rows_per_tile = rows_per_tile(rows);
  d.row_tiles = static_cast<int>((rows + d.rows_per_tile - 1) / d.rows_per_tile);
  d.ctas = p.batch * p.heads_kv * d.row_tiles;
  d.sm_margin = p.sm_margin;
  const Gpu* g = gpu(p.device_index);
  d.sms = g != nullptr ? call_sms(p) : 0;
  const int smem = d.bucket > 0 ? decode_smem_bytes(d.bucket, d.rows_per_tile) : 1;
  d.per_sm = d.rows_per_tile == kRowsPerTile ? 1 : std::clamp(g != nullptr ? g->smem_optin / smem : 1, 1, 4);
  if (p.num_splits > 0) {
    d.given = true;
    d.splits = p.num_splits;
    return d;
  }
  const std::int64_t tiles = (p.seqlen_k + kBlockN - 1) / kBlockN;
  const int most = static_cast<int>(std::clamp<std::int64_t>(tiles / 4, 1, kMaxSplits));
  const double slots = static_cast<double>(std::max(d.sms, 1) * d.per_sm);
  auto efficiency = [&](int s) {
    const double waves = static_cast<double>(d.ctas * s) / slots;
    return waves / std::ceil(waves);
  };
  double best = 0.0;
  for (int s = 1; s <= most; ++s) best = std::max(best, efficiency(s));
  d.splits = 1;
  while (d.splits < most && efficiency(d.splits) < 0.95 * best) ++d.splits;
  if (d.ctas == 0) d.splits = 1;
  return d;
}

void can_run(const AttnParams& p, DecodeMma mma, int smem_optin, detail::Reasons& why) {
  const std::int64_t dmax = std::max(p.hdim, p.hdim_v);
  const int bucket = decode_bucket(dmax);
  if (bucket == 0) {
    why.push_back("KV cache: head dim " + std::to_string(dmax) + " > 128 has no decode kernel (buckets 64, 128)");
    return;
  }
  const Elem e = elem_of(p.dtype);
  const bool wgmma = mma == DecodeMma::wgmma;
  if (p.dtype != DType::float32 && !(wgmma ? sm90_decode_built(e, bucket) : decode_built(e, bucket)))
    why.push_back(std::string("KV cache: ") + (wgmma ? "wgmma" : "mma.sync") + " decode kernel not built in this build: " +
                  elem_name(e) + " hdim " + std::to_string(bucket) + " (built: " +
                  (wgmma ? sm90_decode_built_kernels() : decode_built_kernels()) + ")");
  const int smem = decode_smem_bytes(bucket, rows_per_tile(p.group() * p.seqlen_q));
  if (smem > smem_optin)
    why.push_back("shared memory: the hdim " + std::to_string(bucket) + " decode kernel needs " +
                  std::to_string(smem) + " bytes per block, the GPU allows " + std::to_string(smem_optin));
  if (p.num_splits > kMaxSplits)
    why.push_back("num_splits = " + std::to_string(p.num_splits) + " > " + std::to_string(kMaxSplits) +
                  " (the split merge's limit)");
}

void describe(const AttnParams& p, DecodeMma mma, KernelInfo& k) {
  const Plan d = plan(p);
  const Elem e = elem_of(p.dtype);
  const bool wgmma = mma == DecodeMma::wgmma;
  k.kernel = std::string(wgmma ? "sm90_decode_" : "sm80_decode_") + elem_name(e) + "_hdim" +
             std::to_string(d.bucket) + "_" + kind_name(kind_of(p));
  if (wgmma) k.isa = "sm_90a wgmma + cp.async";
  k.block_q = d.rows_per_tile;
  k.block_k = kBlockN;
  k.threads = wgmma ? kWgmmaThreads : kThreads;
  k.splits = d.splits;
  // Appended to one reserved string rather than streamed: the text is built on every call (after the launches).
  using std::to_string;
  const bool rows16 = d.rows_per_tile == kRowsPerTile;
  std::string& s = k.detail;
  s.reserve(640);
  s = "decode: rows_per_tile=";  // into the reserved buffer (assigning a temporary would move its own in)
  s += to_string(d.rows_per_tile);
  s += " (G·Sq = " + to_string(p.group() * p.seqlen_q) + " packed rows, " + to_string(d.row_tiles) +
       " row tiles per KV head; ";
  s += rows16 ? "16 rows while they fit" : "over 16 rows: 64";
  s += ") keys_per_tile=" + to_string(kBlockN);
  s += rows16  ? " (4 warps x 16 keys, merged at the end)"
       : wgmma ? " (1 warpgroup: wgmma reads each K and V tile once; a producer warp fills the ring)"
               : " (4 warps x 16 rows)";
  s += " stages=" + to_string(decode_stages(d.bucket, d.rows_per_tile)) + " (cp.async ring, K and V) smem=" +
       to_string(decode_smem_bytes(d.bucket, d.rows_per_tile));
  s += "B splits=" + to_string(d.splits) + " (" + d.reason() + ")";
  if (d.splits > 1) s += " merged by each row tile's last split CTA";
  s += p.page_table != nullptr ? " paged: page_size=" + to_string(p.page_size) : std::string(" contiguous");
  s += " index check: device-side, ";
  s += check_in_one_cta(p) ? "one CTA" : "grid-wide";
  s += " (" + to_string(check_count(p)) + " entries), ";
  s += p.async_index_check ? "not waited for (async_index_check)"
                           : "its verdict waited for (pinned memory) when the stream is not capturing";
  s += "; append: by the decode kernel";
}

std::size_t workspace_bytes_of(const AttnParams& p) { return workspace_bytes(p, plan(p).splits); }

void run(const AttnParams& p, DecodeMma mma, const char* backend) {
  cudaStream_t stream = static_cast<cudaStream_t>(p.cuda_stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream, &capture), backend, "cudaStreamIsCapturing");
  const Plan d = plan(p);
  DecodeParams k;
  fill_params(p, k);
  k.splits = d.splits;
  k.row_tiles = std::max(d.row_tiles, 1);  // a call without query rows still appends
  k.rows_per_tile = d.rows_per_tile;
  k.num_slots = p.cache_slots;
  k.nan_on_bad = capture != cudaStreamCaptureStatusNone || p.async_index_check;
  const WorkspaceParts parts = workspace_parts(p, d.splits);
  Workspace ws(p, parts.bytes, stream, backend);
  char* base = ws.data();
  k.status = reinterpret_cast<Status*>(base);
  if (d.splits > 1) {
    k.split_counts = reinterpret_cast<int*>(base + parts.counts);
    k.o_part = reinterpret_cast<float*>(base + parts.o_part);
    k.lse_part = reinterpret_cast<float*>(base + parts.lse_part);
  }
  // Reset and index check, then the decode (which appends and merges the splits), launched as soon as the check
  // allows (compute capability >= 9.0). Eager, the host then waits for the verdict alone (published to pinned memory
  // by the check's one CTA, or by the decode's first CTA after a grid-wide check) while the decode runs; the decode
  // kernels do nothing on a bad verdict, so a refusal thrown after they were queued still leaves everything unchanged.
  Readback* rb = nullptr;
  if (!k.nan_on_bad) {
    rb = &readback(p.device_index, backend);
    k.host_status = rb->device;
    k.ticket = ++rb->ticket;
  }
  const Gpu* g = gpu(p.device_index);
  k.dependent_launch = g != nullptr && g->major >= 9;
  k.decode_publishes = !check_in_one_cta(p);
  check(run_check(k, stream), backend, "kvcache index check launch");
  check(launch_kvcache(elem_of(p.dtype), d.bucket, kind_of(p), mma, k, stream), backend, "kvcache kernels launch");
  if (rb != nullptr) {
    const Status s = wait_verdict(*rb, k.ticket, stream, backend);
    if (status_bad(s, p.seqlen_k)) refuse(p, s, stream, backend);
  }
  ws.release();
}

}  // namespace flashtile::cuda::decode
