// `flashtile bench-variants`: the CPU cost of the issue-12 variants against their plain peers, in one process,
// each cell's calls interleaved run by run (so that a shared machine's load drifts over all of them alike) and
// the median taken per call. Cells:
//   window  — sliding window (4096, 0) at Sk = 32k (Sq = 32k, and Sq = 4k: the last 4k queries) vs plain causal
//             and plain full attention at Sq = Sk = 4k;
//   hooks   — softcap, ALiBi, sinks and all three vs the same causal call without them;
//   varlen  — a packed batch of mixed lengths vs equal-length batches of the same work vs the mixed batch
//             padded to its longest sequence.
// GFLOP/s counts the visible (query, key) pairs only: 2·(D + Dv) FLOP per pair and head forward, 2.5x that
// backward (the CLI's convention). --dtype picks the operands' dtype (float32 by default; bfloat16 runs the
// bf16-pair or AMX forward on the ISA paths that have one).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "flashtile/flashtile.h"
#include "problem.h"

namespace flashtile::app {
namespace {

struct Config {
  int threads = 0, iters = 3;
  std::int64_t heads = 2, hdim = 128;
  double scale = 1.0;  // sequence lengths x scale (--quick: 1/4)
  DType dtype = DType::float32;  // of q, k, v and the outputs (--dtype); bf16 runs the bf16-pair / AMX kernels
  std::vector<std::string> cells{"window", "hooks", "varlen"};
};

std::int64_t scaled(const Config& c, std::int64_t n) { return std::max<std::int64_t>(1, static_cast<std::int64_t>(static_cast<double>(n) * c.scale)); }

// One call: batched [B, Sq, H, D] or packed varlen, with its options; owns its buffers.
struct Bench {
  std::string label;
  std::vector<std::int64_t> lens_q, lens_k;  // one entry per sequence
  bool varlen = false;
  Options o;
  std::int64_t heads, d;
  std::unique_ptr<Buffer> q, k, v, out, lse, dout, dq, dk, dv, cu_q, cu_k, alibi, sinks, dsinks;
  std::vector<double> fwd_s, bwd_s;

  Bench(std::string name, std::vector<std::int64_t> lq, std::vector<std::int64_t> lk, bool packed, Options opts,
        std::int64_t h, std::int64_t dim, std::mt19937_64& rng, DType t)
      : label(std::move(name)), lens_q(std::move(lq)), lens_k(std::move(lk)), varlen(packed), o(std::move(opts)),
        heads(h), d(dim) {
    const auto nb = static_cast<std::int64_t>(lens_q.size());
    std::int64_t tq = 0, tk = 0;
    for (std::size_t b = 0; b < lens_q.size(); ++b) tq += lens_q[b], tk += lens_k[b];
    auto qs = [&] { return varlen ? std::vector<std::int64_t>{tq, h, dim} : std::vector<std::int64_t>{nb, lens_q[0], h, dim}; };
    auto ks = [&] { return varlen ? std::vector<std::int64_t>{tk, h, dim} : std::vector<std::int64_t>{nb, lens_k[0], h, dim}; };
    q = std::make_unique<Buffer>(t, qs());
    k = std::make_unique<Buffer>(t, ks());
    v = std::make_unique<Buffer>(t, ks());
    out = std::make_unique<Buffer>(t, qs());
    dout = std::make_unique<Buffer>(t, qs());
    dq = std::make_unique<Buffer>(t, qs());
    dk = std::make_unique<Buffer>(t, ks());
    dv = std::make_unique<Buffer>(t, ks());
    lse = std::make_unique<Buffer>(DType::float32, varlen ? std::vector<std::int64_t>{h, tq}
                                                          : std::vector<std::int64_t>{nb, h, lens_q[0]});
    for (Buffer* x : {q.get(), k.get(), v.get(), dout.get()}) x->fill_normal(rng);
    if (varlen) {
      cu_q = std::make_unique<Buffer>(DType::int32, std::vector<std::int64_t>{nb + 1});
      cu_k = std::make_unique<Buffer>(DType::int32, std::vector<std::int64_t>{nb + 1});
      auto* cq = static_cast<std::int32_t*>(cu_q->view().data);
      auto* ck = static_cast<std::int32_t*>(cu_k->view().data);
      cq[0] = ck[0] = 0;
      for (std::int64_t b = 0; b < nb; ++b) {
        cq[b + 1] = cq[b] + static_cast<std::int32_t>(lens_q[static_cast<std::size_t>(b)]);
        ck[b + 1] = ck[b] + static_cast<std::int32_t>(lens_k[static_cast<std::size_t>(b)]);
      }
      o.cu_seqlens_q = cu_q->view();
      o.cu_seqlens_k = cu_k->view();
      o.max_seqlen_q = *std::max_element(lens_q.begin(), lens_q.end());
      o.max_seqlen_k = *std::max_element(lens_k.begin(), lens_k.end());
    }
  }
  void with_alibi() {
    alibi = std::make_unique<Buffer>(DType::float32, std::vector<std::int64_t>{heads});
    auto* s = static_cast<float*>(alibi->view().data);
    for (std::int64_t h = 0; h < heads; ++h) s[h] = std::exp2(-8.0f * static_cast<float>(h + 1) / static_cast<float>(heads));
    o.alibi_slopes = alibi->view();
  }
  void with_sinks() {
    sinks = std::make_unique<Buffer>(DType::float32, std::vector<std::int64_t>{heads});
    dsinks = std::make_unique<Buffer>(DType::float32, std::vector<std::int64_t>{heads});
    std::fill_n(static_cast<float*>(sinks->view().data), heads, 1.0f);
    o.sinks = sinks->view();
  }
  // Visible (query, key) pairs over sequences and heads, from the definition.
  double pairs() const {
    const std::int64_t left = o.window_size[0], right = o.causal ? 0 : o.window_size[1];
    double n = 0;
    for (std::size_t b = 0; b < lens_q.size(); ++b) {
      const std::int64_t sq = lens_q[b], sk = lens_k[b];
      for (std::int64_t i = 0; i < sq; ++i) {
        const std::int64_t diag = i + sk - sq;
        const std::int64_t lo = left < 0 ? 0 : std::max<std::int64_t>(0, diag - left);
        const std::int64_t hi = right < 0 ? sk : std::min<std::int64_t>(sk, diag + right + 1);
        n += static_cast<double>(std::max<std::int64_t>(0, hi - lo));
      }
    }
    return n * static_cast<double>(heads);
  }
  double forward_flops() const { return 4.0 * static_cast<double>(d) * pairs(); }
  static double seconds(const std::function<void()>& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  void run_forward() { flashtile::forward(q->view(), k->view(), v->view(), out->view(), lse->view(), o); }
  void run_backward() {
    Options b = o;
    if (dsinks) b.dsinks = dsinks->view();
    flashtile::backward(q->view(), k->view(), v->view(), out->view(), dout->view(), lse->view(), dq->view(), dk->view(),
                        dv->view(), b);
  }
  static double median(std::vector<double> x) {
    std::sort(x.begin(), x.end());
    return x.empty() ? 0.0 : x[x.size() / 2];
  }
};

// Runs each call once as a warm-up, then `iters` rounds of forward + backward of every call in turn.
void run_cell(const char* title, std::vector<Bench>& calls, const Config& c, std::size_t peer) {
  for (Bench& b : calls) b.run_forward(), b.run_backward();
  for (int it = 0; it < c.iters; ++it)
    for (Bench& b : calls) {
      b.fwd_s.push_back(Bench::seconds([&] { b.run_forward(); }));
      b.bwd_s.push_back(Bench::seconds([&] { b.run_backward(); }));
    }
  std::printf("\n%s (peer: %s)\n", title, calls[peer].label.c_str());
  std::printf("| call | fwd s | fwd GFLOP/s | fwd time / peer | bwd s | bwd GFLOP/s | bwd time / peer |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
  const double pf = Bench::median(calls[peer].fwd_s), pb = Bench::median(calls[peer].bwd_s);
  for (const Bench& b : calls) {
    const double f = Bench::median(b.fwd_s), g = Bench::median(b.bwd_s), fl = b.forward_flops();
    std::printf("| %s | %.4f | %.1f | %.2f | %.4f | %.1f | %.2f |\n", b.label.c_str(), f, fl / f * 1e-9, f / pf, g,
                2.5 * fl / g * 1e-9, g / pb);
  }
  std::fflush(stdout);
}

Options base(const Config& c) {
  Options o;
  o.num_threads = c.threads;
  o.backend = "cpu-flash";
  o.strict = true;
  return o;
}

void window_cell(const Config& c, std::mt19937_64& rng) {
  const std::int64_t s4 = scaled(c, 4096), s32 = scaled(c, 32768), w = scaled(c, 4096);
  Options causal = base(c), full = base(c), win = base(c);
  causal.causal = true;
  win.window_size = {w, 0};
  std::vector<Bench> calls;
  calls.emplace_back("causal Sq=Sk=" + std::to_string(s4), std::vector<std::int64_t>{s4}, std::vector<std::int64_t>{s4},
                     false, causal, c.heads, c.hdim, rng, c.dtype);
  calls.emplace_back("full Sq=Sk=" + std::to_string(s4), std::vector<std::int64_t>{s4}, std::vector<std::int64_t>{s4}, false,
                     full, c.heads, c.hdim, rng, c.dtype);
  calls.emplace_back("window(" + std::to_string(w) + ", 0) Sq=" + std::to_string(s4) + " Sk=" + std::to_string(s32),
                     std::vector<std::int64_t>{s4}, std::vector<std::int64_t>{s32}, false, win, c.heads, c.hdim, rng, c.dtype);
  calls.emplace_back("window(" + std::to_string(w) + ", 0) Sq=Sk=" + std::to_string(s32), std::vector<std::int64_t>{s32},
                     std::vector<std::int64_t>{s32}, false, win, c.heads, c.hdim, rng, c.dtype);
  run_cell("window: cost in proportion to the window, not to Sk", calls, c, 0);
}

void hooks_cell(const Config& c, std::mt19937_64& rng) {
  const std::int64_t s = scaled(c, 4096);
  Options o = base(c);
  o.causal = true;
  Options cap = o;
  cap.softcap = 30.0f;
  std::vector<Bench> calls;
  auto add = [&](const std::string& name, const Options& opts) {
    calls.emplace_back(name, std::vector<std::int64_t>{s}, std::vector<std::int64_t>{s}, false, opts, c.heads, c.hdim, rng, c.dtype);
  };
  add("causal", o);
  add("causal + softcap(30)", cap);
  add("causal + alibi", o);
  calls.back().with_alibi();
  add("causal + sinks", o);
  calls.back().with_sinks();
  add("causal + softcap + alibi + sinks", cap);
  calls.back().with_alibi();
  calls.back().with_sinks();
  run_cell(("score hooks: overhead over the same call without them (Sq = Sk = " + std::to_string(s) + ")").c_str(),
           calls, c, 0);
}

void varlen_cell(const Config& c, std::mt19937_64& rng) {
  // 16 sequences of 128 .. 2048 tokens (log-uniform), non-causal; the equal-length peer has the same number of
  // visible pairs in sequences of 1024; the padded peer is the mixed batch padded to its longest sequence.
  // (The 64 sequences of 128 .. 8192 are a GPU-sized cell: ~40x the work, minutes per call here.)
  std::uniform_real_distribution<double> u(std::log(128.0), std::log(2048.0));
  std::vector<std::int64_t> lens;
  double work = 0;
  for (int i = 0; i < 16; ++i) {
    lens.push_back(scaled(c, static_cast<std::int64_t>(std::exp(u(rng)))));
    work += static_cast<double>(lens.back()) * static_cast<double>(lens.back());
  }
  const std::int64_t eq = scaled(c, 1024);
  const auto n_eq = std::max<std::int64_t>(1, static_cast<std::int64_t>(work / (static_cast<double>(eq) * static_cast<double>(eq)) + 0.5));
  const std::int64_t longest = *std::max_element(lens.begin(), lens.end());
  std::vector<Bench> calls;
  calls.emplace_back("equal lengths: " + std::to_string(n_eq) + " x " + std::to_string(eq) + " (varlen)",
                     std::vector<std::int64_t>(static_cast<std::size_t>(n_eq), eq),
                     std::vector<std::int64_t>(static_cast<std::size_t>(n_eq), eq), true, base(c), c.heads, c.hdim, rng, c.dtype);
  calls.emplace_back("equal lengths: batch " + std::to_string(n_eq) + " x " + std::to_string(eq),
                     std::vector<std::int64_t>(static_cast<std::size_t>(n_eq), eq),
                     std::vector<std::int64_t>(static_cast<std::size_t>(n_eq), eq), false, base(c), c.heads, c.hdim, rng, c.dtype);
  std::ostringstream mix;
  for (std::size_t i = 0; i < lens.size(); ++i) mix << (i ? "," : "") << lens[i];
  calls.emplace_back("mixed lengths (" + mix.str() + ")", lens, lens, true, base(c), c.heads, c.hdim, rng, c.dtype);
  Bench padded("mixed, padded to " + std::to_string(longest), std::vector<std::int64_t>(lens.size(), longest),
               std::vector<std::int64_t>(lens.size(), longest), false, base(c), c.heads, c.hdim, rng, c.dtype);
  calls.push_back(std::move(padded));
  run_cell("varlen: mixed lengths vs equal lengths of the same work vs padding (GFLOP/s over real tokens' pairs "
           "except the padded row, which counts its padding)",
           calls, c, 0);
}

}  // namespace

int run_bench_variants(const std::vector<std::string>& args) {
  Config c;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& f = args[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) throw InvalidArgument(f + ": expected a value");
      return args[++i];
    };
    if (f == "--threads") c.threads = std::stoi(value());
    else if (f == "--iters") c.iters = std::max(1, std::stoi(value()));
    else if (f == "--heads") c.heads = std::stoll(value());
    else if (f == "--hdim") c.hdim = std::stoll(value());
    else if (f == "--quick") c.scale = 0.25;
    else if (f == "--dtype") {
      const std::string t = value();
      if (t == "float32") c.dtype = DType::float32;
      else if (t == "float16") c.dtype = DType::float16;
      else if (t == "bfloat16") c.dtype = DType::bfloat16;
      else throw InvalidArgument("--dtype: expected float32, float16 or bfloat16, got '" + t + "'");
    }
    else if (f == "--cells") {
      c.cells.clear();
      std::string v = value();
      for (std::size_t p = 0; p <= v.size();) {
        const std::size_t q = std::min(v.find(',', p), v.size());
        c.cells.push_back(v.substr(p, q - p));
        p = q + 1;
      }
    } else {
      throw InvalidArgument("bench-variants: unknown flag '" + f +
                            "'; flags: --threads N --iters N --heads N --hdim N --quick --dtype T --cells window,hooks,varlen");
    }
  }
  const DispatchReport probe = [&] {
    Buffer q(c.dtype, {1, 1, 1, c.hdim}), o(c.dtype, {1, 1, 1, c.hdim}), l(DType::float32, {1, 1, 1});
    Options opts = base(c);
    return explain_forward(q.view(), q.view(), q.view(), o.view(), l.view(), opts);
  }();
  std::printf("flashtile bench-variants: %s, Hq = Hkv = %lld, D = Dv = %lld, %d threads, %s, median of %d "
              "interleaved runs after 1 warm-up\n",
              std::string(dtype_name(c.dtype)).c_str(), static_cast<long long>(c.heads), static_cast<long long>(c.hdim), probe.ran.threads,
              probe.ran.isa.c_str(), c.iters);
  std::mt19937_64 rng(12);
  for (const std::string& cell : c.cells) {
    if (cell == "window") window_cell(c, rng);
    else if (cell == "hooks") hooks_cell(c, rng);
    else if (cell == "varlen") varlen_cell(c, rng);
    else throw InvalidArgument("--cells: unknown cell '" + cell + "' (window, hooks, varlen)");
  }
  return 0;
}

}  // namespace flashtile::app
