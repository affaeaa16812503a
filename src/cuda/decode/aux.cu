// The decode path's small kernels: the device-side index check and the combine of split parts. cache_seqlens,
// block_table and cache_batch_idx are device memory: the host cannot read them without a synchronisation (which
// CUDA-graph capture forbids), so the check runs on the device first and the decode kernel, which also appends
// k_new / v_new, does nothing when it found a bad index (the cache stays as it was).
#include <cuda_runtime.h>
#include <cutlass/numeric_types.h>

#include <cstdint>

#include "core/merge_rule.h"
#include "core/params.h"
#include "decode/dependent_launch.h"
#include "decode/launch.h"
#include "decode/verdict.h"

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

// A large call's grid-wide check (after a memset of the status): each CTA lowers and raises the shared verdict,
// which the decode kernel's first CTA publishes once this grid has completed (p.decode_publishes). The decode
// kernel may launch at once: it waits for this grid's completion before it reads anything.
__global__ void check_kernel(const __grid_constant__ DecodeParams p) {
  allow_dependents();
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
  check_indices(p, threadIdx.x, blockDim.x, &first_bad, &longest);
  __syncthreads();
  if (threadIdx.x == 0) {
    p.status->first_bad = first_bad;
    p.status->longest = longest;
    publish(p, first_bad, longest);
  }
}

// One warp per query row (b, h, t): the splits' parts merged as merge_attention_states does. The lanes share the
// splits' LSEs and weights (through shared memory) and each owns four adjacent output columns, so every load of a
// part is one 16-byte load and the loads of several parts are in flight together (a split count of 29 ran the
// part loads one after another before: 21 µs at batch 1).
constexpr int kCombineWarps = 4;
template <class Element>
__global__ void __launch_bounds__(kCombineWarps * 32) combine_kernel(const __grid_constant__ DecodeParams p) {
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
  float* w = weights[warp];
  for (int s = lane; s < p.splits; s += 32) w[s] = p.lse_part[s * rows + row];
  __syncwarp();
  const float l = merged_lse([&](int s) { return w[s]; }, p.splits);
  __syncwarp();  // every lane has read the LSEs before they become weights
  for (int s = lane; s < p.splits; s += 32) w[s] = part_weight(w[s], l);
  __syncwarp();
  const int c = 4 * lane;  // hdim_v is a multiple of 8 and at most 128: the lanes below dv / 4 own the columns
  if (c < dv) {
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
    constexpr int kInFlight = 8;
    for (int s0 = 0; s0 < p.splits; s0 += kInFlight) {
      float4 part[kInFlight];
      float wi[kInFlight];
#pragma unroll
      for (int i = 0; i < kInFlight; ++i) {
        const bool in = s0 + i < p.splits;
        part[i] = in ? *reinterpret_cast<const float4*>(p.o_part + ((s0 + i) * rows + row) * dv + c)
                     : make_float4(0.f, 0.f, 0.f, 0.f);
        wi[i] = in ? w[s0 + i] : 0.f;
      }
#pragma unroll
      for (int i = 0; i < kInFlight; ++i) {
        o.x += wi[i] * part[i].x;
        o.y += wi[i] * part[i].y;
        o.z += wi[i] * part[i].z;
        o.w += wi[i] * part[i].w;
      }
    }
    out[c] = Element(o.x);
    out[c + 1] = Element(o.y);
    out[c + 2] = Element(o.z);
    out[c + 3] = Element(o.w);
  }
  if (lane == 0 && lse != nullptr) *lse = l;
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

cudaError_t run_combine(bool fp16, const DecodeParams& p, cudaStream_t stream) {
  const std::int64_t rows = p.a.batch * p.a.heads_q * p.a.seqlen_q;
  if (rows == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>((rows + kCombineWarps - 1) / kCombineWarps);
  if (fp16) return launch_dependent(combine_kernel<cutlass::half_t>, blocks, kCombineWarps * 32, 0, stream, p);
  return launch_dependent(combine_kernel<cutlass::bfloat16_t>, blocks, kCombineWarps * 32, 0, stream, p);
}

}  // namespace flashtile::cuda::decode
