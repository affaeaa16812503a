// How the CPU runs forward_kvcache: the split-KV count and why (reported by the dispatch), and the query tile.
// Shared by the backend (plan, report) and the per-ISA kernel (flash_decode.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/params.h"

namespace flashtile::cpu {

// Query rows of one KV head processed together: the query heads of a GQA group times the new tokens, packed
// (row r = token r / G, head r % G), so that each key and value row is read once for all of them.
constexpr int kDecodeRows = 64;
// Keys per block: the scores of a block for all rows stay in L1 (64 rows · 64 keys · 4 B = 16 KiB).
constexpr int kDecodeKeys = 64;
// A split gets at least this many keys: below it the merge and the per-task setup cost more than they save.
constexpr std::int64_t kMinKeysPerSplit = 512;

struct DecodePlan {
  int splits = 1;
  std::int64_t row_tiles = 1;  // query tiles per (sequence, KV head)
  std::string why;
};

inline DecodePlan decode_plan(const detail::AttnParams& p, int threads) {
  DecodePlan d;
  const std::int64_t rows = p.group() * p.seqlen_q;
  d.row_tiles = std::max<std::int64_t>(1, (rows + kDecodeRows - 1) / kDecodeRows);
  const std::int64_t work = std::max<std::int64_t>(1, p.batch * p.heads_kv * d.row_tiles);
  const std::int64_t most = std::clamp<std::int64_t>((p.seqlen_k + kMinKeysPerSplit - 1) / kMinKeysPerSplit, 1, 256);
  if (p.num_splits > 0) {
    d.splits = p.num_splits;
    d.why = "num_splits as given";
    return d;
  }
  // Enough tasks for every thread twice over (dynamic scheduling evens out unequal lengths), without splits
  // shorter than kMinKeysPerSplit keys.
  const std::int64_t want = (2 * static_cast<std::int64_t>(threads) + work - 1) / work;
  d.splits = static_cast<int>(std::clamp<std::int64_t>(want, 1, most));
  d.why = "auto: " + std::to_string(work) + " (sequence, KV head, row tile) tasks for " + std::to_string(threads) +
          " threads, up to " + std::to_string(p.seqlen_k) + " keys";
  return d;
}

}  // namespace flashtile::cpu
