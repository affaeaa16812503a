// forward_kvcache's refusals: each bad argument gets the typed error that names it, and a refused call leaves the
// cache (and out, lse) exactly as they were: the checks run before anything is written.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "flashtile/flashtile.h"
#include "support.h"

namespace ft_test {
namespace {

using flashtile::KVCache;

// A small valid call: B = 2, Sq = 1, Hq = 4, Hkv = 2, D = 16, contiguous cache of capacity 32 holding 10 and 20
// keys, one key appended. Tests break one thing and expect a refusal.
struct Call {
  DType t = DType::float32;
  Tensor q{t, {2, 1, 4, 16}}, k_cache{t, {2, 32, 2, 16}}, v_cache{t, {2, 32, 2, 16}}, k_new{t, {2, 1, 2, 16}},
      v_new{t, {2, 1, 2, 16}}, out{t, {2, 1, 4, 16}}, lse{DType::float32, {2, 4, 1}}, seqlens{DType::int32, {2}};
  KVCache cache;
  flashtile::Options options;
  Call() {
    auto rng = test_rng();
    for (Tensor* x : {&q, &k_cache, &v_cache, &k_new, &v_new}) x->fill_normal(rng);
    out.fill(7.0);
    lse.fill(7.0);
    seqlens.set(0, 10);
    seqlens.set(1, 20);
    cache.k_cache = k_cache.view();
    cache.v_cache = v_cache.view();
    cache.k_new = k_new.view();
    cache.v_new = v_new.view();
    cache.cache_seqlens = seqlens.view();
  }
  void run() { flashtile::forward_kvcache(q.view(), cache, out.view(), lse.view(), options); }
};

// Runs the call, expects error type E with every `words` in its message, and no byte of the cache, out or lse
// changed.
template <class E>
void expect_refused(Call& c, std::vector<std::string> words) {
  const auto k = c.k_cache.to_double(), v = c.v_cache.to_double(), o = c.out.to_double(), l = c.lse.to_double();
  try {
    c.run();
    ADD_FAILURE() << "the call was not refused";
  } catch (const E& e) {
    for (const std::string& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong error type: " << e.what();
  }
  EXPECT_EQ(c.k_cache.to_double(), k);
  EXPECT_EQ(c.v_cache.to_double(), v);
  EXPECT_EQ(c.out.to_double(), o);
  EXPECT_EQ(c.lse.to_double(), l);
}

TEST(KvCacheValidation, TheValidCallRuns) {
  Call c;
  c.run();
  EXPECT_EQ(c.k_cache.get(((0 * 32 + 10) * 2 + 0) * 16 + 5), c.k_new.get(5));  // slot 0, row 10, head 0, element 5
}

TEST(KvCacheValidation, LengthPastCapacity) {
  Call c;
  c.seqlens.set(1, 32);  // 32 + 1 new > 32 rows
  expect_refused<flashtile::InvalidArgument>(c, {"cache_seqlens[1] = 32", "capacity"});
}

TEST(KvCacheValidation, NegativeLength) {
  Call c;
  c.seqlens.set(0, -1);
  expect_refused<flashtile::InvalidArgument>(c, {"cache_seqlens[0] = -1"});
}

TEST(KvCacheValidation, KWithoutV) {
  Call c;
  c.cache.v_new = {};
  expect_refused<flashtile::InvalidArgument>(c, {"v_new"});
}

TEST(KvCacheValidation, AppendWithoutSeqlens) {
  Call c;
  c.cache.cache_seqlens = {};
  expect_refused<flashtile::InvalidArgument>(c, {"cache_seqlens", "k_new"});
}

TEST(KvCacheValidation, CacheDtypeDiffersFromQ) {
  Call c;
  Tensor k16(DType::bfloat16, {2, 32, 2, 16});
  c.cache.k_cache = k16.view();
  expect_refused<flashtile::DTypeError>(c, {"k_cache", "bfloat16"});
}

TEST(KvCacheValidation, CacheOnAnotherDevice) {
  Call c;
  c.cache.v_cache.device = flashtile::Device::cuda;
  expect_refused<flashtile::DeviceError>(c, {"v_cache"});
}

TEST(KvCacheValidation, NewKeysOfWrongShape) {
  Call c;
  Tensor k3(DType::float32, {2, 1, 2, 8});
  c.cache.k_new = k3.view();
  expect_refused<flashtile::InvalidArgument>(c, {"k_new", "[2, 1, 2, 16]"});
}

TEST(KvCacheValidation, NegativeSmMargin) {
  Call c;
  c.options.sm_margin = -1;
  expect_refused<flashtile::InvalidArgument>(c, {"sm_margin", "-1"});
}

TEST(KvCacheValidation, BatchIndexOutOfRange) {
  Call c;
  Tensor idx(DType::int32, {2});
  idx.set(0, 1);
  idx.set(1, 2);  // the cache has slots 0 and 1
  c.cache.cache_batch_idx = idx.view();
  expect_refused<flashtile::InvalidArgument>(c, {"cache_batch_idx[1] = 2"});
}

TEST(KvCacheValidation, TwoSequencesAppendingToOneSlot) {
  Call c;
  Tensor idx(DType::int32, {2});
  idx.set(0, 1);
  idx.set(1, 1);
  c.cache.cache_batch_idx = idx.view();
  expect_refused<flashtile::InvalidArgument>(c, {"cache_batch_idx", "cache slot 1"});
}

// A paged variant of the call: 6 pages of 16 rows, block_table [2, 3].
struct PagedCall : Call {
  Tensor pk{t, {6, 16, 2, 16}}, pv{t, {6, 16, 2, 16}}, table{DType::int32, {2, 3}};
  PagedCall() {
    auto rng = test_rng();
    pk.fill_normal(rng);
    pv.fill_normal(rng);
    const int pages[2][3] = {{4, 0, 5}, {2, 3, 1}};
    for (int b = 0; b < 2; ++b)
      for (int i = 0; i < 3; ++i) table.set(b * 3 + i, pages[b][i]);
    cache.k_cache = pk.view();
    cache.v_cache = pv.view();
    cache.block_table = table.view();
  }
  std::vector<double> pages_k() const { return pk.to_double(); }
};

TEST(KvCacheValidation, PagedValidCallWritesThroughTheTable) {
  PagedCall c;
  c.run();
  // Sequence 1 holds 20 keys: the new key is its 21st, row 4 of its second page (page 3).
  EXPECT_EQ(c.pk.get(((3 * 16 + 4) * 2 + 1) * 16 + 7), c.k_new.get((1 * 2 + 1) * 16 + 7));
}

TEST(KvCacheValidation, PageOutsideThePool) {
  PagedCall c;
  c.table.set(1 * 3 + 1, 6);  // sequence 1's second page (it needs two)
  const auto before = c.pages_k();
  expect_refused<flashtile::InvalidArgument>(c, {"block_table[1][1] = 6", "num_pages = 6"});
  EXPECT_EQ(c.pages_k(), before);
}

TEST(KvCacheValidation, UnusedTableEntriesAreNotRead) {
  PagedCall c;
  c.table.set(0 * 3 + 2, -1);  // sequence 0 (11 keys) never reaches its third page
  c.run();
}

TEST(KvCacheValidation, PageSizeNotAMultipleOf16) {
  PagedCall c;
  Tensor k24(DType::float32, {4, 24, 2, 16}), v24(DType::float32, {4, 24, 2, 16});
  c.cache.k_cache = k24.view();
  c.cache.v_cache = v24.view();
  expect_refused<flashtile::InvalidArgument>(c, {"page_size = 24", "multiple of 16"});
}

TEST(KvCacheValidation, LengthPastThePages) {
  PagedCall c;
  c.seqlens.set(0, 48);  // 3 pages of 16 hold 48 keys: one more does not fit
  expect_refused<flashtile::InvalidArgument>(c, {"cache_seqlens[0] = 48", "max_pages"});
}

TEST(KvCacheValidation, SharedPageWrittenByOneAndReadByAnother) {
  PagedCall c;
  c.table.set(1 * 3 + 0, 4);  // both sequences' first page is page 4; sequence 1 reads its rows 0..15,
  c.seqlens.set(0, 3);        // sequence 0 appends at its row 3
  expect_refused<flashtile::InvalidArgument>(c, {"block_table", "page 4", "sequence 0 appends"});
}

TEST(KvCacheValidation, OnePageTwiceInOneSequence) {
  PagedCall c;
  c.table.set(1 * 3 + 1, 2);  // sequence 1's pages {2, 2}: its append (key 20, page 2 row 4) would overwrite key 4
  expect_refused<flashtile::InvalidArgument>(c, {"block_table", "page 2", "same sequence"});
}

TEST(KvCacheValidation, SharedPrefixPageReadByBothRuns) {
  PagedCall c;
  c.table.set(1 * 3 + 0, 4);  // a shared prefix page, full (16 rows) and only read: allowed
  c.seqlens.set(0, 18);
  c.seqlens.set(1, 20);
  c.run();
}

TEST(KvCacheValidation, BatchIndexWithBlockTable) {
  PagedCall c;
  Tensor idx(DType::int32, {2});
  c.cache.cache_batch_idx = idx.view();
  expect_refused<flashtile::InvalidArgument>(c, {"cache_batch_idx", "block_table"});
}

TEST(KvCacheValidation, SameMemoryForKAndV) {
  Call c;
  c.cache.v_cache = c.cache.k_cache;
  expect_refused<flashtile::InvalidArgument>(c, {"v_cache", "k_cache"});
}

TEST(KvCacheValidation, OutputInsideTheCache) {
  Call c;
  flashtile::TensorView o = c.k_cache.view();
  o.shape = {2, 1, 4, 16};
  o.stride = {16 * 4, 16 * 4, 16, 1};
  c.run();  // valid first: then out aliases the cache
  flashtile::Options opts;
  EXPECT_THROW(flashtile::forward_kvcache(c.q.view(), c.cache, o, c.lse.view(), opts), flashtile::InvalidArgument);
}

TEST(KvCacheValidation, NegativeSplits) {
  Call c;
  c.cache.num_splits = -2;
  expect_refused<flashtile::InvalidArgument>(c, {"num_splits", "-2"});
}

TEST(KvCacheValidation, VarlenOptionsRefused) {
  Call c;
  Tensor cu(DType::int32, {3});
  c.options.cu_seqlens_q = cu.view();
  expect_refused<flashtile::InvalidArgument>(c, {"cu_seqlens_q", "forward_kvcache"});
}

TEST(KvCacheValidation, MaxSeqlenBelowALength) {
  Call c;
  c.options.max_seqlen_k = 15;  // sequence 1 holds 21 keys after the append
  expect_refused<flashtile::InvalidArgument>(c, {"max_seqlen_k", "21"});
}

TEST(KvCacheValidation, ExplainReportsSplitsAndWritesNothing) {
  Call c;
  c.cache.num_splits = 2;
  const auto k = c.k_cache.to_double();
  const auto r = flashtile::explain_forward_kvcache(c.q.view(), c.cache, c.out.view(), c.lse.view(), c.options);
  EXPECT_EQ(r.ran.kernel, "cpu_flash_decode");
  EXPECT_EQ(r.ran.splits, 2);
  EXPECT_NE(r.to_string().find("splits=2"), std::string::npos) << r.to_string();
  EXPECT_EQ(c.k_cache.to_double(), k);
}

TEST(KvCacheValidation, WorkspaceBytesValidatesAndIsZeroOnTheCpu) {
  Call c;
  EXPECT_EQ(flashtile::forward_kvcache_workspace_bytes(c.q.view(), c.cache, c.out.view(), c.lse.view(), c.options),
            0u);
  c.seqlens.set(1, 32);  // the call's own refusal, before any backend is asked
  EXPECT_THROW(flashtile::forward_kvcache_workspace_bytes(c.q.view(), c.cache, c.out.view(), c.lse.view(), c.options),
               flashtile::InvalidArgument);
}

TEST(KvCacheValidation, LseIsOptional) {
  Call c;
  EXPECT_NO_THROW(flashtile::forward_kvcache(c.q.view(), c.cache, c.out.view(), {}, c.options));
}

}  // namespace
}  // namespace ft_test
