// forward_kvcache on the CUDA backend under test (device.h gpu_backend()) against the float64 oracle, with
// tests/test_kvcache.cpp's cases and cache builder: the cache is built on the host (contiguous with permuted
// slots or paged with shuffled pages, every row the call must not read NaN), copied to the device, and after the
// call out, lse and the whole cache come back: out and lse against the oracle with the tolerance rule of
// expect_var_close (twice standard attention's error in the same precision), the cache element for element
// against the copy the test expects (the appended rows written, nothing else touched).
// Also: device-side index refusals (typed error, cache and out unchanged), a CUDA graph captured once and
// replayed with new cache_seqlens, block table and data uploaded between replays, and NaN / Inf inputs.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

// test_kvcache.cpp's KvCase, build_cache(), same_contents(), call_options(), cases() and drawn_cases() are reused
// as they are (one definition of the cache the tests build). Its instantiations are switched off here: the CPU
// suite runs them; in this binary its TEST_P stays uninstantiated, which GoogleTest is told is intended.
#pragma push_macro("INSTANTIATE_TEST_SUITE_P")
#undef INSTANTIATE_TEST_SUITE_P
#define INSTANTIATE_TEST_SUITE_P(prefix, suite, ...) static_assert(true)
#include "test_kvcache.cpp"
#pragma pop_macro("INSTANTIATE_TEST_SUITE_P")

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "device.h"

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(KvCache);

namespace ft_gpu {
namespace {

using flashtile::DType;
using flashtile::KVCache;
using ft_test::Cache;
using ft_test::KvCase;
using ft_test::VarCase;
using ft_test::VarProblem;

// The backend under test for a forward_kvcache case: cuda-sm90 runs the calls of more than 16 packed rows (G · Sq)
// on its wgmma kernel and refuses the others (Sm90TakesTheTallTilesOnly below), so with FT_GPU_BACKEND=cuda-sm90
// those run cuda-sm80's mma.sync kernel, as auto does.
std::string kvcache_backend(const VarCase& c) {
  const std::string b = gpu_backend();
  return b == "cuda-sm90" && c.hq / c.hkv * c.sq <= 16 ? "cuda-sm80" : b;
}

std::unique_ptr<DevTensor> dev(const ft_test::Tensor& t) { return std::make_unique<DevTensor>(t); }
std::unique_ptr<DevTensor> dev(const std::unique_ptr<ft_test::Tensor>& t) { return t ? dev(*t) : nullptr; }
flashtile::TensorView view(const std::unique_ptr<DevTensor>& t) { return t ? t->view() : flashtile::TensorView{}; }

// Every operand of one call on the device; out and lse start as NaN.
struct DevCall {
  std::unique_ptr<DevTensor> q, out, lse, k, v, k_new, v_new, seqlens, table, slots, alibi, sinks;
  std::string backend;  // kvcache_backend()
  DevCall(VarProblem& p, const Cache& c) : backend(kvcache_backend(p.c)) {
    p.out->fill(std::numeric_limits<double>::quiet_NaN());
    p.lse->fill(std::numeric_limits<double>::quiet_NaN());
    q = dev(*p.q);
    out = dev(*p.out);
    lse = dev(*p.lse);
    upload_cache(c);
    alibi = dev(p.alibi);
    sinks = dev(p.sinks);
  }
  void upload_cache(const Cache& c) {
    auto put = [](std::unique_ptr<DevTensor>& d, const std::unique_ptr<ft_test::Tensor>& h) {
      if (!h) return;
      if (d) d->upload(*h);
      else d = dev(h);
    };
    put(k, c.k);
    put(v, c.v);
    put(k_new, c.k_new);
    put(v_new, c.v_new);
    put(seqlens, c.seqlens);
    put(table, c.table);
    put(slots, c.slots);
  }
  // New data of the same shapes into the same device memory (graph replays).
  void upload(VarProblem& p, const Cache& c) {
    p.out->fill(std::numeric_limits<double>::quiet_NaN());
    p.lse->fill(std::numeric_limits<double>::quiet_NaN());
    q->upload(*p.q);
    out->upload(*p.out);
    lse->upload(*p.lse);
    upload_cache(c);
    if (alibi) alibi->upload(*p.alibi);
    if (sinks) sinks->upload(*p.sinks);
  }
  KVCache cache(int splits) const {
    KVCache kv;
    kv.k_cache = k->view();
    kv.v_cache = v->view();
    kv.k_new = view(k_new);
    kv.v_new = view(v_new);
    kv.cache_seqlens = view(seqlens);
    kv.block_table = view(table);
    kv.cache_batch_idx = view(slots);
    kv.num_splits = splits;
    return kv;
  }
  flashtile::Options options(const VarProblem& p) const {
    flashtile::Options o = ft_test::call_options(p);
    o.alibi_slopes = view(alibi);
    o.sinks = view(sinks);
    o.backend = backend;
    o.strict = true;
    return o;
  }
  flashtile::DispatchReport explain(int splits, const flashtile::Options& o) const {
    return flashtile::explain_forward_kvcache(q->view(), cache(splits), out->view(), lse->view(), o);
  }
  flashtile::DispatchReport run(int splits, const flashtile::Options& o, bool async_check = false) const {
    flashtile::KVCache kv = cache(splits);
    kv.async_index_check = async_check;
    return flashtile::forward_kvcache(q->view(), kv, out->view(), lse->view(), o);
  }
  // The reason when this build holds no decode kernel for the call (FLASHTILE_CUDA_KERNELS subsets), else empty.
  std::string not_built(int splits, flashtile::Options o) const {
    o.strict = false;
    const auto r = flashtile::explain_forward_kvcache(q->view(), cache(splits), out->view(), lse->view(), o);
    for (const auto& ref : r.refused)
      for (const auto& why : ref.reasons)
        if (ref.backend == backend && why.find("not built in this build") != std::string::npos) return why;
    return {};
  }
  // out, lse and the caches back into the host tensors.
  void download(VarProblem& p, Cache& c) const {
    out->download(*p.out);
    lse->download(*p.lse);
    k->download(*c.k);
    v->download(*c.v);
  }
};

// The CPU cases in a GPU dtype (float32 cases alternate bf16 / fp16), on the default path.
KvCase on_gpu(KvCase k, int i) {
  if (k.v.dtype == DType::float32) {
    k.v.dtype = i % 2 == 0 ? DType::bfloat16 : DType::float16;
    k.v.label += i % 2 == 0 ? "_as_bf16" : "_as_fp16";
  }
  k.v.label = "Cpu" + k.v.label;
  k.isa.clear();
  return k;
}

// Block-table columns that put a call of 3 or more sequences past the one-CTA index check (16384 entries,
// src/cuda/decode/params.h kOneCtaMaxChecks); the cases that use it assert the report's "grid-wide".
constexpr std::int64_t kGridCheckColumns = 5500;

// The GPU's own grid: contiguous and paged (16, 64, 256), with and without append, Sq 1..16, GQA 1/4/8, splits
// 0/1/3, head dims 64 and 128, both dtypes, and every variant once per six cases.
std::vector<KvCase> gpu_grid() {
  std::vector<KvCase> out;
  int i = 0;
  for (std::int64_t page : {0, 16, 64, 256}) {
    for (bool append : {false, true}) {
      for (std::int64_t sq : {1, 2, 5, 16}) {
        const std::int64_t g = std::array<std::int64_t, 3>{1, 4, 8}[static_cast<std::size_t>(i % 3)];
        const int splits = std::array<int, 3>{0, 1, 3}[static_cast<std::size_t>(i / 3 % 3)];
        const std::int64_t d = i % 2 == 0 ? 128 : 64;
        const DType t = i / 2 % 2 == 0 ? DType::bfloat16 : DType::float16;
        const std::vector<std::int64_t> lens{37 + 97 * i % 1500, 1100 - 31 * i, 16 + i};
        std::string label = "Grid" + std::to_string(i) + "_page" + std::to_string(page) + (append ? "_append" : "") +
                            "_sq" + std::to_string(sq) + "_g" + std::to_string(g) + "_splits" +
                            std::to_string(splits) + "_d" + std::to_string(d) +
                            (t == DType::bfloat16 ? "_bf16" : "_fp16");
        KvCase k = ft_test::kv(ft_test::var("", 3, sq, lens, 2 * g, 2, d, d, t), append ? std::min<std::int64_t>(sq, 4) : 0,
                               page);
        const int variant = i % 6;
        if (variant == 1 || variant == 5) k.v.causal = true;
        if (variant == 2) k.v.window = {100, 0};
        if (variant == 3) k.v.softcap = 20.0f, k.v.data_scale = 3.0;
        if (variant == 4) k.v.alibi = 1 + i % 2;
        if (variant == 5) k.v.sinks = true;
        label += std::array<const char*, 6>{"", "_causal", "_window", "_softcap", "_alibi", "_sinks_causal"}[
            static_cast<std::size_t>(variant)];
        k.slots = page == 0 && i % 4 == 1;
        k.splits = splits;
        k.v.label = label;
        out.push_back(k);
        ++i;
      }
    }
  }
  // A long sequence, automatic splits (one KV head: the SMs need many), paged 64, GQA 8.
  KvCase longseq = ft_test::kv(ft_test::var("Long40k_auto_splits_paged64_g8", 1, 1, {40000}, 8, 1, 128, 128,
                                            DType::bfloat16), 1, 64);
  longseq.expect_split = true;
  out.push_back(longseq);
  // One split over long sequences with small pages: each copier warp crosses several of its 32-group windows of
  // block-table entries (kernel_parts.h KvLoader::place), with the append in the last one.
  KvCase windows = ft_test::kv(ft_test::var("Long5k_one_split_paged16_g4", 2, 1, {5000, 2300}, 8, 2, 128, 128,
                                            DType::bfloat16), 1, 16);
  windows.splits = 1;
  out.push_back(windows);
  // Issue 14's shape (GQA 32/8, hdim 128) with 16 new tokens (speculative decoding), paged 64, causal.
  KvCase spec = ft_test::kv(ft_test::var("Gqa32x8_sq16_paged64_causal", 2, 16, {4100, 3000}, 32, 8, 128, 128,
                                         DType::bfloat16), 16, 64);
  spec.v.causal = true;
  out.push_back(spec);
  // A block table wide enough (8 sequences x 2100 columns) for the grid-wide index check (a memset and a grid,
  // the decode kernel publishing the verdict); every case above takes the one-CTA check (the test asserts which
  // ran from the report).
  KvCase wide = ft_test::kv(ft_test::var("Gqa32x8_sq16_b8_paged16_GridWideCheck", 8, 16,
                                         {300, 17, 640, 129, 64, 1000, 16, 450}, 32, 8, 128, 128, DType::float16),
                            16, 16);
  wide.unreached_columns = kGridCheckColumns;
  wide.v.causal = true;
  out.push_back(wide);
  return out;
}

std::vector<KvCase> all_cases() {
  std::vector<KvCase> out = gpu_grid();
  int i = 0;
  for (const KvCase& k : ft_test::cases()) out.push_back(on_gpu(k, i++));
  for (const KvCase& k : ft_test::drawn_cases()) out.push_back(on_gpu(k, i++));
  return out;
}

class GpuKvCache : public ::testing::TestWithParam<KvCase> {};

TEST_P(GpuKvCache, MatchesOracleAndAppendsInPlace) {
  FT_REQUIRE_GPU();
  const KvCase& kc = GetParam();
  auto rng = ft_test::test_rng();
  VarProblem p(kc.v, rng);
  Cache cache = ft_test::build_cache(kc, p, rng);
  const DevCall d(p, cache);
  if (const std::string why = d.not_built(kc.splits, d.options(p)); !why.empty()) GTEST_SKIP() << why;
  const auto report = d.run(kc.splits, d.options(p));
  FT_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(report.ran.backend, d.backend) << report.to_string();
  EXPECT_NE(report.ran.kernel.find("decode"), std::string::npos) << report.to_string();
  EXPECT_NE(report.ran.detail.find("splits="), std::string::npos) << report.to_string();
  if (kc.splits > 0) {
    EXPECT_EQ(report.ran.splits, kc.splits) << report.to_string();
  }
  if (kc.expect_split) {
    EXPECT_GT(report.ran.splits, 1) << report.to_string();
  }
  const bool grid_check = kc.v.label.find("GridWideCheck") != std::string::npos;
  EXPECT_NE(report.ran.detail.find(grid_check ? "index check: device-side, grid-wide" : "index check: device-side, one CTA"),
            std::string::npos) << report.to_string();
  d.download(p, cache);
  ft_test::expect_var_close(p, ft_test::var_oracle(p, false), ft_test::var_standard(p, false), false);
  EXPECT_TRUE(ft_test::same_contents(cache.k->to_double(), cache.k_after)) << "k_cache";
  EXPECT_TRUE(ft_test::same_contents(cache.v->to_double(), cache.v_after)) << "v_cache";
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuKvCache, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<KvCase>& i) { return i.param.v.label; });

// A base case for the refusals and the graph: paged 64, one appended token, GQA 4, three sequences.
KvCase paged_case(std::vector<std::int64_t> lens, std::int64_t page = 64, std::int64_t snew = 1) {
  KvCase k = ft_test::kv(ft_test::var("base", 3, snew, std::move(lens), 8, 2, 128, 128, DType::bfloat16), snew, page);
  return k;
}

// Each bad device-side index is refused with the CPU validation's typed error (argument and value named), and the
// cache, out and lse are as they were. With grid_check the block table is wide enough for the grid-wide check
// (else the one-CTA one runs), and 160 new tokens are appended by many CTAs of the decode kernel.
void expect_refusals(std::int64_t snew, bool grid_check) {
  struct Bad {
    std::string what;      // expected in the message
    bool paged;
    std::function<void(Cache&)> spoil;  // on the host copy, uploaded before the call
    std::int64_t max_seqlen_k = 0;
  };
  const std::vector<Bad> bad = {
      {"cache_seqlens[1] = -3 is negative", true, [](Cache& c) { c.seqlens->set(1, -3); }},
      {"cache_seqlens[2] = 1000000000 plus " + std::to_string(snew) + " new keys exceeds", true,
       [](Cache& c) { c.seqlens->set(2, 1e9); }},
      {"block_table[1][0] = -1 is outside", true, [](Cache& c) { c.table->set(c.table->view().shape[1], -1); }},
      {"block_table[1][0] = 1000000 is outside", true,
       [](Cache& c) { c.table->set(c.table->view().shape[1], 1000000); }},
      {"cache_batch_idx[2] = -5 is outside", false, [](Cache& c) { c.slots->set(2, -5); }},
      {"cache_batch_idx[0] = 1000 is outside", false, [](Cache& c) { c.slots->set(0, 1000); }},
      {"max_seqlen_k: 500 is smaller than the longest sequence's 700", true, [](Cache&) {}, 500},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.what + " (" + std::to_string(snew) + " new tokens)");
    KvCase kc = paged_case({700, 170, 513}, b.paged ? 64 : 0, snew);
    kc.slots = !b.paged;
    if (grid_check && !b.paged) continue;  // a contiguous cache has one entry per sequence: always one CTA
    if (grid_check) kc.unreached_columns = kGridCheckColumns;
    auto rng = ft_test::test_rng();
    VarProblem p(kc.v, rng);
    Cache cache = ft_test::build_cache(kc, p, rng);
    const std::vector<double> k_before = cache.k->to_double(), v_before = cache.v->to_double();
    b.spoil(cache);
    const DevCall d(p, cache);
    p.out->fill(0.0);  // a value the kernels never leave: a write of any kind would show
    p.lse->fill(0.0);
    d.out->upload(*p.out);
    d.lse->upload(*p.lse);
    flashtile::Options o = d.options(p);
    if (const std::string why = d.not_built(0, o); !why.empty()) GTEST_SKIP() << why;
    o.max_seqlen_k = b.max_seqlen_k;
    EXPECT_NE(d.explain(0, o).ran.detail.find(grid_check ? "grid-wide" : "one CTA"), std::string::npos);
    try {
      d.run(0, o);
      ADD_FAILURE() << "not refused";
    } catch (const flashtile::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(b.what), std::string::npos) << e.what();
    }
    FT_CUDA_OK(cudaDeviceSynchronize());
    d.download(p, cache);
    EXPECT_TRUE(ft_test::same_contents(cache.k->to_double(), k_before)) << "k_cache";
    EXPECT_TRUE(ft_test::same_contents(cache.v->to_double(), v_before)) << "v_cache";
    for (double x : p.out->to_double()) ASSERT_EQ(x, 0.0) << "out was written";
    for (double x : p.lse->to_double()) ASSERT_EQ(x, 0.0) << "lse was written";

    // async_index_check: no wait for the verdict, so no error; the cache is still unchanged and out, lse are NaN.
    EXPECT_NO_THROW(d.run(0, o, true));
    FT_CUDA_OK(cudaDeviceSynchronize());
    d.download(p, cache);
    EXPECT_TRUE(ft_test::same_contents(cache.k->to_double(), k_before)) << "k_cache (async check)";
    EXPECT_TRUE(ft_test::same_contents(cache.v->to_double(), v_before)) << "v_cache (async check)";
    for (double x : p.out->to_double()) ASSERT_TRUE(std::isnan(x)) << "out (async check) not NaN";
    for (double x : p.lse->to_double()) ASSERT_TRUE(std::isnan(x)) << "lse (async check) not NaN";
  }
}

TEST(GpuKvCacheRefusal, BadDeviceIndicesLeaveEverythingUnchanged) {
  FT_REQUIRE_GPU();
  expect_refusals(1, false);
}

TEST(GpuKvCacheRefusal, BadDeviceIndicesLeaveEverythingUnchangedGridCheck) {
  FT_REQUIRE_GPU();
  expect_refusals(160, true);
}

// Serving code captures a decode step once and replays it: the call is captured on a stream (no host
// synchronisation, split count from max_seqlen_k), then replayed with new lengths, block tables, keys and queries
// uploaded into the same device memory between replays; each replay gives the oracle's answer for its data. A
// replay with a bad length leaves the cache unchanged and NaN in out (the check is device-side only under capture).
void capture_and_replay(bool caller_workspace) {
  // Lengths with the same page count per sequence (11, 1 and 9 pages of 64), so that every round's cache, block
  // table and operands have the shapes of the captured call.
  const std::vector<std::vector<std::int64_t>> rounds = {{650, 20, 530}, {704, 64, 576}, {641, 1, 513}};
  auto rng = ft_test::test_rng();
  std::vector<std::unique_ptr<VarProblem>> problems;
  std::vector<Cache> caches;
  for (const auto& lens : rounds) {
    KvCase kc = paged_case(lens);
    kc.v.causal = true;
    problems.push_back(std::make_unique<VarProblem>(kc.v, rng));
    caches.push_back(ft_test::build_cache(kc, *problems.back(), rng));
  }
  DevCall d(*problems[0], caches[0]);
  if (const std::string why = d.not_built(0, d.options(*problems[0])); !why.empty()) GTEST_SKIP() << why;
  cudaStream_t stream = nullptr;
  FT_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* ws = nullptr;
  flashtile::Options o = d.options(*problems[0]);
  o.cuda_stream = stream;
  o.max_seqlen_k = 704;  // the bound the splits are sized from
  if (caller_workspace) {  // exactly what the call asks for
    o.workspace_bytes = flashtile::forward_kvcache_workspace_bytes(d.q->view(), d.cache(0), d.out->view(),
                                                                   d.lse->view(), o);
    EXPECT_GT(o.workspace_bytes, 0u);
    FT_CUDA_OK(cudaMalloc(&ws, o.workspace_bytes));
    o.workspace = ws;
  }
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  FT_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  flashtile::DispatchReport report;
  try {
    report = d.run(0, o);
  } catch (const flashtile::Error& e) {
    cudaStreamEndCapture(stream, &graph);
    FAIL() << "capture: " << e.what();
  }
  FT_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  EXPECT_GT(report.ran.splits, 1) << report.to_string();  // the split merge runs in the replays too
  FT_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (std::size_t r = 0; r < rounds.size(); ++r) {
    SCOPED_TRACE("replay " + std::to_string(r));
    VarProblem& p = *problems[r];
    d.upload(p, caches[r]);
    FT_CUDA_OK(cudaGraphLaunch(exec, stream));
    FT_CUDA_OK(cudaStreamSynchronize(stream));
    d.download(p, caches[r]);
    ft_test::expect_var_close(p, ft_test::var_oracle(p, false), ft_test::var_standard(p, false), false);
    EXPECT_TRUE(ft_test::same_contents(caches[r].k->to_double(), caches[r].k_after)) << "k_cache";
    EXPECT_TRUE(ft_test::same_contents(caches[r].v->to_double(), caches[r].v_after)) << "v_cache";
  }
  {  // A bad length under replay: nothing appended, out and lse NaN.
    SCOPED_TRACE("replay with cache_seqlens[0] = -1");
    VarProblem& p = *problems[0];
    Cache& c = caches[0];
    const std::vector<double> k_before = c.k->to_double(), v_before = c.v->to_double();
    c.seqlens->set(0, -1);
    d.upload(p, c);
    p.out->fill(0.0);  // not NaN before the replay, so that the NaN after it is the kernels'
    p.lse->fill(0.0);
    d.out->upload(*p.out);
    d.lse->upload(*p.lse);
    FT_CUDA_OK(cudaGraphLaunch(exec, stream));
    FT_CUDA_OK(cudaStreamSynchronize(stream));
    d.download(p, c);
    EXPECT_TRUE(ft_test::same_contents(c.k->to_double(), k_before)) << "k_cache";
    EXPECT_TRUE(ft_test::same_contents(c.v->to_double(), v_before)) << "v_cache";
    for (double x : p.out->to_double()) ASSERT_TRUE(std::isnan(x));
    for (double x : p.lse->to_double()) ASSERT_TRUE(std::isnan(x));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  if (ws != nullptr) cudaFree(ws);
}

TEST(GpuKvCacheGraph, CaptureAndReplayWithChangingSeqlens) {
  FT_REQUIRE_GPU();
  capture_and_replay(false);
}

TEST(GpuKvCacheGraph, CaptureAndReplayWithCallerWorkspace) {
  FT_REQUIRE_GPU();
  capture_and_replay(true);
}

// cuda-sm90 takes the calls of more than 16 packed rows (its wgmma kernel's 64-row tiles) and refuses the others
// with the reason, which auto then runs on cuda-sm80.
// tests/test_kvcache.cpp's NaN and Inf case on the device: the 16-row kernel (Sq = 1, GQA 4) and the 64-row ones
// (Sq = 16), out and lse against the float64 oracle's NaN pattern. Without the NaN value of a key hidden by the
// causal mask: the tensor-core products may carry it into rows of the same tile (docs/semantics.md, known
// differences).
TEST(GpuKvCacheEdge, NaNAndInfReachExactlyTheRowsThatSeeThem) {
  FT_REQUIRE_GPU();
  for (const DType t : {DType::bfloat16, DType::float16})
    for (const std::int64_t sq : {1, 16}) {
      SCOPED_TRACE(std::string(flashtile::dtype_name(t)) + " Sq " + std::to_string(sq));
      auto rng = ft_test::test_rng();
      ft_test::NonFiniteCase c = ft_test::nonfinite_case(t, sq, rng, /*hidden_nan=*/false);
      const DevCall d(*c.p, c.cache);
      if (const std::string why = d.not_built(0, d.options(*c.p)); !why.empty()) GTEST_SKIP() << why;
      const auto report = d.run(0, d.options(*c.p));
      FT_CUDA_OK(cudaDeviceSynchronize());
      EXPECT_EQ(report.ran.backend, d.backend) << report.to_string();
      d.download(*c.p, c.cache);
      ft_test::expect_nonfinite_results(*c.p);
    }
}

// Options::sm_margin: the automatic split plan spreads the CTAs over the SMs the call may use, says so, and the
// result still matches the oracle.
TEST(GpuKvCacheSplits, SmMarginShrinksTheAutomaticPlan) {
  FT_REQUIRE_GPU();
  KvCase kc = paged_case({3000, 2000, 4000}, 64, 1);
  auto rng = ft_test::test_rng();
  VarProblem p(kc.v, rng);
  Cache cache = ft_test::build_cache(kc, p, rng);
  const DevCall d(p, cache);
  if (const std::string why = d.not_built(0, d.options(p)); !why.empty()) GTEST_SKIP() << why;
  int dev = 0, sms = 0;
  FT_CUDA_OK(cudaGetDevice(&dev));
  FT_CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  ASSERT_GT(sms, 8);
  const auto full = d.explain(0, d.options(p));
  flashtile::Options o = d.options(p);
  o.sm_margin = sms - 8;
  const auto report = d.run(0, o);
  FT_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_NE(report.ran.detail.find("on 8 SMs (the device's less sm_margin = " + std::to_string(sms - 8) + ")"),
            std::string::npos) << report.to_string();
  EXPECT_LT(report.ran.splits, full.ran.splits) << report.to_string() << "\n" << full.to_string();
  d.download(p, cache);
  ft_test::expect_var_close(p, ft_test::var_oracle(p, false), ft_test::var_standard(p, false), false);
  EXPECT_TRUE(ft_test::same_contents(cache.k->to_double(), cache.k_after)) << "k_cache";
}

TEST(GpuKvCacheDispatch, Sm90TakesTheTallTilesOnly) {
  FT_REQUIRE_GPU();
  for (const std::int64_t sq : {1, 16}) {  // GQA 4: 4 and 64 packed rows
    SCOPED_TRACE("Sq = " + std::to_string(sq));
    KvCase kc = paged_case({100, 37, 64}, 64, sq);
    auto rng = ft_test::test_rng();
    VarProblem p(kc.v, rng);
    Cache cache = ft_test::build_cache(kc, p, rng);
    const DevCall d(p, cache);
    flashtile::Options o = d.options(p);
    o.backend = "auto";
    o.strict = false;
    const auto r = flashtile::explain_forward_kvcache(d.q->view(), d.cache(0), d.out->view(), d.lse->view(), o);
    const auto sm90 =
        std::find_if(r.refused.begin(), r.refused.end(), [](const auto& x) { return x.backend == "cuda-sm90"; });
    if (sq == 1) {
      EXPECT_EQ(r.ran.backend, "cuda-sm80") << r.to_string();
      // cuda-sm90 hands the call over by design: strict auto runs it on cuda-sm80 and calls nothing a fall-back.
      o.strict = true;
      const auto strict = flashtile::forward_kvcache(d.q->view(), d.cache(0), d.out->view(), d.lse->view(), o);
      EXPECT_EQ(strict.ran.backend, "cuda-sm80") << strict.to_string();
      EXPECT_FALSE(strict.fell_back) << strict.to_string();
      if (sm90 == r.refused.end()) GTEST_SKIP() << "cuda-sm90 is not in this build: " << r.to_string();
      EXPECT_TRUE(std::any_of(sm90->reasons.begin(), sm90->reasons.end(), [](const std::string& why) {
        return why.find("G·Sq = 4 packed rows <= 16") != std::string::npos;
      })) << r.to_string();
    } else if (r.ran.backend == "cuda-sm90") {
      EXPECT_NE(r.ran.kernel.find("sm90_decode_"), std::string::npos) << r.to_string();
      EXPECT_NE(r.ran.detail.find("wgmma reads each K and V tile once"), std::string::npos) << r.to_string();
    } else {  // not Hopper, or the wgmma kernel not built: the reason says which
      EXPECT_TRUE(sm90 != r.refused.end()) << r.to_string();
    }
  }
}

}  // namespace
}  // namespace ft_gpu
