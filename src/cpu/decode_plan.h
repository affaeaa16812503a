// How the CPU runs forward_kvcache: the split-KV count and why (reported by the dispatch), and the row tiles.
// Shared by the backend (plan, report) and the per-ISA kernel (flash_decode.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/params.h"

namespace flashtile::cpu {

// Query rows of one KV head processed together: the query heads of a GQA group times the new tokens, packed
// (row r = token r / G, head r % G), so that each key and value row is read once for all of them.
constexpr int kDecodeRows = 64;
// Rows of a tile that packs several KV heads (each with at most kDecodeRows rows; RowTile): a key block then reads
// each key's heads as one stretch of memory, not one head's rows Hkv · D elements apart. 512 takes all 8 KV heads of
// 16 tokens x G 4: on the 2-core AMX Xeon VM (2026-12-05, B = 1, GQA 32/8, hd128, bf16, 32k keys, the CLI's bench,
// interleaved) 13.1-13.4 ms a call against 19.0-22.5 ms with 64-row tiles (one head per tile), the same at 4k keys
// (the cache in L3; 1.5-1.7 against 1.7-1.8 ms).
constexpr int kDecodeTileRows = 512;
// Keys per block: the scores of a block for all rows stay in L1 (64 rows · 64 keys · 4 B = 16 KiB).
constexpr int kDecodeKeys = 64;
// A split gets at least this many keys: below it the merge and the per-task setup cost more than they save.
constexpr std::int64_t kMinKeysPerSplit = 512;
// From this many rows of one KV head on in a tile (Sq · G, e.g. speculative decoding), its products run as matrix
// products (flash_decode.cpp): on the bf16 tile products of the sets that have them (bf16_tiles.h: AMX tiles or
// vdpbf16ps pairs), for bf16 caches whose head dims are multiples of 32 (the tile products' step;
// decode_on_bf16_tiles), else in float32 on the block converted once.
// Below it, per row: a matrix product would waste most of its rows.
constexpr int kMatrixRows = 16;
// Whether the per-row path (fewer than kMatrixRows rows of a KV head) forms each score as the forward kernel's
// product does, one FMA chain over the head dim from 0 in order (flash_decode.cpp qk_rows_chain; the matrix path
// always does, tile_ops.h gemm_nn): in a forward (flash_attn_func on this kernel, forward_on_decode below) of float32
// or float16 inputs. The backward recomputes S = (scale·Q)·Kᵀ by that product, and its P = exp(S − LSE) is exact
// only for an LSE formed from those very scores (flash_backward.cpp); the per-row dot products sum in another order,
// which with scores near 150 left the backward's dQ error at 0.018-0.046 against the test's bound of 0.001-0.003
// (tests/test_edge.cpp, rising scores). bf16 forwards sum in their own order anyway (bf16_tiles.h) and a
// forward_kvcache has no backward: both keep the faster dot products.
inline bool scores_in_forward_order(const detail::AttnParams& p) { return !p.kvcache && p.dtype != DType::bfloat16; }
constexpr bool decode_on_bf16_tiles(DType dtype, std::int64_t d, std::int64_t dv) {
  return dtype == DType::bfloat16 && d % 32 == 0 && dv % 32 == 0;
}

// The packed rows of one task: `heads` KV heads from hk0 of sequence b, and of each the rows [r0, r0 + per_head)
// of its G·Sq rows, row rr being token rr / G of query head hk·G + rr % G. Several heads share a tile when their
// rows fit: a key block then reads one stretch of memory (a key's heads are adjacent in the cache), which pages
// and prefetchers serve far better than one head's rows, Hkv · D elements apart.
struct RowTile {
  std::int64_t b, hk0;
  int heads, r0, per_head;
  std::int64_t group;
  int rows() const { return heads * per_head; }
  std::int64_t kv_head(int r) const { return hk0 + r / per_head; }
  std::int64_t token(int r) const { return (r0 + r % per_head) / group; }
  std::int64_t head(int r) const { return kv_head(r) * group + (r0 + r % per_head) % group; }
};

struct DecodePlan {
  int splits = 1;
  std::int64_t tiles = 1;            // row tiles per sequence
  std::int64_t heads_per_tile = 1;   // KV heads per tile (1 when a head's rows need several tiles)
  std::int64_t tiles_per_head = 1;   // row tiles per KV head (1 when whole heads share tiles)
  std::int64_t rows_per_head = 0, group = 1, heads_kv = 0;
  std::int64_t tasks = 0, keys = 0;  // (sequence, row tile) tasks and the longest sequence, for reason()
  int threads = 0;
  bool given = false;  // num_splits came from the caller

  // Why this many splits, for the dispatch report (built only there: run() plans without formatting text).
  std::string reason() const {
    if (given) return "num_splits as given";
    const std::string per = tiles_per_head > 1 ? std::to_string(tiles_per_head) + " row tiles per KV head"
                                               : std::to_string(heads_per_tile) + " KV heads per row tile";
    return "auto: " + std::to_string(tasks) + " (sequence, row tile) tasks (" + per + ") for " +
           std::to_string(threads) + " threads, up to " + std::to_string(keys) + " keys";
  }

  // How the tiles' products run, for the dispatch report (on_tiles: the kernel set's bf16 tile products, empty if
  // it has none; row_dots: KernelSet::decode_row_dots).
  std::string products(const detail::AttnParams& p, std::string_view on_tiles, bool row_dots) const {
    const bool bf16_pieces = decode_on_bf16_tiles(p.dtype, p.hdim, p.hdim_v);
    const std::string matrix = !on_tiles.empty() && bf16_pieces ? std::string(on_tiles) : "float32 matrix";
    if (rows_per_head < kMatrixRows) {
      if (scores_in_forward_order(p)) return "per-row products, Q·Kᵀ in the forward kernel's order";
      return row_dots && bf16_pieces ? "per-row dot products, Q·Kᵀ on vdpbf16ps" : "per-row dot products";
    }
    const std::int64_t tail = rows_per_head % kDecodeRows;
    return matrix + (tail > 0 && tail < kMatrixRows ? " (a head's last " + std::to_string(tail) + " rows per row)" : "");
  }

  RowTile tile(std::int64_t b, std::int64_t index) const {
    if (tiles_per_head == 1) {
      const std::int64_t hk0 = index * heads_per_tile;
      return {b, hk0, static_cast<int>(std::min(heads_per_tile, heads_kv - hk0)), 0, static_cast<int>(rows_per_head),
              group};
    }
    const std::int64_t r0 = index % tiles_per_head * kDecodeRows;
    return {b, index / tiles_per_head, 1, static_cast<int>(r0),
            static_cast<int>(std::min<std::int64_t>(kDecodeRows, rows_per_head - r0)), group};
  }
};

// The kernel of a forward (flash_attn_func, not forward_kvcache): automatic (forward_on_decode's rule), or forced
// by FLASHTILE_CPU_FORWARD=tiles (the tiled forward kernel for every forward) or =decode (this kernel for every
// forward it can run), which the test script uses to run the suite on each. forward_kernel_choice() reads the
// variable (isa.cpp, beside FLASHTILE_CPU_ISA) and throws InvalidArgument on an unknown value.
enum class ForwardKernel { automatic, tiles, decode };
ForwardKernel forward_kernel_choice();

// Whether a forward runs on this kernel. Automatic: when the query rows of each KV head, G·Sq, fit one row tile.
// The forward kernel converts a head's K and V once per (query head, chunk of query tiles) and gives each task one
// thread, which a few query rows cannot repay; this kernel reads each K/V row once for the G heads, in its own dtype,
// and splits the keys across threads. Measured on the AVX-512 EPYC, 2 threads, one process, G·Sq = 1-128, D = 64 /
// 128, causal (bench/results/cpu_forward_small_sq.md, 2k and 16k keys; cpu_forward_short_keys.md, 256 and 512):
// 0.96-5.9x the tiled forward at Sq = 1 and with GQA (below 1.0: a bf16 cell of 16 rows at 2k keys, and 64 float32
// rows at 256-512 keys, 0.88-0.94). Without GQA (G = 1), from 16 rows: bf16 on a set with bf16 tile products keeps
// the forward, where its tiles packed once per head ran 0.69-1.2x as fast (the sweep before transpose_to_float);
// float32 / float16 take this kernel from kMatrixKeysWithoutGqa keys on (the tiled forward was 1.02-1.16x as fast
// at 256-2048 keys, but 0.88x at D = 128, 16 rows, 2048 keys; this kernel 1.04-1.56x at 16k). G·Sq = 128 ran
// 0.86-1.5x and stays on the forward too. In a varlen batch G·Sq counts the longest sequence's query rows
// (flash_decode.cpp attend_tile drops a shorter one's missing rows) and the keys its longest key sequence.
constexpr std::int64_t kMatrixKeysWithoutGqa = 4096;
inline bool forward_on_decode(const detail::AttnParams& p, bool bf16_tiles, ForwardKernel choice) {
  if (p.is_backward() || p.kvcache) return false;
  if (choice != ForwardKernel::automatic) return choice == ForwardKernel::decode;
  const std::int64_t rows = p.group() * p.seqlen_q;
  if (rows > kDecodeRows) return false;
  if (rows < kMatrixRows || p.group() > 1) return true;
  return !(p.dtype == DType::bfloat16 && bf16_tiles) && p.seqlen_k >= kMatrixKeysWithoutGqa;
}

inline DecodePlan decode_plan(const detail::AttnParams& p, int threads) {
  DecodePlan d;
  d.group = std::max<std::int64_t>(p.group(), 1);
  d.heads_kv = p.heads_kv;
  d.rows_per_head = p.group() * p.seqlen_q;
  if (d.rows_per_head <= kDecodeRows) {
    d.heads_per_tile = std::clamp<std::int64_t>(kDecodeTileRows / std::max<std::int64_t>(d.rows_per_head, 1), 1,
                                                std::max<std::int64_t>(p.heads_kv, 1));
    d.tiles = (p.heads_kv + d.heads_per_tile - 1) / d.heads_per_tile;
  } else {
    d.tiles_per_head = (d.rows_per_head + kDecodeRows - 1) / kDecodeRows;
    d.tiles = p.heads_kv * d.tiles_per_head;
  }
  const std::int64_t work = std::max<std::int64_t>(1, p.batch * d.tiles);
  d.tasks = work;
  d.keys = p.seqlen_k;
  d.threads = threads;
  if (p.num_splits > 0) {
    d.splits = p.num_splits;
    d.given = true;
    return d;
  }
  // Enough tasks for every thread twice over (dynamic scheduling evens out unequal lengths), without splits
  // shorter than kMinKeysPerSplit keys.
  const std::int64_t most = std::clamp<std::int64_t>((p.seqlen_k + kMinKeysPerSplit - 1) / kMinKeysPerSplit, 1, 256);
  const std::int64_t wanted = 2 * static_cast<std::int64_t>(threads);
  d.splits = static_cast<int>(std::clamp<std::int64_t>((wanted + work - 1) / work, 1, most));
  // Keys too few to split that far (a short cache, or a forward's short K/V): the tile's heads are split instead,
  // which needs no merge. Without it, 32 heads of one row over 256-512 keys ran as one task on one thread
  // (float32, D = 64 / 128, 2 threads: 0.45-0.6x torch's SDPA, which spreads heads over threads).
  if (d.tiles_per_head == 1 && d.heads_per_tile > 1 && work * d.splits < wanted) {
    const std::int64_t tiles_wanted = (wanted + p.batch * d.splits - 1) / std::max<std::int64_t>(p.batch * d.splits, 1);
    d.heads_per_tile = std::max<std::int64_t>(1, (p.heads_kv + tiles_wanted - 1) / tiles_wanted);
    d.tiles = (p.heads_kv + d.heads_per_tile - 1) / d.heads_per_tile;
    d.tasks = std::max<std::int64_t>(1, p.batch * d.tiles);
  }
  return d;
}

}  // namespace flashtile::cpu
