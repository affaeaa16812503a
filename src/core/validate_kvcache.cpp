// Validation of forward_kvcache (include/flashtile/kvcache.h): shapes, dtypes and devices of every operand, and,
// for host tensors, the values the call indexes with (cache_seqlens, block_table, cache_batch_idx), all before
// anything is written, so that a refused call leaves the cache as it was.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/validate.h"
#include "core/validate_args.h"
#include "flashtile/errors.h"

namespace flashtile::detail {
namespace {

using namespace args;

// Options of forward() that have no meaning against a cache.
void refuse_options(const Options& o) {
  if (present(o.cu_seqlens_q) || present(o.cu_seqlens_k))
    fail<InvalidArgument>(present(o.cu_seqlens_q) ? "cu_seqlens_q" : "cu_seqlens_k",
                          ": not taken by forward_kvcache (cache_seqlens gives each sequence's keys)");
  if (present(o.seqused_k))
    fail<InvalidArgument>("seqused_k: not taken by forward_kvcache (cache_seqlens gives each sequence's keys)");
  if (present(o.dsinks)) fail<InvalidArgument>("dsinks: forward_kvcache has no backward");
  if (o.max_seqlen_q != 0)
    fail<InvalidArgument>("max_seqlen_q: not taken by forward_kvcache (q is [B, Sq, Hq, D]), got ", o.max_seqlen_q);
  if (o.max_seqlen_k < 0) fail<InvalidArgument>("max_seqlen_k: must be >= 0, got ", o.max_seqlen_k);
}

// The host values: lengths within the cache, pages within the pool, slots within the cache, and no two sequences
// writing the same cache row (or one writing a row that another reads).
struct Values {
  const AttnParams& p;
  const KVCache& cache;
  std::int64_t num_pages, slots;

  std::int64_t length(std::int64_t b) const {  // L_b, the keys sequence b attends to after the append
    return present(cache.cache_seqlens) ? std::int64_t{entry(cache.cache_seqlens, b)} + p.seqlen_new : p.seqlen_k;
  }
  std::int32_t page(std::int64_t b, std::int64_t t) const {
    const TensorView& bt = cache.block_table;
    return static_cast<const std::int32_t*>(bt.data)[b * bt.stride[0] + t * bt.stride[1]];
  }

  // Returns the longest L_b.
  std::int64_t check() const {
    const bool paged = p.page_table != nullptr;
    const std::int64_t room = paged ? p.max_pages * p.page_size : p.capacity;
    std::int64_t longest = 0;
    for (std::int64_t b = 0; b < p.batch; ++b) {
      if (present(cache.cache_seqlens)) {
        const std::int32_t len = entry(cache.cache_seqlens, b);
        if (len < 0) fail<InvalidArgument>("cache_seqlens: cache_seqlens[", b, "] = ", len, " is negative");
        if (len + p.seqlen_new > room)
          fail<InvalidArgument>("cache_seqlens: cache_seqlens[", b, "] = ", len, " plus ", p.seqlen_new,
                                " new keys exceeds the ", room, " rows ",
                                paged ? "of block_table's pages (max_pages · page_size)" : "of the cache (capacity)");
      }
      const std::int64_t len = length(b);
      longest = std::max(longest, len);
      if (paged) {
        for (std::int64_t t = 0; t * p.page_size < len; ++t)
          if (page(b, t) < 0 || page(b, t) >= num_pages)
            fail<InvalidArgument>("block_table: block_table[", b, "][", t, "] = ", page(b, t),
                                  " is outside [0, num_pages = ", num_pages, ") (sequence ", b, " holds ", len,
                                  " keys)");
      } else if (present(cache.cache_batch_idx)) {
        const std::int32_t slot = entry(cache.cache_batch_idx, b);
        if (slot < 0 || slot >= slots)
          fail<InvalidArgument>("cache_batch_idx: cache_batch_idx[", b, "] = ", slot, " is outside [0, ", slots,
                                ") (the cache's batch)");
      }
    }
    if (p.seqlen_new > 0) check_writes();
    return longest;
  }

  // The rows the append writes, [L_b − Snew, L_b) of sequence b, against every row that the call touches through
  // another sequence or another of b's block-table entries. Cost: the written pages (B · (Snew / page_size + 2)
  // entries, sorted) and one binary search per page in use; the pages in use are scanned by check() already.
  void check_writes() const {
    struct Written {
      std::int64_t slot, lo, hi, b, t;  // rows [lo, hi) of page (or cache slot) `slot`, logical page t of b
    };
    thread_local std::vector<Written> writes;  // kept between calls: validation runs on every decode step
    writes.clear();
    const bool paged = p.page_table != nullptr;
    const std::int64_t rows = paged ? p.page_size : p.capacity;
    auto slot_of = [&](std::int64_t b, std::int64_t t) -> std::int64_t {
      if (paged) return page(b, t);
      return present(cache.cache_batch_idx) ? entry(cache.cache_batch_idx, b) : b;
    };
    for (std::int64_t b = 0; b < p.batch; ++b) {
      const std::int64_t len = length(b);
      for (std::int64_t j = len - p.seqlen_new; j < len;) {
        const std::int64_t t = j / rows, end = std::min(len, (t + 1) * rows);
        writes.push_back({slot_of(b, t), j - t * rows, end - t * rows, b, t});
        j = end;
      }
    }
    std::sort(writes.begin(), writes.end(), [](const Written& x, const Written& y) { return x.slot < y.slot; });
    for (std::int64_t b = 0; b < p.batch; ++b) {
      const std::int64_t len = length(b);
      for (std::int64_t t = 0; t * rows < len; ++t) {
        const std::int64_t slot = slot_of(b, t), used = std::min(rows, len - t * rows);  // rows [0, used) of slot
        auto it = std::lower_bound(writes.begin(), writes.end(), slot,
                                   [](const Written& w, std::int64_t x) { return w.slot < x; });
        for (; it != writes.end() && it->slot == slot; ++it) {
          if ((it->b == b && it->t == t) || it->lo >= used) continue;
          fail<InvalidArgument>(paged ? "block_table" : "cache_batch_idx", ": sequence ", it->b, " appends to rows [",
                                it->lo, ", ", it->hi, ") of ", paged ? "page " : "cache slot ", slot,
                                it->b == b ? " that the same sequence reads through another block-table entry"
                                           : " that sequence ",
                                it->b == b ? "" : std::to_string(b), it->b == b ? "" : " also uses",
                                "; appends must not overlap what the call reads or writes");
        }
      }
    }
  }
};

}  // namespace

AttnParams validate_kvcache(const TensorView& q, const KVCache& cache, const TensorView& out, const TensorView& lse,
                            const Options& o) {
  refuse_options(o);
  Checked c;
  AttnParams& p = c.p;
  p.kvcache = true;
  const bool paged = present(cache.block_table);
  const char* cache_layout = paged ? "[num_pages, page_size, Hkv, D]" : "[B_cache, capacity, Hkv, D]";
  const char* vcache_layout = paged ? "[num_pages, page_size, Hkv, Dv]" : "[B_cache, capacity, Hkv, Dv]";
  const Arg aq{"q", q, "[B, Sq, Hq, D]", false}, ak{"k_cache", cache.k_cache, cache_layout, false},
      av{"v_cache", cache.v_cache, vcache_layout, false};
  check_float(aq);
  const Span sq = check_layout(aq, 4), sk = check_layout(ak, 4), sv = check_layout(av, 4);
  c.inputs.emplace_back("q", sq);
  p.batch = q.shape[0];
  p.seqlen_q = q.shape[1];
  p.heads_q = q.shape[2];
  p.hdim = q.shape[3];
  p.heads_kv = cache.k_cache.shape[2];
  p.hdim_v = cache.v_cache.shape[3];
  if (p.hdim < 1 || p.hdim > kMaxHeadDim)
    fail<InvalidArgument>("q: head dim D = ", p.hdim, " is out of range [1, ", kMaxHeadDim, "] (shape ", shape_str(q), ")");
  if (cache.k_cache.shape[3] != p.hdim)
    fail<InvalidArgument>("k_cache: expected ", cache_layout, " with D = ", p.hdim, " from q ", shape_str(q), ", got ",
                          shape_str(cache.k_cache));
  if (p.hdim_v < 1 || p.hdim_v > kMaxHeadDim)
    fail<InvalidArgument>("v_cache: head dim Dv = ", p.hdim_v, " is out of range [1, ", kMaxHeadDim, "] (shape ",
                          shape_str(cache.v_cache), ")");
  const std::int64_t slots = cache.k_cache.shape[0], rows = cache.k_cache.shape[1];
  check_dims(av, {slots, rows, p.heads_kv, p.hdim_v});
  if (p.heads_kv == 0 ? p.heads_q != 0 : p.heads_q % p.heads_kv != 0)
    fail<InvalidArgument>("k_cache: query heads Hq = ", p.heads_q, " must be a multiple of key/value heads Hkv = ",
                          p.heads_kv);
  for (const Arg* a : {&ak, &av}) {
    check_dtype(*a, q.dtype, "q's dtype");
    check_same_device(*a, q);
  }
  if (cache.k_cache.data != nullptr && cache.k_cache.data == cache.v_cache.data && cache.k_cache.numel() > 0)
    fail<InvalidArgument>("v_cache: the same memory as k_cache (", cache.k_cache.data, ")");

  // Paged or contiguous, and which slot each sequence uses.
  if (paged) {
    if (present(cache.cache_batch_idx))
      fail<InvalidArgument>("cache_batch_idx: not taken with block_table (the block table names each sequence's pages)");
    const Arg ab{"block_table", cache.block_table, "[B, max_pages]", false};
    if (cache.block_table.dtype != DType::int32)
      fail<DTypeError>("block_table: dtype ", dtype_name(cache.block_table.dtype), ", expected int32");
    check_same_device(ab, q);
    c.inputs.emplace_back("block_table", check_layout(ab, 2));
    if (cache.block_table.shape[0] != p.batch)
      fail<InvalidArgument>("block_table: expected [B, max_pages] with B = ", p.batch, " from q, got ",
                            shape_str(cache.block_table));
    p.page_size = rows;
    if (p.page_size < 16 || p.page_size % 16 != 0)
      fail<InvalidArgument>("k_cache: page_size = ", p.page_size, " (dim 1 of a paged cache ", shape_str(cache.k_cache),
                            ") must be a positive multiple of 16");
    p.max_pages = cache.block_table.shape[1];
    p.page_table = static_cast<const std::int32_t*>(cache.block_table.data);
    p.page_table_batch_stride = cache.block_table.stride[0];
    if (p.max_pages > 1 && cache.block_table.stride[1] != 1)
      fail<InvalidArgument>("block_table: the last dimension must be contiguous (stride 1), got strides [",
                            cache.block_table.stride[0], ", ", cache.block_table.stride[1], "]");
  } else {
    p.capacity = rows;
    if (present(cache.cache_batch_idx)) {
      c.inputs.emplace_back("cache_batch_idx",
                            check_index({"cache_batch_idx", cache.cache_batch_idx, "[B]", false}, q, p.batch));
      p.cache_batch_idx = static_cast<const std::int32_t*>(cache.cache_batch_idx.data);
    } else if (slots != p.batch) {
      fail<InvalidArgument>("k_cache: expected ", cache_layout, " with B_cache = B = ", p.batch,
                            " (no cache_batch_idx), got ", shape_str(cache.k_cache));
    }
  }
  if (present(cache.cache_seqlens)) {
    c.inputs.emplace_back("cache_seqlens", check_index({"cache_seqlens", cache.cache_seqlens, "[B]", false}, q, p.batch));
    p.cache_seqlens = static_cast<const std::int32_t*>(cache.cache_seqlens.data);
  }

  // The new keys and values, appended in place.
  if (present(cache.k_new) != present(cache.v_new))
    fail<InvalidArgument>(present(cache.k_new) ? "v_new: required with k_new" : "k_new: required with v_new");
  const bool append = present(cache.k_new);
  if (append) {
    if (!present(cache.cache_seqlens))
      fail<InvalidArgument>("cache_seqlens: required with k_new (where in the cache the new keys go)");
    const Arg akn{"k_new", cache.k_new, "[B, Snew, Hkv, D]", false}, avn{"v_new", cache.v_new, "[B, Snew, Hkv, Dv]", false};
    c.inputs.emplace_back("k_new", check_layout(akn, 4));
    c.inputs.emplace_back("v_new", check_layout(avn, 4));
    p.seqlen_new = cache.k_new.shape[1];
    check_dims(akn, {p.batch, p.seqlen_new, p.heads_kv, p.hdim});
    check_dims(avn, {p.batch, p.seqlen_new, p.heads_kv, p.hdim_v});
    for (const Arg* a : {&akn, &avn}) {
      check_dtype(*a, q.dtype, "q's dtype");
      check_same_device(*a, q);
    }
    p.k_new = cache.k_new.data;
    p.v_new = cache.v_new.data;
    p.k_new_stride = rows_of(cache.k_new);
    p.v_new_stride = rows_of(cache.v_new);
    // Written: each must not overlap the other outputs nor the inputs (k and v of one interleaved buffer,
    // [.., 2, Hkv, D], overlap as byte ranges while their elements do not: only out / lse are checked against them).
    c.outputs.emplace_back("k_cache", sk);
    check_no_self_overlap({"k_cache", cache.k_cache, cache_layout, true});
    check_no_self_overlap({"v_cache", cache.v_cache, vcache_layout, true});
  } else {
    c.inputs.emplace_back("k_cache", sk);
    c.inputs.emplace_back("v_cache", sv);
  }
  if (cache.num_splits < 0 || cache.num_splits > 1024)
    fail<InvalidArgument>("num_splits: must be in [0, 1024] (0 = automatic), got ", cache.num_splits);
  p.num_splits = cache.num_splits;

  check_options(c, o, q);
  check_output(c, {"out", out, "[B, Sq, Hq, Dv]", true}, 4, {p.batch, p.seqlen_q, p.heads_q, p.hdim_v}, q.dtype,
               "q's dtype", q);
  if (present(lse))
    check_output(c, {"lse", lse, "[B, Hq, Sq]", true}, 3, {p.batch, p.heads_q, p.seqlen_q}, DType::float32,
                 "the required float32", q);
  check_no_aliasing(c);
  if (append) {  // v_cache against everything but k_cache
    Checked vc;
    vc.inputs = c.inputs;
    vc.inputs.erase(std::remove_if(vc.inputs.begin(), vc.inputs.end(),
                                   [](const auto& x) { return std::string(x.first) == "k_cache"; }),
                    vc.inputs.end());
    for (const auto& x : c.outputs)
      if (std::string(x.first) != "k_cache") vc.inputs.push_back(x);
    vc.outputs.emplace_back("v_cache", sv);
    check_no_aliasing(vc);
  }

  p.dtype = q.dtype;
  p.device = q.device;
  p.device_index = q.device_index;
  p.q = q.data;
  p.k = cache.k_cache.data;
  p.v = cache.v_cache.data;
  p.q_stride = rows_of(q);
  p.k_stride = rows_of(cache.k_cache);
  p.v_stride = rows_of(cache.v_cache);
  p.out = out.data;
  p.out_stride = rows_of(out);
  if (present(lse)) {
    p.lse = static_cast<float*>(lse.data);
    p.lse_stride = lse_of(lse);
  }
  p.seqlen_k = paged ? p.max_pages * p.page_size : p.capacity;  // every sequence's bound
  p.cache_slots = slots;
  p.async_index_check = cache.async_index_check;
  p.total_q = p.batch * p.seqlen_q;
  if (q.device == Device::cpu) {
    for (const auto& [name, t] : {std::pair{"cache_seqlens", &cache.cache_seqlens}, std::pair{"block_table", &cache.block_table},
                                  std::pair{"cache_batch_idx", &cache.cache_batch_idx}})
      if (present(*t)) check_host_readable(name, *t);
    const std::int64_t longest = Values{p, cache, slots, slots}.check();
    if (o.max_seqlen_k > 0 && o.max_seqlen_k < longest)
      fail<InvalidArgument>("max_seqlen_k: ", o.max_seqlen_k, " is smaller than the longest sequence's ", longest,
                            " keys (cache_seqlens + Snew)");
    p.seqlen_k = longest;
  } else if (o.max_seqlen_k > 0) {
    if (o.max_seqlen_k > p.seqlen_k)
      fail<InvalidArgument>("max_seqlen_k: ", o.max_seqlen_k, " exceeds the cache's ", p.seqlen_k, " rows");
    p.seqlen_k = o.max_seqlen_k;
  }
  p.total_k = p.batch * p.seqlen_k;
  return p;
}

}  // namespace flashtile::detail
