// The decode path's small kernels: the device-side index check, the append of k_new / v_new into the cache, and
// the combine of split parts. cache_seqlens, block_table and cache_batch_idx are device memory: the host cannot
// read them without a synchronisation (which CUDA-graph capture forbids), so the check runs on the device first
// and the append and decode kernels do nothing when it found a bad index (the cache stays as it was).
#include <cuda_runtime.h>
#include <cutlass/numeric_types.h>

#include <cstdint>

#include "core/params.h"
#include "decode/dependent_launch.h"
#include "decode/launch.h"
#include "core/merge_rule.h"

namespace flashtile::cuda::decode {
namespace {

using detail::merged_lse;
using detail::part_weight;

// Checks i = begin, begin + step, ... of the (sequence, block-table column) pairs (one per sequence when
// contiguous): the CPU validation's checks (src/core/validate_kvcache.cpp), each failure lowering *first_bad to its
// (sequence, column, code) key, each sequence raising *longest to its L_b. The two counters are global memory (many
// CTAs, reset by a memset) or shared memory (prepare_kernel's one CTA).
__device__ void check_indices(const DecodeParams& p, std::int64_t begin, std::int64_t step,
                              unsigned long long* first_bad, int* longest) {
  const detail::AttnParams& a = p.a;
  const bool paged = a.page_table != nullptr;
  const std::int64_t room = paged ? a.max_pages * a.page_size : a.capacity;
  const std::int64_t cols = paged ? a.max_pages : 1;
  const std::int64_t n = a.batch * cols;
  for (std::int64_t i = begin; i < n; i += step) {
    const std::int64_t b = i / cols, t = i % cols;
    std::int64_t len = a.seqlen_k;  // no cache_seqlens: every sequence fills its cache
    if (a.cache_seqlens != nullptr) {
      const std::int32_t held = a.cache_seqlens[b];
      if (held < 0 || held + a.seqlen_new > room) {
        if (t == 0) atomicMin(first_bad, bad_key(b, 0, held < 0 ? kSeqlenNegative : kSeqlenTooLong));
        continue;
      }
      len = held + a.seqlen_new;
    }
    if (t == 0) atomicMax(longest, static_cast<int>(len));
    if (paged) {
      if (t * a.page_size >= len) continue;  // a column the sequence does not reach is never read
      const std::int32_t page = a.page_table[b * a.page_table_batch_stride + t];
      if (page < 0 || page >= p.num_slots) atomicMin(first_bad, bad_key(b, t, kPageOutOfRange));
    } else if (a.cache_batch_idx != nullptr) {
      const std::int32_t slot = a.cache_batch_idx[b];
      if (slot < 0 || slot >= p.num_slots) atomicMin(first_bad, bad_key(b, 0, kSlotOutOfRange));
    }
  }
}

// 16-byte chunks i = begin, begin + step, ... of the new K and V rows: k_new[b, i, h] goes to key
// cache_seqlens[b] + i of sequence b (kv_row, the one address rule). 16-bit elements, moved as bytes.
__device__ void append_rows(const DecodeParams& p, std::int64_t begin, std::int64_t step) {
  const detail::AttnParams& a = p.a;
  const std::int64_t kc = a.hdim / 8, vc = a.hdim_v / 8, per_row = kc + vc;
  const std::int64_t n = a.batch * a.seqlen_new * a.heads_kv * per_row;
  for (std::int64_t i = begin; i < n; i += step) {
    const std::int64_t c = i % per_row, row = i / per_row;
    const std::int64_t h = row % a.heads_kv, j = row / a.heads_kv % a.seqlen_new, b = row / (a.heads_kv * a.seqlen_new);
    const detail::KvRow at = detail::kv_row(a, b, a.cache_seqlens[b] + j);
    const bool is_k = c < kc;
    const std::int64_t e = (is_k ? c : c - kc) * 8;
    const detail::Strides& ns = is_k ? a.k_new_stride : a.v_new_stride;
    const auto* src = static_cast<const std::uint16_t*>(is_k ? a.k_new : a.v_new) + b * ns.batch + j * ns.row +
                      h * ns.head + e;
    auto* dst = static_cast<std::uint16_t*>(const_cast<void*>(is_k ? a.k : a.v)) + (is_k ? at.k : at.v) +
                h * (is_k ? a.k_stride.head : a.v_stride.head) + e;
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
  }
}

// The verdict to the host's pinned copy (eager calls): the fields, a system-wide fence, then the ticket the host
// waits for.
__device__ void publish(const DecodeParams& p, unsigned long long first_bad, int longest) {
  if (p.host_status == nullptr) return;
  p.host_status->first_bad = first_bad;
  p.host_status->longest = longest;
  __threadfence_system();
  *static_cast<volatile unsigned*>(&p.host_status->ticket) = p.ticket;
}

std::int64_t check_count(const detail::AttnParams& a) {
  return a.batch * (a.page_table != nullptr ? a.max_pages : 1);
}
std::int64_t append_chunks(const detail::AttnParams& a) {
  return a.batch * a.seqlen_new * a.heads_kv * ((a.hdim + a.hdim_v) / 8);
}

__global__ void check_kernel(const __grid_constant__ DecodeParams p) {
  check_indices(p, blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x, std::int64_t{gridDim.x} * blockDim.x,
                &p.status->first_bad, &p.status->longest);
}

// Launched with at least one block (also without new rows): its first thread publishes the grid-wide verdict.
__global__ void append_kernel(const __grid_constant__ DecodeParams p) {
  if (blockIdx.x == 0 && threadIdx.x == 0) publish(p, p.status->first_bad, p.status->longest);
  if (status_bad(*p.status, p.a.seqlen_k)) return;
  append_rows(p, blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x, std::int64_t{gridDim.x} * blockDim.x);
}

// A small call's reset, check and append in one launch of one CTA (a decode step's usual case: a few sequences,
// one new token): the verdict is reduced in shared memory, written to the status, and the append runs after the
// CTA has seen it, so one kernel does what the memset and two kernels do for large calls.
constexpr int kPrepareThreads = 1024;
constexpr std::int64_t kPrepareMaxWork = 16 * kPrepareThreads;  // checks + chunks; beyond it, the grid-wide path
__global__ void __launch_bounds__(kPrepareThreads) prepare_kernel(const __grid_constant__ DecodeParams p) {
  __shared__ unsigned long long first_bad;
  __shared__ int longest;
  allow_dependents();  // the decode's CTAs may start launching; they wait for this kernel before reading anything
  if (threadIdx.x == 0) {
    first_bad = ~0ull;
    longest = -1;
  }
  __syncthreads();
  check_indices(p, threadIdx.x, blockDim.x, &first_bad, &longest);
  __syncthreads();
  if (threadIdx.x == 0) {
    p.status->first_bad = first_bad;
    p.status->longest = longest;
    publish(p, first_bad, longest);
  }
  if (status_bad(Status{first_bad, longest, 0}, p.a.seqlen_k)) return;
  append_rows(p, threadIdx.x, blockDim.x);
}

// One warp per query row (b, h, t): the splits' parts merged as merge_attention_states does.
constexpr int kCombineWarps = 4;
template <class Element>
__global__ void combine_kernel(const __grid_constant__ DecodeParams p) {
  __shared__ float weights[kCombineWarps][kMaxSplits];
  const detail::AttnParams& a = p.a;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int64_t rows = a.batch * a.heads_q * a.seqlen_q;
  const std::int64_t row = blockIdx.x * std::int64_t{kCombineWarps} + warp;
  wait_for_prior_grid();  // the decode kernel's parts
  if (row >= rows) return;
  const std::int64_t t = row % a.seqlen_q, h = row / a.seqlen_q % a.heads_q, b = row / (a.seqlen_q * a.heads_q);
  const int dv = static_cast<int>(a.hdim_v);
  Element* out = static_cast<Element*>(a.out) + b * a.out_stride.batch + t * a.out_stride.row + h * a.out_stride.head;
  float* lse = a.lse != nullptr ? a.lse + b * a.lse_stride.batch + h * a.lse_stride.head + t * a.lse_stride.row
                                : nullptr;
  if (status_bad(*p.status, a.seqlen_k)) {  // nan_on_bad: capturing or async_index_check; else the host refuses
    if (!p.nan_on_bad) return;
    for (int c = lane; c < dv; c += 32) out[c] = Element(NAN);
    if (lane == 0 && lse != nullptr) *lse = NAN;
    return;
  }
  const float l = merged_lse([&](int s) { return p.lse_part[s * rows + row]; }, p.splits);
  for (int s = lane; s < p.splits; s += 32) weights[warp][s] = part_weight(p.lse_part[s * rows + row], l);
  __syncwarp();
  for (int c = lane; c < dv; c += 32) {
    float o = 0.f;
    for (int s = 0; s < p.splits; ++s) o += weights[warp][s] * p.o_part[(s * rows + row) * dv + c];
    out[c] = Element(o);
  }
  if (lane == 0 && lse != nullptr) *lse = l;
}

unsigned blocks_for(std::int64_t n, int threads) {
  const std::int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 4096 ? 4096 : b));
}

}  // namespace

cudaError_t run_check_append(const DecodeParams& p, cudaStream_t stream) {
  const std::int64_t checks = check_count(p.a), chunks = append_chunks(p.a);
  if (checks + chunks <= kPrepareMaxWork) {
    prepare_kernel<<<1, kPrepareThreads, 0, stream>>>(p);
    return cudaGetLastError();
  }
  cudaError_t e = cudaMemsetAsync(p.status, 0xff, sizeof(Status), stream);  // first_bad = ~0, longest = -1
  if (e != cudaSuccess) return e;
  if (checks > 0) {
    check_kernel<<<blocks_for(checks, 256), 256, 0, stream>>>(p);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  append_kernel<<<blocks_for(chunks, 256), 256, 0, stream>>>(p);  // also without new rows: it publishes the verdict
  return cudaGetLastError();
}

cudaError_t run_combine(bool fp16, const DecodeParams& p, cudaStream_t stream) {
  const std::int64_t rows = p.a.batch * p.a.heads_q * p.a.seqlen_q;
  if (rows == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>((rows + kCombineWarps - 1) / kCombineWarps);
  if (fp16) return launch_dependent(combine_kernel<cutlass::half_t>, blocks, kCombineWarps * 32, 0, stream, p);
  return launch_dependent(combine_kernel<cutlass::bfloat16_t>, blocks, kCombineWarps * 32, 0, stream, p);
}

}  // namespace flashtile::cuda::decode
