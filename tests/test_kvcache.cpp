// forward_kvcache (include/flashtile/kvcache.h) against the float64 oracle.
//
// Each case starts from a dense problem (tests/variants.h: q, K/V [B, Lmax, Hkv, D] with seqused_k = L_b and the
// variant options), whose oracle and standard attention are the reference. The test then builds the cache itself
// (contiguous with permuted slots, or paged with shuffled pages), copying the first L_b − Snew keys of each
// sequence into it and handing the last Snew to the call as k_new / v_new; every cache row the call must not read
// holds NaN. After the call: out and lse against the oracle, and the cache against the copy the test expects
// (the appended rows written, every other element untouched). The gathering here is the test's own code: the
// library's kv_row() is what is under test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "flashtile/flashtile.h"
#include "support.h"
#include "variants.h"

namespace ft_test {
namespace {

using flashtile::KVCache;

struct KvCase {
  VarCase v;                      // v.sk = the longest L_b; v.seqused_k = every L_b
  std::int64_t snew = 0;          // keys appended by the call (<= every L_b)
  std::int64_t page = 0;          // 0: contiguous cache
  std::int64_t unreached_columns = 1;  // paged: block-table columns past every sequence (garbage entries)
  bool slots = false;             // contiguous: cache_batch_idx permutes the sequences over more slots than B
  bool full = false;              // no cache_seqlens: every sequence fills its cache (contiguous, L_b = capacity)
  int splits = 0;
  bool expect_split = false;      // automatic splits must cut this case's keys into several parts
  std::string isa;                // empty: the default path
};
void PrintTo(const KvCase& c, std::ostream* os) { *os << c.v.label; }

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The cache the test builds, and what it must hold after the call.
struct Cache {
  std::unique_ptr<Tensor> k, v, k_new, v_new, seqlens, table, slots;
  std::vector<double> k_after, v_after;  // expected contents after the call (logical order; NaN compares as NaN)
  KVCache view() const {
    KVCache c;
    c.k_cache = k->view();
    c.v_cache = v->view();
    if (seqlens) c.cache_seqlens = seqlens->view();
    if (table) c.block_table = table->view();
    if (slots) c.cache_batch_idx = slots->view();
    if (k_new) {
      c.k_new = k_new->view();
      c.v_new = v_new->view();
    }
    return c;
  }
};

Cache build_cache(const KvCase& kc, const VarProblem& p, std::mt19937_64& rng) {
  const VarCase& c = kc.v;
  const std::int64_t B = c.b, H = c.hkv;
  Cache cache;
  std::vector<std::int64_t> len(static_cast<std::size_t>(B));
  for (std::int64_t b = 0; b < B; ++b) len[static_cast<std::size_t>(b)] = p.len_k(b);
  // Where key j of sequence b lives: (slot or page, row).
  std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> where(static_cast<std::size_t>(B));
  std::int64_t slots = B, rows = 0;
  if (kc.page > 0) {
    std::int64_t pages = 0, max_pages = 0;
    for (std::int64_t L : len) pages += (L + kc.page - 1) / kc.page, max_pages = std::max(max_pages, (L + kc.page - 1) / kc.page);
    pages += 3;  // pages no sequence uses
    max_pages += kc.unreached_columns;  // columns no sequence reaches (their entries are garbage on purpose)
    std::vector<std::int64_t> perm(static_cast<std::size_t>(pages));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    cache.table = std::make_unique<Tensor>(DType::int32, std::vector<std::int64_t>{B, max_pages});
    cache.table->fill(-7.0);
    std::size_t next = 0;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t * kc.page < len[static_cast<std::size_t>(b)]; ++t) {
        const std::int64_t pg = perm[next++];
        cache.table->set(b * max_pages + t, static_cast<double>(pg));
        for (std::int64_t j = t * kc.page; j < std::min(len[static_cast<std::size_t>(b)], (t + 1) * kc.page); ++j)
          where[static_cast<std::size_t>(b)].push_back({pg, j - t * kc.page});
      }
    slots = pages;
    rows = kc.page;
  } else {
    rows = c.sk + 5;  // capacity past the longest sequence
    std::vector<std::int64_t> slot(static_cast<std::size_t>(B));
    std::iota(slot.begin(), slot.end(), 0);
    if (kc.slots) {
      slots = B + 2;
      std::vector<std::int64_t> all(static_cast<std::size_t>(slots));
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      std::copy_n(all.begin(), B, slot.begin());
      cache.slots = std::make_unique<Tensor>(DType::int32, std::vector<std::int64_t>{B});
      for (std::int64_t b = 0; b < B; ++b) cache.slots->set(b, static_cast<double>(slot[static_cast<std::size_t>(b)]));
    }
    if (kc.full) rows = c.sk;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t j = 0; j < len[static_cast<std::size_t>(b)]; ++j)
        where[static_cast<std::size_t>(b)].push_back({slot[static_cast<std::size_t>(b)], j});
  }
  cache.k = std::make_unique<Tensor>(c.dtype, std::vector<std::int64_t>{slots, rows, H, c.d}, c.layout);
  cache.v = std::make_unique<Tensor>(c.dtype, std::vector<std::int64_t>{slots, rows, H, c.dv}, c.layout);
  cache.k->fill(kNaN);
  cache.v->fill(kNaN);
  cache.k_after = cache.k->to_double();
  cache.v_after = cache.v->to_double();
  if (kc.snew > 0) {
    cache.k_new = std::make_unique<Tensor>(c.dtype, std::vector<std::int64_t>{B, kc.snew, H, c.d}, c.layout);
    cache.v_new = std::make_unique<Tensor>(c.dtype, std::vector<std::int64_t>{B, kc.snew, H, c.dv}, c.layout);
  }
  if (!kc.full) {
    cache.seqlens = std::make_unique<Tensor>(DType::int32, std::vector<std::int64_t>{B});
    for (std::int64_t b = 0; b < B; ++b) cache.seqlens->set(b, static_cast<double>(len[static_cast<std::size_t>(b)] - kc.snew));
  }
  // Copy the dense problem's keys: the first L_b − Snew into the cache, the rest into k_new / v_new; the
  // expected cache holds all L_b.
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t L = len[static_cast<std::size_t>(b)];
    for (std::int64_t j = 0; j < L; ++j) {
      const auto [slot, row] = where[static_cast<std::size_t>(b)][static_cast<std::size_t>(j)];
      for (std::int64_t h = 0; h < H; ++h) {
        for (int which = 0; which < 2; ++which) {
          const Tensor& src = which == 0 ? *p.k : *p.v;
          Tensor& dst = which == 0 ? *cache.k : *cache.v;
          std::vector<double>& after = which == 0 ? cache.k_after : cache.v_after;
          Tensor* fresh = which == 0 ? cache.k_new.get() : cache.v_new.get();
          const std::int64_t dim = which == 0 ? c.d : c.dv;
          for (std::int64_t e = 0; e < dim; ++e) {
            const double x = src.get(((b * c.sk + j) * H + h) * dim + e);
            const std::int64_t at = ((slot * rows + row) * H + h) * dim + e;
            after[static_cast<std::size_t>(at)] = x;
            if (j < L - kc.snew) {
              dst.set(at, x);
            } else {
              fresh->set(((b * kc.snew + j - (L - kc.snew)) * H + h) * dim + e, x);
            }
          }
        }
      }
    }
  }
  return cache;
}

// Equal element for element, NaN matching NaN.
::testing::AssertionResult same_contents(const std::vector<double>& got, const std::vector<double>& want) {
  for (std::size_t i = 0; i < want.size(); ++i) {
    const bool both_nan = std::isnan(got[i]) && std::isnan(want[i]);
    if (!both_nan && got[i] != want[i])
      return ::testing::AssertionFailure() << "element " << i << ": " << got[i] << ", expected " << want[i];
  }
  return ::testing::AssertionSuccess();
}

flashtile::Options call_options(const VarProblem& p) {
  flashtile::Options o = p.options();
  o.seqused_k = {};  // the cache's lengths come from cache_seqlens
  return o;
}

class KvCache : public ::testing::TestWithParam<KvCase> {};

TEST_P(KvCache, MatchesOracleAndAppendsInPlace) {
  const KvCase& kc = GetParam();
  // An empty isa keeps the path the run chose (FLASHTILE_CPU_ISA of a per-ISA suite, else the best one): a
  // cleared variable here sent every listed and drawn case of those suites down the default path.
  std::optional<ScopedCpuIsa> isa;
  if (!kc.isa.empty()) {
    isa.emplace(kc.isa.c_str());
    const auto paths = flashtile::cpu_isa_paths();
    if (std::find(paths.begin(), paths.end(), kc.isa) == paths.end()) GTEST_SKIP() << kc.isa << " not runnable here";
  }
  auto rng = test_rng();
  VarProblem p(kc.v, rng);
  Cache cache = build_cache(kc, p, rng);
  KVCache kv = cache.view();
  kv.num_splits = kc.splits;
  const auto report = flashtile::forward_kvcache(p.q->view(), kv, p.out->view(), p.lse->view(), call_options(p));
  EXPECT_EQ(report.ran.backend, "cpu-flash");
  EXPECT_EQ(report.ran.kernel, "cpu_flash_decode");
  if (kc.splits > 0) {
    EXPECT_EQ(report.ran.splits, kc.splits);
  }
  if (kc.expect_split) {
    EXPECT_GT(report.ran.splits, 1) << report.to_string();
  }
  EXPECT_NE(report.ran.mask.find(kc.page > 0 ? "paged_kvcache+" : "kvcache+"), std::string::npos) << report.to_string();
  // The report names how the products ran: per row below 16 rows of a KV head (G · Sq), else a matrix product,
  // on the set's bf16 tile products (AMX tiles or dot-product pairs) for bf16 with head dims multiples of 32, in
  // float32 otherwise.
  const std::int64_t rows = kc.v.hq / kc.v.hkv * kc.v.sq;
  const std::string tiles = bf16_products_of(report.ran.isa);
  const bool on_tiles = tiles != "float32 FMAs on converted tiles" && kc.v.dtype == DType::bfloat16 &&
                        kc.v.d % 32 == 0 && kc.v.dv % 32 == 0;
  const bool row_dots = report.ran.isa == "avx512-bf16" && on_tiles;  // qk_rows_dots
  const std::string products = rows < 16 ? (row_dots ? "products: per-row dot products, Q·Kᵀ on vdpbf16ps"
                                                     : "products: per-row dot products")
                               : on_tiles ? "products: " + tiles
                                          : "products: float32 matrix";
  EXPECT_NE(report.ran.detail.find(products), std::string::npos) << report.to_string();
  expect_var_close(p, var_oracle(p, false), var_standard(p, false), false);
  EXPECT_TRUE(same_contents(cache.k->to_double(), cache.k_after)) << "k_cache";
  EXPECT_TRUE(same_contents(cache.v->to_double(), cache.v_after)) << "v_cache";
}

VarCase var(std::string label, std::int64_t b, std::int64_t sq, std::vector<std::int64_t> lens, std::int64_t hq,
            std::int64_t hkv, std::int64_t d, std::int64_t dv, DType t) {
  VarCase c;
  c.label = std::move(label);
  c.b = b;
  c.sq = sq;
  c.sk = *std::max_element(lens.begin(), lens.end());
  c.seqused_k = std::move(lens);
  c.hq = hq;
  c.hkv = hkv;
  c.d = d;
  c.dv = dv;
  c.dtype = t;
  return c;
}

KvCase kv(VarCase v, std::int64_t snew, std::int64_t page = 0) {
  KvCase k;
  k.v = std::move(v);
  k.snew = snew;
  k.page = page;
  return k;
}

std::vector<KvCase> cases() {
  std::vector<KvCase> out;
  const std::pair<DType, const char*> dtypes[] = {
      {DType::float32, "f32"}, {DType::bfloat16, "bf16"}, {DType::float16, "fp16"}};
  for (const auto& [t, tn] : dtypes) {
    const std::string s = tn;
    // Decode: one token per sequence, GQA 4, appended then attended; one split, three, automatic.
    for (int splits : {1, 3, 0}) {
      KvCase k = kv(var("Decode_" + s + "_splits" + std::to_string(splits), 3, 1, {700, 37, 513}, 8, 2, 64, 64, t), 1);
      k.splits = splits;
      out.push_back(k);
    }
    // Paged (page 16, shuffled), speculative decoding: 4 new tokens, causal, GQA 4.
    KvCase paged = kv(var("Paged16_Sq4_causal_" + s, 2, 4, {300, 45}, 8, 2, 64, 64, t), 4, 16);
    paged.v.causal = true;
    out.push_back(paged);
    // Paged 32 with a window, sinks, softcap and ALiBi; split in two.
    KvCase hooks = kv(var("Paged32_window_sinks_softcap_alibi_" + s, 2, 2, {200, 90}, 4, 1, 32, 32, t), 2, 32);
    hooks.v.window = {40, 0};
    hooks.v.sinks = true;
    hooks.v.softcap = 20.0f;
    hooks.v.alibi = 1;
    hooks.v.data_scale = 3.0;
    hooks.splits = 2;
    out.push_back(hooks);
  }
  // Contiguous cache with cache_batch_idx over more slots than sequences, strided (padded) layout.
  KvCase slots = kv(var("Slots_padded", 3, 2, {64, 17, 130}, 6, 3, 40, 24, DType::float32), 2);
  slots.slots = true;
  slots.v.layout = Layout::padded;
  slots.v.causal = true;
  out.push_back(slots);
  // No append, no cache_seqlens: the whole cache, MHA (G = 1), hdim 128 / Dv 64.
  KvCase full = kv(var("FullCache_noappend_mha", 2, 3, {150, 150}, 4, 4, 128, 64, DType::bfloat16), 0);
  full.full = true;
  out.push_back(full);
  // Many packed rows (32 tokens × G 4 = two row tiles); causal with Sq > some L_b (rows that see no key).
  KvCase tall = kv(var("TwoRowTiles_causal_short", 2, 32, {20, 300}, 8, 2, 64, 64, DType::float32), 8);
  tall.v.causal = true;
  out.push_back(tall);
  // Speculative decoding in bf16 with whole row tiles per KV head (16 tokens x G 4 = 64 rows): the matrix path,
  // on bf16 tiles where the kernel set has them (AMX or dot-product pairs); paged, causal, split in two.
  KvCase spec = kv(var("Spec16_paged16_causal_bf16", 2, 16, {300, 70}, 8, 2, 128, 128, DType::bfloat16), 16, 16);
  spec.v.causal = true;
  spec.splits = 2;
  out.push_back(spec);
  // The same path at head dim 96 (three 32-wide steps), a window, sinks and softcap, 32 rows per KV head.
  KvCase spec96 = kv(var("Spec8_d96_window_sinks_softcap_bf16", 1, 8, {200}, 8, 2, 96, 64, DType::bfloat16), 8);
  spec96.v.window = {50, 0};
  spec96.v.sinks = true;
  spec96.v.softcap = 20.0f;
  out.push_back(spec96);
  // A long sequence split automatically (2 threads, one KV head: several splits).
  KvCase longseq = kv(var("Long_auto_splits", 1, 1, {6000}, 4, 1, 64, 64, DType::bfloat16), 1);
  longseq.expect_split = true;
  out.push_back(longseq);
  // A sequence with an empty cache and nothing appended (O = 0, LSE = −inf), next to a full one.
  KvCase empty = kv(var("EmptySequence", 2, 1, {0, 77}, 2, 1, 32, 32, DType::float32), 0);
  out.push_back(empty);
  // Every ISA path this build has (scalar loops, AVX2, AVX-512 where the CPU runs it).
  for (const char* isa : {"scalar", "avx2", "avx512"}) {
    KvCase k = kv(var(std::string("Isa_") + isa, 2, 2, {129, 40}, 4, 2, 72, 40, DType::float16), 2, 16);
    k.isa = isa;
    k.splits = 2;
    out.push_back(k);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Cases, KvCache, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<KvCase>& i) { return i.param.v.label; });

// NaN and Inf in q and in the cache reach exactly the rows the semantics say, on the per-row path (Sq = 1) and the
// matrix path (Sq = 16: 64 rows per KV head; for bf16 on the set's tile products, whose blocks holding Inf or NaN
// take the float32 path): a NaN query element makes its row NaN; a NaN value in V makes that column NaN in every row
// that sees the key and in no other (the matrix path's masked P = 0 must not meet it); a +inf in K gives +inf (NaN
// row), -inf (key ignored) or NaN (0 · inf: NaN row) scores by the sign of the query element it meets. The float64
// oracle states each outcome; out and lse must match its NaN pattern, and the finite elements must stay near it.
// nonfinite_case builds the problem and its cache (tests/gpu/test_gpu_kvcache.cpp runs it on the device, without the
// hidden NaN: docs/semantics.md, "Hidden keys with non-finite values, CUDA"); expect_nonfinite_results checks what
// the call left in p.out and p.lse.
struct NonFiniteCase {
  KvCase kc;
  std::unique_ptr<VarProblem> p;
  Cache cache;
};
NonFiniteCase nonfinite_case(DType t, std::int64_t sq, std::mt19937_64& rng, bool hidden_nan = true) {
  NonFiniteCase c;
  c.kc = kv(var("NonFinite", 2, sq, {300, 90}, 8, 2, 64, 64, t), sq);
  c.kc.v.causal = true;
  c.p = std::make_unique<VarProblem>(c.kc.v, rng);
  VarProblem& p = *c.p;
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const std::int64_t S = c.kc.v.sk, H = c.kc.v.hkv, Hq = c.kc.v.hq, D = c.kc.v.d, Dv = c.kc.v.dv;
  p.q->set(((0 * sq + 0) * Hq + 1) * D + 3, nan);  // sequence 0, token 0, head 1
  p.v->set(((1 * S + 20) * H + 0) * Dv + 2, nan);  // sequence 1, key 20, KV head 0, column 2
  if (hidden_nan) p.v->set(((1 * S + 89) * H + 0) * Dv + 5, nan);  // sequence 1's last key: only its last token sees it
  p.k->set(((0 * S + 50) * H + 1) * D + 0, inf);   // sequence 0, key 50, KV head 1, element 0
  for (std::int64_t i = 0; i < sq; ++i)            // element 0 of KV head 1's query heads 4..7: +, -, 0, +
    for (std::int64_t h = 4; h < 8; ++h) p.q->set(((0 * sq + i) * Hq + h) * D + 0, h == 5 ? -1.0 : h == 6 ? 0.0 : 1.0);
  c.cache = build_cache(c.kc, p, rng);
  return c;
}
void expect_nonfinite_results(const VarProblem& p) {
  const VarResults ref = var_oracle(p, false);
  const auto out = p.out->to_double(), lse = p.lse->to_double();
  double scale = 0.0;
  for (double x : ref.out)
    if (std::isfinite(x)) scale = std::max(scale, std::abs(x));
  int nan_rows = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    ASSERT_EQ(std::isnan(out[i]), std::isnan(ref.out[i])) << "out element " << i << ": " << out[i];
    if (std::isfinite(ref.out[i])) {
      EXPECT_NEAR(out[i], ref.out[i], 0.05 * scale) << "out element " << i;
    }
  }
  for (std::size_t i = 0; i < lse.size(); ++i) {
    ASSERT_EQ(std::isnan(lse[i]), std::isnan(ref.lse[i])) << "lse element " << i << ": " << lse[i];
    nan_rows += std::isnan(ref.lse[i]) ? 1 : 0;
    if (std::isfinite(ref.lse[i])) {
      EXPECT_NEAR(lse[i], ref.lse[i], 0.05 * (1.0 + std::abs(ref.lse[i])));
    }
  }
  // The case tests what it says: the NaN query row, and the +inf and 0 · inf scores of heads 4, 6 and 7.
  EXPECT_EQ(nan_rows, static_cast<int>(1 + 3 * p.c.sq)) << "NaN rows of the oracle";
}

TEST(KvCacheEdge, NaNAndInfReachExactlyTheRowsThatSeeThem) {
  for (DType t : {DType::float32, DType::bfloat16, DType::float16})
    for (std::int64_t sq : {1, 16}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " Sq " + std::to_string(sq));
      auto rng = test_rng();
      NonFiniteCase c = nonfinite_case(t, sq, rng);
      flashtile::forward_kvcache(c.p->q->view(), c.cache.view(), c.p->out->view(), c.p->lse->view(), call_options(*c.p));
      expect_nonfinite_results(*c.p);
    }
}

// Drawn cases: lengths (0 included), Sq, GQA, head dims, page sizes, appends, splits, masks and hooks from the
// run's seed (printed by the suite; FLASHTILE_TEST_SEED replays it), each one checked like the listed cases.
std::vector<KvCase> drawn_cases() {
  std::mt19937_64 rng(run_seed() ^ 0x6b7663616368ull);
  auto u = [&](std::int64_t n) { return static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(n)); };
  std::vector<KvCase> out;
  for (int i = 0; i < 24; ++i) {
    const std::int64_t b = 1 + u(3), sq = 1 + u(5), hkv = 1 + u(3), g = std::int64_t{1} << u(3);
    const std::int64_t d = 8 * (1 + u(12)), dv = 8 * (1 + u(12));
    const std::int64_t snew = u(3) == 0 ? 0 : 1 + u(sq);
    std::vector<std::int64_t> lens;
    for (std::int64_t s = 0; s < b; ++s) lens.push_back(std::max(snew, u(4) == 0 ? u(8) : u(700)));
    const DType t = u(3) == 0 ? DType::float32 : u(2) == 0 ? DType::bfloat16 : DType::float16;
    KvCase k = kv(var("Drawn" + std::to_string(i), b, sq, lens, hkv * g, hkv, d, dv, t), snew,
                  u(2) == 0 ? 0 : 16 * (1 + u(4)));
    k.slots = k.page == 0 && u(2) == 0;
    k.splits = static_cast<int>(u(4));  // 0 = automatic
    k.v.causal = u(2) == 0;
    if (u(3) == 0) k.v.window = {u(100), k.v.causal ? 0 : u(3) - 1};
    if (u(4) == 0) k.v.softcap = 15.0f;
    if (u(4) == 0) k.v.alibi = 1 + static_cast<int>(u(2));
    k.v.sinks = u(4) == 0;
    if (u(4) == 0) k.v.layout = Layout::padded;
    out.push_back(k);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Drawn, KvCache, ::testing::ValuesIn(drawn_cases()),
                         [](const ::testing::TestParamInfo<KvCase>& i) { return i.param.v.label; });

}  // namespace
}  // namespace ft_test
