// The mask policy: the one place that says which keys a query row sees, which key tiles a query tile visits,
// which query rows a key tile serves, and which tiles need element masking. The CPU kernels, the CUDA kernels and
// the dispatch ask it; none of them re-derives the rule. The float64 oracle (src/cpu/reference.cpp) does NOT
// use it: it builds the mask densely from the definition, so that a mistake here fails the tests.
//
// Definition (FlashAttention's), per sequence of Sq query and Sk key rows, bottom-right aligned:
//   key j is visible to query i  iff  i + Sk - Sq - left <= j <= i + Sk - Sq + right,
// with left / right = -1 meaning unbounded on that side (causal: right = 0) and 0 <= j < Sk.
//
// Both ends of a row's visible range, key_begin(i) and key_end(i), are non-decreasing in i, and a row that
// sees anything sees a contiguous range of at least one key, so the union over a block of rows is contiguous
// and the rows that see some key of a key range form a contiguous range too: that makes trip counts exact.
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "core/params.h"

namespace flashtile::detail {

// Half-open range [begin, end) of keys or of query rows; empty when begin >= end.
struct Range {
  std::int64_t begin = 0, end = 0;
  FT_HOST_DEVICE bool empty() const { return begin >= end; }
  FT_HOST_DEVICE std::int64_t size() const { return empty() ? 0 : end - begin; }
};

// What a (query tile, key tile) pair needs: skip (no row sees any key of the tile: never computed), full (every
// row sees every key: no element mask), partial (element masking by key_begin / key_end per row).
enum class TileMask : std::uint8_t { skip, full, partial };

struct MaskPolicy {
  std::int64_t seqlen_q = 0, seqlen_k = 0;
  std::int64_t left = -1, right = -1;  // -1 = unbounded

  FT_HOST_DEVICE static MaskPolicy make(const AttnParams& p, const SeqInfo& s) {
    MaskPolicy m;
    m.seqlen_q = s.seqlen_q;
    m.seqlen_k = s.seqlen_k;
    m.left = p.window_left >= 0 ? p.window_left + p.test_window_bias : -1;
    m.right = p.window_right;
    return m;
  }

  FT_HOST_DEVICE static std::int64_t clamp(std::int64_t x, std::int64_t lo, std::int64_t hi) {
    return x < lo ? lo : (x > hi ? hi : x);
  }
  // Query row i's diagonal key: i + Sk - Sq.
  FT_HOST_DEVICE std::int64_t diagonal(std::int64_t i) const { return i + seqlen_k - seqlen_q; }

  // Keys [key_begin(i), key_end(i)) are visible to row i (empty when begin >= end).
  FT_HOST_DEVICE std::int64_t key_begin(std::int64_t i) const {
    return left < 0 ? 0 : clamp(diagonal(i) - left, 0, seqlen_k);
  }
  FT_HOST_DEVICE std::int64_t key_end(std::int64_t i) const {
    return right < 0 ? seqlen_k : clamp(diagonal(i) + right + 1, 0, seqlen_k);
  }
  FT_HOST_DEVICE Range keys(std::int64_t i) const { return {key_begin(i), key_end(i)}; }

  // Keys visible to some row of the query block [q0, q0 + rows) (rows >= 1, q0 + rows <= Sq): from the first
  // non-empty row's begin to the last non-empty row's end (empty rows are a prefix and a suffix of the sequence).
  FT_HOST_DEVICE Range keys(std::int64_t q0, std::int64_t nrows) const {
    const Range r = intersect(rows(0, seqlen_k), {q0, q0 + nrows});
    if (r.empty()) return {0, 0};
    return {key_begin(r.begin), key_end(r.end - 1)};
  }

  // Key tiles of width block_n that the query block [q0, q0 + rows) visits: tiles [first, last) (trip count
  // last - first; zero when no row sees a key).
  FT_HOST_DEVICE Range key_tiles(std::int64_t q0, std::int64_t rows, std::int64_t block_n) const {
    const Range r = keys(q0, rows);
    if (r.empty()) return {0, 0};
    return {r.begin / block_n, (r.end + block_n - 1) / block_n};
  }

  // Query rows that see some key of [k0, k0 + n) (backward: the rows a key tile serves); k0 + n <= Sk.
  FT_HOST_DEVICE Range rows(std::int64_t k0, std::int64_t n) const {
    const std::int64_t shift = seqlen_k - seqlen_q;
    // key_end(i) > k0  <=>  i >= k0 - shift - right;  key_begin(i) < k0 + n  <=>  i < k0 + n + left - shift.
    if (k0 >= seqlen_k || n <= 0) return {0, 0};
    const std::int64_t lo = right < 0 ? 0 : clamp(k0 - shift - right, 0, seqlen_q);
    const std::int64_t hi = left < 0 ? seqlen_q : clamp(k0 + n + left - shift, 0, seqlen_q);
    return {lo, hi};
  }

  // Query tiles of height block_m that serve the key tile [k0, k0 + n): tiles [first, last).
  FT_HOST_DEVICE Range query_tiles(std::int64_t k0, std::int64_t n, std::int64_t block_m) const {
    const Range r = rows(k0, n);
    if (r.empty()) return {0, 0};
    return {r.begin / block_m, (r.end + block_m - 1) / block_m};
  }

  // Key tiles of width block_n that every row of [q0, q0 + rows) sees whole (tile() == full): [first, last), maybe
  // empty; a tile running past Sk is never in it. Row begins and ends rise with the row, so the block's last row
  // bounds where full tiles start and its first row where they end. Kernels ask once per query block instead of
  // calling tile() per key tile (on the sm90 forward that per-step call cost ~100 instructions a step).
  FT_HOST_DEVICE Range full_key_tiles(std::int64_t q0, std::int64_t nrows, std::int64_t block_n) const {
    const std::int64_t lo = key_begin(q0 + nrows - 1), hi = key_end(q0);
    return {(lo + block_n - 1) / block_n, hi / block_n};
  }
  // Query tiles of height block_m whose every row sees the whole key tile [k0, k0 + n) (k0 + n <= Sk):
  // [first, last), maybe empty; a tile running past Sq is never in it. Row i sees all of it iff
  // key_end(i) >= k0 + n (a suffix of rows) and key_begin(i) <= k0 (a prefix).
  FT_HOST_DEVICE Range full_query_tiles(std::int64_t k0, std::int64_t n, std::int64_t block_m) const {
    const std::int64_t shift = seqlen_k - seqlen_q;
    const std::int64_t lo = right < 0 ? 0 : clamp(k0 + n - 1 - right - shift, 0, seqlen_q);
    const std::int64_t hi = left < 0 ? seqlen_q : clamp(k0 + left - shift + 1, 0, seqlen_q);
    return {(lo + block_m - 1) / block_m, hi / block_m};
  }

  // The tile of rows [q0, q0 + rows) and keys [k0, k0 + n), both inside the sequence (n >= 1).
  FT_HOST_DEVICE TileMask tile(std::int64_t q0, std::int64_t nrows, std::int64_t k0, std::int64_t n) const {
    if (intersect(rows(k0, n), {q0, q0 + nrows}).empty()) return TileMask::skip;
    // Every row sees every key iff the last row starts no later than k0 and the first row ends no earlier.
    if (key_begin(q0 + nrows - 1) <= k0 && key_end(q0) >= k0 + n) return TileMask::full;
    return TileMask::partial;
  }

  FT_HOST_DEVICE static Range intersect(Range a, Range b) {
    return {a.begin > b.begin ? a.begin : b.begin, a.end < b.end ? a.end : b.end};
  }
};

}  // namespace flashtile::detail
