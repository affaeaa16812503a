// flashtile demo | check | bench.
#include "commands.h"

#include <omp.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "flashtile/flashtile.h"
#include "measure.h"
#include "problem.h"
#include "standard.h"

namespace flashtile::app {
namespace {

double eps(DType t) { return t == DType::float32 ? std::ldexp(1.0, -23) : std::ldexp(1.0, t == DType::float16 ? -10 : -7); }

std::uint64_t fresh_seed(std::uint64_t seed) {
  if (seed != 0) return seed;
  std::random_device rd;
  return (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
}

struct Row {
  Run run;
  Accuracy acc;
  std::string kernel;
};

struct Comparison {
  Row standard, flash;
  double max_ref = 0;
  bool within = false;  // flash error <= 2 * standard error + 8 eps max|ref| (the test suite's rule)
};

// Forward of FlashTile and standard attention on one problem, both checked against the float64 oracle
// on sampled rows.
Comparison compare_forward(const Shape& s, const std::string& backend, int threads, int iters, std::uint64_t seed) {
  Problem p(s, seed, false);
  Options o;
  o.causal = s.causal;
  o.backend = backend;
  o.num_threads = threads;
  Comparison c;

  std::vector<float> qf = p.q.to_float(), kf = p.k.to_float(), vf = p.v.to_float();
  std::vector<float> std_out(static_cast<std::size_t>(p.out.numel())), std_lse(static_cast<std::size_t>(p.lse.numel()));
  StandardAttention standard(s, threads > 0 ? threads : omp_get_max_threads());
  c.standard.run = measure([&] { standard.forward(qf.data(), kf.data(), vf.data(), std_out.data(), std_lse.data()); },
                           iters, iters > 1 ? 1 : 0, "standard forward");
  standard.release();
  c.standard.kernel = "standard: OpenBLAS sgemm, S and P materialised (float32)";

  DispatchReport report;
  c.flash.run = measure([&] { report = forward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.lse.view(), o); },
                        iters, iters > 1 ? 1 : 0, "flashtile forward");
  c.flash.kernel = report.ran.backend + " / " + report.ran.kernel + " [" + report.ran.isa + "] tiles " +
                   std::to_string(report.ran.block_q) + "x" + std::to_string(report.ran.block_k) + ", " +
                   std::to_string(report.ran.threads) + " threads";

  const auto rows = sample_rows(s.seqlen_q, 30);
  const auto ref = reference::forward_rows(p.q.view(), p.k.view(), p.v.view(), rows, o);
  c.standard.acc = compare_rows(std_out, ref, s.batch, s.seqlen_q, s.heads, s.dv());
  c.flash.acc = compare_rows(p.out.to_float(), ref, s.batch, s.seqlen_q, s.heads, s.dv());
  for (double x : ref.out) c.max_ref = std::max(c.max_ref, std::abs(x));
  c.within = c.flash.acc.max_abs <= 2 * c.standard.acc.max_abs + 8 * eps(s.dtype) * c.max_ref;
  return c;
}

void print_header() {
  std::printf("  %-20s %10s %10s %12s %10s %10s  %s\n", "", "time", "GFLOP/s", "peak extra", "max err", "rel err",
              "kernel");
}

void print_row(const char* name, const Row& r, double flops) {
  std::printf("  %-20s %8.3f s %10.1f %12s %10.2e %10.2e  %s\n", name, r.run.seconds, flops / r.run.seconds * 1e-9,
              bytes_str(r.run.peak_extra).c_str(), r.acc.max_abs, r.acc.rel, r.kernel.c_str());
}

}  // namespace

int run_demo() {
  Shape s;  // embedded default: B=1, H=8, S=4096, D=128, float32
  const std::uint64_t seed = fresh_seed(0);
  std::printf("FlashTile demo: exact attention computed tile by tile on the CPU\n");
  std::printf("problem: %s, seed %llu\n", s.describe().c_str(), static_cast<unsigned long long>(seed));
  std::printf("errors are against the float64 reference on 32 sampled query rows of every head\n");
  bool all_within = true;
  for (bool causal : {false, true}) {
    s.causal = causal;
    std::fprintf(stderr, "running %s attention...\n", causal ? "causal" : "full");
    const Comparison c = compare_forward(s, "auto", 0, 1, seed);
    std::printf("\n%s attention, forward:\n", causal ? "causal" : "full");
    print_header();
    print_row("standard attention", c.standard, s.forward_flops());
    print_row("FlashTile", c.flash, s.forward_flops());
    std::printf("  same result within tolerance (FlashTile error <= 2 x standard's + 8 eps max|ref| = %.2e): %s\n",
                2 * c.standard.acc.max_abs + 8 * eps(s.dtype) * c.max_ref, c.within ? "yes" : "NO");
    all_within = all_within && c.within;
  }
  std::printf("\nmemory as the sequence grows (full attention, forward, extra heap beyond inputs and outputs):\n");
  std::printf("  %8s %16s %16s\n", "S", "standard", "FlashTile");
  for (std::int64_t len : {1024, 2048, 4096}) {
    Shape m = s;
    m.causal = false;
    m.seqlen_q = len;
    std::fprintf(stderr, "measuring memory at S=%lld...\n", static_cast<long long>(len));
    const Comparison c = compare_forward(m, "auto", 0, 1, seed);
    std::printf("  %8lld %16s %16s\n", static_cast<long long>(len), bytes_str(c.standard.run.peak_extra).c_str(),
                bytes_str(c.flash.run.peak_extra).c_str());
  }
  std::printf("  standard attention stores S/P for every head: B*H*S^2*4 bytes, quadratic in S;\n"
              "  FlashTile never stores S or P: per thread one set of tiles and a float copy of one KV head's\n"
              "  K and V (2*S*D*4 bytes), linear in S.\n");
  return all_within ? 0 : 1;
}

int run_info(const std::vector<std::string>& flags) {
  // --isa-paths: the CPU ISA paths runnable here, one per line and nothing else (scripts/test.sh reads it).
  if (flags.size() == 1 && flags[0] == "--isa-paths") {
    for (const std::string& i : cpu_isa_paths()) std::printf("%s\n", i.c_str());
    return 0;
  }
  if (!flags.empty()) throw flashtile::InvalidArgument("info takes no flags or --isa-paths alone, got '" + flags[0] + "'");
  std::printf("backends (auto priority order):");
  for (const std::string& b : backend_names()) std::printf(" %s", b.c_str());
  std::printf("\ncpu isa paths runnable here:");
  for (const std::string& i : cpu_isa_paths()) std::printf(" %s", i.c_str());
  std::printf("\ncpu isa path in use: %s\nthreads: %d\n", cpu_isa_selected().c_str(), omp_get_max_threads());
  std::printf("standard attention's BLAS: %s\n", blas_description().c_str());
  return 0;
}

int run_check(const Args& a) {
  const Shape& s = a.shape;
  const std::uint64_t seed = fresh_seed(a.seed);
  std::printf("flashtile check: %s, backend %s, seed %llu\n", s.describe().c_str(), a.backend.c_str(),
              static_cast<unsigned long long>(seed));
  const Comparison c = compare_forward(s, a.backend, a.threads, 1, seed);
  print_header();
  print_row("standard attention", c.standard, s.forward_flops());
  print_row("FlashTile", c.flash, s.forward_flops());
  bool ok = c.within;
  std::printf("forward: %s\n", ok ? "PASS" : "FAIL");
  if (a.backward) {
    const double work = static_cast<double>(s.batch * s.heads * s.seqlen_q * s.sk()) * static_cast<double>(s.hdim);
    if (work > 4e9) {
      std::printf("backward: skipped, the float64 reference would take too long (%.1e multiply-adds); use a smaller shape\n", work);
    } else {
      Problem p(s, seed, true);
      Options o;
      o.causal = s.causal;
      o.backend = a.backend;
      o.num_threads = a.threads;
      forward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.lse.view(), o);
      const auto rep = backward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.dout.view(), p.lse.view(),
                                p.dq.view(), p.dk.view(), p.dv.view(), o);
      const auto ref = reference::backward(p.q.view(), p.k.view(), p.v.view(), p.dout.view(), o);
      double mag = 0;
      for (const auto* r : {&ref.dq, &ref.dk, &ref.dv})
        for (double x : *r) mag = std::max(mag, std::abs(x));
      std::printf("backward (%s): ", rep.ran.kernel.c_str());
      const std::pair<const char*, std::pair<Buffer*, const std::vector<double>*>> grads[] = {
          {"dq", {&p.dq, &ref.dq}}, {"dk", {&p.dk, &ref.dk}}, {"dv", {&p.dv, &ref.dv}}};
      bool bwd_ok = true;
      for (const auto& [name, pr] : grads) {
        const auto got = pr.first->to_float();
        double err = 0;
        for (std::size_t i = 0; i < got.size(); ++i) err = std::max(err, std::abs(got[i] - (*pr.second)[i]));
        if (std::isnan(err)) err = INFINITY;
        const bool g_ok = err <= 16 * eps(s.dtype) * std::max(mag, 1e-3);
        bwd_ok = bwd_ok && g_ok;
        std::printf("%s max err %.2e%s  ", name, err, g_ok ? "" : " (too large)");
      }
      std::printf("-> %s\n", bwd_ok ? "PASS" : "FAIL");
      ok = ok && bwd_ok;
    }
  }
  return ok ? 0 : 1;
}

int run_bench(const Args& a) {
  const Shape& s = a.shape;
  const std::uint64_t seed = fresh_seed(a.seed);
  const int threads = a.threads > 0 ? a.threads : omp_get_max_threads();
  std::printf("flashtile bench: %s, %d threads, median of %d runs after 1 warm-up\n", s.describe().c_str(), threads,
              a.iters);
  Problem p(s, seed, a.backward);
  Options o;
  o.causal = s.causal;
  o.backend = a.backend;
  o.num_threads = threads;
  std::vector<float> qf = p.q.to_float(), kf = p.k.to_float(), vf = p.v.to_float(), gf = p.dout.to_float();
  std::vector<float> so(static_cast<std::size_t>(p.out.numel())), sl(static_cast<std::size_t>(p.lse.numel()));
  StandardAttention standard(s, threads);
  const double ffl = s.forward_flops();
  // P is freed after each timed forward so that every run's allocation of it is measured.
  const Run sf = measure([&] {
    standard.forward(qf.data(), kf.data(), vf.data(), so.data(), sl.data());
    standard.release();
  }, a.iters, 1, "standard forward");
  DispatchReport rep;
  const Run ff = measure([&] { rep = forward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.lse.view(), o); },
                         a.iters, 1, "flashtile forward");
  std::printf("  %-22s %10s %10s %12s\n", "", "time", "GFLOP/s", "peak extra");
  std::printf("  %-22s %8.4f s %10.1f %12s\n", "standard fwd", sf.seconds, ffl / sf.seconds * 1e-9,
              bytes_str(sf.peak_extra).c_str());
  std::printf("  %-22s %8.4f s %10.1f %12s   %.2fx standard\n", "flashtile fwd", ff.seconds, ffl / ff.seconds * 1e-9,
              bytes_str(ff.peak_extra).c_str(), sf.seconds / ff.seconds);
  struct {
    Run standard, flash;
    std::int64_t p_bytes = 0;
  } bwd;
  if (a.backward) {
    const double bfl = 2.5 * ffl;
    std::vector<float> dq(qf.size()), dk(kf.size()), dv(vf.size());
    standard.forward(qf.data(), kf.data(), vf.data(), so.data(), sl.data());  // backward needs P
    const Run sb = bwd.standard = measure([&] { standard.backward(qf.data(), kf.data(), vf.data(), gf.data(), dq.data(), dk.data(), dv.data()); },
                           a.iters, 1, "standard backward");
    const std::int64_t p_bytes = bwd.p_bytes = s.batch * s.heads * s.seqlen_q * s.sk() * 4;
    const Run fb = bwd.flash = measure([&] {
      rep = backward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.dout.view(), p.lse.view(), p.dq.view(),
                     p.dk.view(), p.dv.view(), o);
    }, a.iters, 1, "flashtile backward");
    std::printf("  %-22s %8.4f s %10.1f %12s   (+ P kept from forward: %s)\n", "standard bwd", sb.seconds,
                bfl / sb.seconds * 1e-9, bytes_str(sb.peak_extra).c_str(), bytes_str(p_bytes).c_str());
    std::printf("  %-22s %8.4f s %10.1f %12s   %.2fx standard\n", "flashtile bwd", fb.seconds, bfl / fb.seconds * 1e-9,
                bytes_str(fb.peak_extra).c_str(), sb.seconds / fb.seconds);
  }
  std::printf("kernel: %s\n", rep.to_string().c_str());
  if (a.json) {
    std::printf("{\"shape\": \"%s\", \"threads\": %d, \"iters\": %d, \"isa\": \"%s\", \"kernel\": \"%s\", \"blas\": \"%s\", "
                "\"fwd_flops\": %.6e, \"standard_fwd_s\": %.6e, \"flash_fwd_s\": %.6e, "
                "\"standard_fwd_peak_bytes\": %lld, \"flash_fwd_peak_bytes\": %lld",
                s.describe().c_str(), threads, a.iters, rep.ran.isa.c_str(), rep.ran.kernel.c_str(),
                blas_description().c_str(), ffl, sf.seconds,
                ff.seconds, static_cast<long long>(sf.peak_extra), static_cast<long long>(ff.peak_extra));
    if (a.backward)
      std::printf(", \"standard_bwd_s\": %.6e, \"flash_bwd_s\": %.6e, \"standard_bwd_peak_bytes\": %lld, "
                  "\"standard_p_bytes\": %lld, \"flash_bwd_peak_bytes\": %lld",
                  bwd.standard.seconds, bwd.flash.seconds, static_cast<long long>(bwd.standard.peak_extra),
                  static_cast<long long>(bwd.p_bytes), static_cast<long long>(bwd.flash.peak_extra));
    std::printf("}\n");
  }
  return 0;
}

}  // namespace flashtile::app
