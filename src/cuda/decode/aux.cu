// The decode path's small kernels: the device-side index check (which also zeroes the split counts). cache_seqlens,
// block_table and cache_batch_idx are device memory: the host cannot read them without a synchronisation (which
// CUDA-graph capture forbids), so the check runs on the device first and the decode kernel, which also appends
// k_new / v_new, does nothing when it found a bad index (the cache stays as it was).
#include <cuda_runtime.h>

#include <cstdint>

#include "core/params.h"
#include "decode/dependent_launch.h"
#include "decode/launch.h"
#include "decode/verdict.h"

namespace flashtile::cuda::decode {
namespace {

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

// The split counts the decode kernel's last split of each group tests (kernel_parts.h merge_splits) start at 0 in
// every call: the check, which runs first in every call, zeroes them (i = begin, begin + step, ...).
__device__ void zero_split_counts(const DecodeParams& p, std::int64_t begin, std::int64_t step) {
  if (p.split_counts == nullptr) return;
  const std::int64_t n = p.a.batch * p.a.heads_kv * p.row_tiles;  // as merge_splits indexes them (params.h split_groups)
  for (std::int64_t i = begin; i < n; i += step) p.split_counts[i] = 0;
}

// A large call's grid-wide check (after a memset of the status): each CTA lowers and raises the shared verdict,
// which the decode kernel's first CTA publishes once this grid has completed (p.decode_publishes). The decode
// kernel may launch at once: it waits for this grid's completion before it reads anything.
__global__ void check_kernel(const __grid_constant__ DecodeParams p) {
  allow_dependents();
  zero_split_counts(p, blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x, std::int64_t{gridDim.x} * blockDim.x);
  check_indices(p, blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x, std::int64_t{gridDim.x} * blockDim.x,
                &p.status->first_bad, &p.status->longest);
}

// A small call's reset and check in one launch of one CTA (a decode step's usual case): the verdict is reduced in
// shared memory, written to the status and published. The append is the decode kernel's (decode/kernel.h).
constexpr int kPrepareThreads = 1024;
__global__ void __launch_bounds__(kPrepareThreads) prepare_kernel(const __grid_constant__ DecodeParams p) {
  __shared__ unsigned long long first_bad;
  __shared__ int longest;
  allow_dependents();  // the decode's CTAs may start launching; they wait for this kernel before reading anything
  if (threadIdx.x == 0) {
    first_bad = ~0ull;
    longest = -1;
  }
  __syncthreads();
  zero_split_counts(p, threadIdx.x, blockDim.x);
  check_indices(p, threadIdx.x, blockDim.x, &first_bad, &longest);
  __syncthreads();
  if (threadIdx.x == 0) {
    p.status->first_bad = first_bad;
    p.status->longest = longest;
    publish(p, first_bad, longest);
  }
}

unsigned blocks_for(std::int64_t n, int threads) {
  const std::int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 4096 ? 4096 : b));
}

}  // namespace

cudaError_t run_check(const DecodeParams& p, cudaStream_t stream) {
  if (check_in_one_cta(p.a)) {
    prepare_kernel<<<1, kPrepareThreads, 0, stream>>>(p);
    return cudaGetLastError();
  }
  cudaError_t e = cudaMemsetAsync(p.status, 0xff, sizeof(Status), stream);  // first_bad = ~0, longest = -1
  if (e != cudaSuccess) return e;
  check_kernel<<<blocks_for(check_count(p.a), 256), 256, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace flashtile::cuda::decode
