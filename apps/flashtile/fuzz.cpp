// flashtile fuzz: runs generated calls (fuzz_call.cpp) in guarded memory (fuzz_memory.h) and judges
// every answer. After each call: guards intact, inputs unchanged, a refused call or explain changed no
// byte, a successful call wrote every output element and no padding byte, its results agree with the
// oracle (fuzz_check.h), and a second run gives the same bytes (the CPU paths are deterministic).
#include "fuzz.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <tuple>
#include <unistd.h>

#include "flashtile/flashtile.h"
#include "fuzz_call.h"
#include "fuzz_check.h"
#include "fuzz_memory.h"

#if FT_FUZZ_ASAN
#include <sanitizer/common_interface_defs.h>

// UBSan ends a process with _exit and no callback; aborting instead lets the SIGABRT handler name the call.
extern "C" const char* __ubsan_default_options() { return "abort_on_error=1:print_stacktrace=1"; }
// Short allocation stacks: recording 30 frames per allocation took a fifth of the run's time.
// A small quarantine: a fresh 256 MB of pages to fault in cost a tenth of the time; freed blocks are still
// held back long enough to catch a use after free within a call.
extern "C" const char* __asan_default_options() { return "malloc_context_size=4:quarantine_size_mb=16"; }
#endif

namespace flashtile::app {
namespace {
using namespace fuzz;

struct Failure {
  std::string what;
  bool mismatch = false;  // a wrong result (as opposed to a wrong error, a changed buffer, ...)
};

const char* code_name(int code) {
  static const char* const n[] = {"InvalidArgument", "DTypeError", "DeviceError", "UnsupportedError", "BackendError"};
  return code >= 0 && code < 5 ? n[code] : "?";
}

struct Outcome {
  int code = -1;  // ErrorCode thrown, -1 none
  std::string message;
  DispatchReport report;
};

Outcome typed(const Error& e, ErrorCode want) {
  if (e.code() != want) throw Failure{std::string("error class and code() disagree: ") + e.what()};
  if (std::strlen(e.what()) == 0) throw Failure{"an error with an empty message"};
  return {static_cast<int>(want), e.what(), {}};
}

// The call's options with its variant tensors attached (an unused one is a default view: absent).
Options attach(const Options& base, const std::array<TensorView, kArgs>& v) {
  Options o = base;
  o.alibi_slopes = v[ALIBI];
  o.sinks = v[SINKS];
  o.dsinks = v[DSINKS];
  o.cu_seqlens_q = v[CUQ];
  o.cu_seqlens_k = v[CUK];
  o.seqused_k = v[SEQUSED];
  return o;
}

// Calls the API; a failure unless it returned or threw one of the documented subclasses.
Outcome call_api(Op op, const std::array<TensorView, kArgs>& v, const Options& options) {
  const Options o = attach(options, v);
  Outcome r;
  try {
    switch (op) {
      case Op::forward: r.report = forward(v[Q], v[K], v[V], v[OUT], v[LSE], o); break;
      case Op::explain_forward: r.report = explain_forward(v[Q], v[K], v[V], v[OUT], v[LSE], o); break;
      case Op::backward: r.report = backward(v[Q], v[K], v[V], v[OUT], v[DOUT], v[LSE], v[DQ], v[DK], v[DV], o); break;
      case Op::explain_backward:
        r.report = explain_backward(v[Q], v[K], v[V], v[OUT], v[DOUT], v[LSE], v[DQ], v[DK], v[DV], o);
        break;
      case Op::make_view: break;
    }
  } catch (const InvalidArgument& e) {
    r = typed(e, ErrorCode::invalid_argument);
  } catch (const DTypeError& e) {
    r = typed(e, ErrorCode::dtype);
  } catch (const DeviceError& e) {
    r = typed(e, ErrorCode::device);
  } catch (const UnsupportedError& e) {
    r = typed(e, ErrorCode::unsupported);
  } catch (const BackendError& e) {
    r = typed(e, ErrorCode::backend);
  } catch (const Error& e) {
    throw Failure{std::string("flashtile::Error thrown without a subclass: ") + e.what()};
  } catch (const std::exception& e) {
    throw Failure{std::string("undocumented exception type: ") + e.what()};
  } catch (...) {
    throw Failure{"a non-std exception"};
  }
  return r;
}

std::vector<std::int64_t> sample_rows(std::int64_t sq, std::mt19937_64& rng) {
  std::vector<std::int64_t> rows;
  if (sq <= 6) {
    for (std::int64_t i = 0; i < sq; ++i) rows.push_back(i);
    return rows;
  }
  rows = {0, sq - 1};
  while (rows.size() < 6) {
    const auto i = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(sq));
    if (std::find(rows.begin(), rows.end(), i) == rows.end()) rows.push_back(i);
  }
  return rows;
}

// Static messages only: a message built for every check cost more than the checks.
void require(bool ok, const char* what) {
  if (!ok) throw Failure{what};
}

// The call that came closest to its tolerance: a fuzzer whose errors all sit far below it tests little.
struct Closest {
  double ratio = 0;  // max error / tolerance
  std::uint64_t call = 0;
  std::string what;
} g_closest;
std::uint64_t g_call = 0;

void require(const Verdict& v, std::int64_t& precision_limited) {
  precision_limited += v.precision_limited;
  if (v.tol > 0 && v.err / v.tol > g_closest.ratio) g_closest = {v.err / v.tol, g_call, v.name};
  if (!v.ok) throw Failure{"result differs from the float64 oracle: " + v.detail, true};
}

// The semantics (README) of a row whose visible scores are all -inf: O = 0, LSE = -inf, dQ = 0. Checked on
// the library's result and on the oracle's, both of which must follow the one definition.
void check_neg_row(const Call& c, const char* who, const std::vector<double>& x, std::size_t at, std::int64_t n, bool lse) {
  for (std::int64_t e = 0; e < n; ++e) {
    const double want = lse ? -std::numeric_limits<double>::infinity() : 0.0;
    if (x[at + static_cast<std::size_t>(e)] != want)
      throw Failure{std::string(who) + ": row " + std::to_string(c.neg_row[1]) + " of head " + std::to_string(c.neg_row[2]) +
                    " sees only -inf scores, so " + (lse ? "its LSE must be -inf" : "its output must be 0") + "; got " +
                    std::to_string(x[at + static_cast<std::size_t>(e)]), true};
  }
}

// Agreement of a successful forward / backward with the oracle (clean views: the mutations were vacuous).
// The oracle gets the call's own (clean) views; the yardstick reads varlen operands as one batch of packed rows.
void check_results(const Call& c, const Arena& m, std::mt19937_64& rng, std::int64_t& precision_limited, bool semantics) {
  Options ro = attach({}, m.clean);
  ro.softmax_scale = c.options.softmax_scale;
  ro.causal = c.options.causal;
  ro.window_size = c.options.window_size;
  ro.softcap = c.options.softcap;
  ro.max_seqlen_q = c.options.max_seqlen_q;
  ro.max_seqlen_k = c.options.max_seqlen_k;
  ro.dsinks = {};
  const auto& raw = m.clean;
  std::array<TensorView, kArgs> v = raw;
  for (int a = 0; a < ALIBI; ++a) v[static_cast<std::size_t>(a)] = as_batched(raw[static_cast<std::size_t>(a)], a == LSE);
  Problem pr;
  pr.q = load(v[Q]);
  pr.k = load(v[K]);
  pr.v = load(v[V]);
  pr.causal = c.options.causal;
  pr.dtype = c.dtype;
  pr.window = c.options.window_size;
  pr.scale = c.options.softmax_scale ? *c.options.softmax_scale : 1.0f / std::sqrt(static_cast<float>(c.d));
  pr.softcap = c.options.softcap;
  if (c.t[ALIBI].used) pr.alibi = load_flat(v[ALIBI]), pr.alibi_batched = c.alibi_rank == 2;
  if (c.t[SINKS].used) pr.sinks = load_flat(v[SINKS]);
  pr.cu_q.assign(c.cu_q.begin(), c.cu_q.end());
  pr.cu_k.assign(c.cu_k.begin(), c.cu_k.end());
  pr.seqused.assign(c.seqused.begin(), c.seqused.end());
  if (c.op == Op::forward) {
    auto rows = sample_rows(c.sq, rng);
    const bool neg = semantics && c.neg_row_alone;
    if (neg && std::find(rows.begin(), rows.end(), c.neg_row[1]) == rows.end()) rows.back() = c.neg_row[1];
    const auto ref = reference::forward_rows(raw[Q], raw[K], raw[V], rows, ro);
    if (neg) {
      const auto ri = static_cast<std::int64_t>(std::find(rows.begin(), rows.end(), c.neg_row[1]) - rows.begin());
      const auto nr = static_cast<std::int64_t>(rows.size());
      const auto at_out = static_cast<std::size_t>(((c.neg_row[0] * nr + ri) * c.hq + c.neg_row[2]) * c.dv);
      const auto at_lse = static_cast<std::size_t>((c.neg_row[0] * c.hq + c.neg_row[2]) * nr + ri);
      for (const auto& [who, out, lse] : {std::tuple{"FlashTile", load_rows(v[OUT], rows), load_lse_rows(v[LSE], rows)},
                                          std::tuple{"the float64 oracle", ref.out, ref.lse}}) {
        check_neg_row(c, who, out, at_out, c.dv, false);
        check_neg_row(c, who, lse, at_lse, 1, true);
      }
    }
    const StdForward sf = standard_forward(pr, rows);
    const double mag = max_abs_finite(pr.v.x) * std::max(1.0, sf.score_scale);
    require(compare("out", load_rows(v[OUT], rows), sf.out, ref.out, c.dtype, mag, c.dtype), precision_limited);
    require(compare("lse", load_lse_rows(v[LSE], rows), sf.lse, ref.lse, c.dtype, sf.score_scale, DType::float32), precision_limited);
    return;
  }
  pr.dout = load(v[DOUT]);
  const auto ref = reference::backward(raw[Q], raw[K], raw[V], raw[DOUT], ro);
  if (semantics && c.neg_row_alone) {
    const auto at = static_cast<std::size_t>(((c.neg_row[0] * c.sq + c.neg_row[1]) * c.hq + c.neg_row[2]) * c.d);
    check_neg_row(c, "FlashTile dq", load(v[DQ]).x, at, c.d, false);
    check_neg_row(c, "the float64 oracle's dq", ref.dq, at, c.d, false);
  }
  const StdBackward sb = standard_backward(pr);
  std::vector<std::int64_t> all(static_cast<std::size_t>(c.sq));
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::int64_t>(i);
  const double lse = max_abs_finite(load_lse_rows(v[LSE], all));
  const double mag = std::max({max_abs_finite(ref.dq), max_abs_finite(ref.dk), max_abs_finite(ref.dv)}) *
                     (1.0 + lse + sb.score_scale);
  require(compare("dq", load(v[DQ]).x, sb.dq, ref.dq, c.dtype, std::max(mag, sb.abs_sum[0]), c.dtype), precision_limited);
  require(compare("dk", load(v[DK]).x, sb.dk, ref.dk, c.dtype, std::max(mag, sb.abs_sum[1]), c.dtype), precision_limited);
  require(compare("dv", load(v[DV]).x, sb.dv, ref.dv, c.dtype, std::max(mag, sb.abs_sum[2]), c.dtype), precision_limited);
  if (c.t[DSINKS].used)
    require(compare("dsinks", load_flat(v[DSINKS]), sb.dsinks, ref.dsinks, c.dtype,
                    std::max(max_abs_finite(ref.dsinks) * (1.0 + lse + sb.score_scale), sb.abs_sum[3]), DType::float32),
            precision_limited);
}

// out and lse of a backward call: a forward with the call's own options, as a user runs it.
void setup_backward(const Call& c, Arena& m, std::mt19937_64& rng) {
  Options o = c.options;
  o.strict = false;
  o.num_threads = std::max(o.num_threads, 0);
  for (const char* backend : {o.backend == "cpu-reference" ? "cpu-reference" : "auto", "cpu-reference"}) {
    o.backend = backend;
    try {
      forward(m.view[Q], m.view[K], m.view[V], m.view[OUT], m.view[LSE], attach(o, m.view));
      return;
    } catch (const Error&) {
    }
  }
  // The call is refused anyway: any values will do.
  for (int a : {OUT, LSE}) {
    const TensorSpec& s = c.t[static_cast<std::size_t>(a)];
    if (s.host >= 0) continue;
    for (std::size_t off : m.elems[static_cast<std::size_t>(a)])
      write_elem(m.blocks[static_cast<std::size_t>(m.block_of[static_cast<std::size_t>(a)])]->data() + off, s.dtype, normal(rng));
  }
}

struct Stats {
  std::uint64_t calls = 0, ok = 0, explain_ok = 0, explain_none = 0, refused[5] = {}, failures = 0, mismatches = 0;
  std::int64_t precision_limited = 0;
  std::map<std::string, std::uint64_t> buckets;
  std::map<std::string, std::uint64_t> checked_by_variant, faults_by_kind;  // oracle-checked calls; passed fault calls
};

// make_view: a valid shape gets row-major strides; more than 4 dims or a stride list of another length
// is an InvalidArgument.
void check_make_view(const Call& c, Outcome& r) {
  float x = 0;
  const TensorView v = make_view(&x, c.dtype, {c.b, c.sq, c.hq, c.d});
  const std::int64_t want[4] = {std::max<std::int64_t>(c.sq, 1) * std::max<std::int64_t>(c.hq, 1) * std::max<std::int64_t>(c.d, 1),
                                std::max<std::int64_t>(c.hq, 1) * std::max<std::int64_t>(c.d, 1), std::max<std::int64_t>(c.d, 1), 1};
  for (int i = 0; i < 4; ++i) require(v.stride[static_cast<std::size_t>(i)] == want[i], "make_view: wrong row-major strides");
  try {
    if (c.sq % 2 == 0) make_view(&x, c.dtype, {1, 2, 3, 4, 5});
    else make_view(&x, c.dtype, {1, 2, 3}, {6, 3});
  } catch (const InvalidArgument& e) {
    r.code = 0;
    return;
  }
  throw Failure{"make_view accepted a bad shape or stride list"};
}

// Runs call `index`; throws Failure when the library's answer is wrong.
std::string run_call(const Call& c, const Expect& e, Stats& st, std::mt19937_64& rng) {
  Outcome r;
  if (c.op == Op::make_view) {
    check_make_view(c, r);
    return "make_view|InvalidArgument";
  }
  Arena m(c, rng);
  if (c.is_backward()) setup_backward(c, m, rng);
  const auto before = m.snapshot();
  const bool run_op = c.op == Op::forward || c.op == Op::backward;
  // One run in four is explained first: explain must touch nothing and foretell the call's answer.
  const bool explained = run_op && g_call % 4 == 0;
  Outcome ex;
  if (explained) {
    ex = call_api(c.op == Op::forward ? Op::explain_forward : Op::explain_backward, m.view, c.options);
    require(m.snapshot() == before, "explain modified memory");
  }
  r = call_api(c.op, m.view, c.options);
  for (const auto& b : m.blocks) require(b->guards_intact(), "a guard byte around a buffer was overwritten");
  if (explained) {
    const bool same = ex.code >= 0                      ? r.code == ex.code
                      : ex.report.ran.backend.empty() ? r.code == static_cast<int>(ErrorCode::unsupported)
                                                        : r.code < 0 && r.report.ran.backend == ex.report.ran.backend &&
                                                              r.report.ran.kernel == ex.report.ran.kernel &&
                                                              r.report.ran.isa == ex.report.ran.isa;
    require(same, "explain foretold another answer than the call gave");
  }
  std::string bucket = std::string(op_name(c.op)) + "|";
  if (r.code >= 0) {
    const bool allowed = ((e.error_classes | e.tolerated) & (1u << r.code)) != 0 || (e.nothing_runs && run_op && r.code == 3);
    if (!allowed)
      throw Failure{std::string("threw ") + code_name(r.code) + " where " +
                    (e.error_classes ? "another error class" : e.nothing_runs ? "UnsupportedError" : "success") +
                    " was due: " + r.message};
    require(m.snapshot() == before, "a refused call modified memory");
    ++st.refused[r.code];
    return bucket + "refused|" + code_name(r.code);
  }
  require(e.error_classes == 0 || e.may_succeed, "succeeded, but the injected fault calls for an error");
  require(!(e.nothing_runs && run_op), "succeeded where no backend can run (UnsupportedError due)");
  if (!run_op) {
    require(m.snapshot() == before, "explain modified memory");
    if (r.report.ran.backend != (e.nothing_runs ? "" : e.backend))
      throw Failure{"explain reports backend '" + r.report.ran.backend + "'"};
    ++(e.nothing_runs ? st.explain_none : st.explain_ok);
    return bucket + (e.nothing_runs ? "nothing-runs" : "ok|" + r.report.ran.backend + "|" + r.report.ran.isa);
  }
  if (r.report.ran.backend != e.backend) throw Failure{"ran '" + r.report.ran.backend + "', expected '" + e.backend + "'"};
  require(last_dispatch().ran.kernel == r.report.ran.kernel, "last_dispatch() differs from the returned report");
  if (e.backend == "cpu-flash" && r.report.ran.isa != cpu_isa_selected()) throw Failure{"report names ISA " + r.report.ran.isa};
  // Inputs unchanged; outputs: every element written, no other byte.
  const auto after = m.snapshot();
  const auto outs = m.output_blocks(c);
  for (std::size_t b = 0; b < m.blocks.size(); ++b) {
    if (std::find(outs.begin(), outs.end(), static_cast<int>(b)) != outs.end()) continue;
    require(after[b] == before[b], "an input buffer was modified");
  }
  for (int a : c.is_backward() ? std::vector<int>{DQ, DK, DV, DSINKS} : std::vector<int>{OUT, LSE}) {
    const TensorSpec& s = c.t[static_cast<std::size_t>(a)];
    if (!s.used) continue;
    const auto b = static_cast<std::size_t>(m.block_of[static_cast<std::size_t>(a)]);
    std::vector<unsigned char> mask(after[b].size(), 0);
    const std::size_t es = dtype_size(s.dtype);
    std::uint32_t sentinel = pattern(s.dtype, true);
    for (std::size_t off : m.elems[static_cast<std::size_t>(a)]) {
      if (std::memcmp(&after[b][off], &sentinel, es) == 0) throw Failure{std::string(kArgName[a]) + ": an element was not written"};
      std::memset(&mask[off], 1, es);
    }
    for (std::size_t i = 0; i < mask.size(); ++i)
      if (!mask[i] && after[b][i] != before[b][i]) throw Failure{std::string(kArgName[a]) + ": a padding byte was written"};
  }
  check_results(c, m, rng, st.precision_limited, true);
  if (rng() % 6 == 0) {  // run to run: same bytes
    for (int b : outs) m.blocks[static_cast<std::size_t>(b)]->restore(before[static_cast<std::size_t>(b)]);
    call_api(c.op, m.view, c.options);
    require(m.snapshot() == after, "a second identical call gave different bytes");
  }
  ++st.ok;
  return bucket + "ok|" + r.report.ran.backend + "|" + r.report.ran.isa;
}

char g_crash_line[512];

void on_death() {
  const ssize_t n = write(2, g_crash_line, std::strlen(g_crash_line));
  (void)n;
}

void on_signal(int sig) {
  on_death();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

struct FuzzArgs {
  std::uint64_t calls = 1000, seed = 0, skip = 0;
  std::int64_t max_seqlen = 300;
  bool verbose = false, buckets = false;
  std::string replay_flags;  // the flags that change what is generated, for replay lines
};

FuzzArgs parse(const std::vector<std::string>& argv) {
  FuzzArgs a;
  for (std::size_t i = 0; i < argv.size(); ++i) {
    const std::string& f = argv[i];
    auto num = [&]() -> std::uint64_t {
      if (i + 1 >= argv.size()) throw InvalidArgument(f + ": missing value");
      const std::string& s = argv[++i];
      char* end = nullptr;
      const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
      if (s.empty() || *end != '\0' || s[0] == '-') throw InvalidArgument(f + ": expected a non-negative integer, got '" + s + "'");
      return v;
    };
    if (f == "--calls") a.calls = num();
    else if (f == "--seed") a.seed = num();
    else if (f == "--skip") a.skip = num();
    else if (f == "--max-seqlen") {
      a.max_seqlen = static_cast<std::int64_t>(std::max<std::uint64_t>(num(), 1));
      a.replay_flags += " --max-seqlen " + std::to_string(a.max_seqlen);
    }
    else if (f == "--verbose") a.verbose = true;
    else if (f == "--buckets") a.buckets = true;
    else throw InvalidArgument("fuzz: unknown flag '" + f + "'; flags: --calls N --seed S --skip K --max-seqlen N --verbose --buckets");
  }
  if (a.seed == 0) {
    std::random_device rd;
    a.seed = ((static_cast<std::uint64_t>(rd()) << 32) ^ rd()) | 1;
  }
  return a;
}

}  // namespace

int run_fuzz(const std::vector<std::string>& argv) {
  const FuzzArgs a = parse(argv);
  const auto backends = backend_names();
  const auto isa_paths = cpu_isa_paths();
  const char* env_isa = std::getenv("FLASHTILE_CPU_ISA");
  const std::string start_isa = env_isa ? env_isa : "";
  const std::string default_isa = cpu_isa_selected();
  std::printf("flashtile fuzz: seed %llu, calls %llu..%llu, max seqlen %lld\n", static_cast<unsigned long long>(a.seed),
              static_cast<unsigned long long>(a.skip), static_cast<unsigned long long>(a.skip + a.calls - 1),
              static_cast<long long>(a.max_seqlen));
  std::printf("  replay one call: flashtile fuzz --calls 1 --seed %llu --skip K --verbose%s\n", static_cast<unsigned long long>(a.seed),
              a.replay_flags.c_str());
  std::fflush(stdout);
  // Say which call died: ASan calls the death callback, UBSan aborts (__ubsan_default_options below), other
  // crashes raise a signal (ASan keeps its own SIGSEGV handler, which ends in the death callback).
#if FT_FUZZ_ASAN
  __sanitizer_set_death_callback(on_death);
  std::signal(SIGABRT, on_signal);
#else
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) std::signal(sig, on_signal);
#endif
  Stats st;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::uint64_t k = a.skip; k < a.skip + a.calls; ++k) {
    std::snprintf(g_crash_line, sizeof g_crash_line,
                  "\nflashtile fuzz: CRASH in call %llu (seed %llu); replay: flashtile fuzz --calls 1 --seed %llu --skip %llu --verbose%s\n",
                  static_cast<unsigned long long>(k), static_cast<unsigned long long>(a.seed),
                  static_cast<unsigned long long>(a.seed), static_cast<unsigned long long>(k), a.replay_flags.c_str());
    g_call = k;
    const Call c = generate(a.seed, k, a.max_seqlen, backends, isa_paths, default_isa);
    const Expect e = expect(c, backends);
    if (c.isa) setenv("FLASHTILE_CPU_ISA", c.isa->c_str(), 1);
    if (a.verbose) {
      std::printf("call %llu: %s\n", static_cast<unsigned long long>(k), c.describe().c_str());
      std::fflush(stdout);
    }
    std::mt19937_64 rng(c.data_seed);
    ++st.calls;
    try {
      const std::int64_t limited = st.precision_limited;
      std::string bucket = run_call(c, e, st, rng);
      bucket.append("|").append(dtype_name(c.dtype)).append("|").append(c.variants()).append("|");
      if (c.faults.empty()) bucket.append("valid");
      for (std::size_t i = 0; i < c.faults.size(); ++i) bucket.append(i ? "+" : "").append(fault_name(c.faults[i]));
      if (!c.specials.empty()) bucket += c.neg_inf_row ? "|neg-inf-row" : "|special-values";
      if (st.precision_limited > limited) bucket += "|precision-limited";
      ++st.buckets[bucket];
      if ((c.op == Op::forward || c.op == Op::backward) && bucket.find("|ok|") != std::string::npos) {
        std::string v = c.variants() + "+";
        for (std::size_t at = 0, plus; (plus = v.find('+', at)) != std::string::npos; at = plus + 1)
          ++st.checked_by_variant[std::string(op_name(c.op)) + " " + v.substr(at, plus - at)];
      }
      for (Fault f : c.faults) ++st.faults_by_kind[fault_name(f)];
      if (a.verbose) std::printf("  -> %s\n", bucket.c_str());
    } catch (const Failure& f) {
      ++st.failures;
      st.mismatches += f.mismatch ? 1 : 0;
      std::printf("\nFAIL: call %llu (seed %llu): %s\n  call: %s\n  replay: flashtile fuzz --calls 1 --seed %llu --skip %llu --verbose%s\n",
                  static_cast<unsigned long long>(k), static_cast<unsigned long long>(a.seed), f.what.c_str(),
                  c.describe().c_str(), static_cast<unsigned long long>(a.seed), static_cast<unsigned long long>(k),
                  a.replay_flags.c_str());
    }
    if (start_isa.empty()) unsetenv("FLASHTILE_CPU_ISA");
    else setenv("FLASHTILE_CPU_ISA", start_isa.c_str(), 1);
    if (st.failures >= 10) {
      std::printf("stopping after 10 failures\n");
      break;
    }
    if (a.calls >= 100000 && (k - a.skip + 1) % (a.calls / 20) == 0) {
      std::printf("  ... %llu calls, %.0f s\n", static_cast<unsigned long long>(k - a.skip + 1),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      std::fflush(stdout);
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\nbuckets (operation|outcome|error class or backend|isa|dtype|variants|faults|special values): %zu distinct\n",
              st.buckets.size());
  if (a.verbose || a.buckets)
    for (const auto& [k, n] : st.buckets) std::printf("  %8llu  %s\n", static_cast<unsigned long long>(n), k.c_str());
  std::printf("calls %llu: succeeded %llu (results checked against the oracle), explain ok %llu, explain nothing-runs %llu\n",
              static_cast<unsigned long long>(st.calls), static_cast<unsigned long long>(st.ok),
              static_cast<unsigned long long>(st.explain_ok), static_cast<unsigned long long>(st.explain_none));
  std::printf("checked against the oracle, by operation and variant:");
  for (const auto& [k, n] : st.checked_by_variant) std::printf(" %s %llu,", k.c_str(), static_cast<unsigned long long>(n));
  std::printf("\ncalls with each injected fault, answered as due:");
  for (const auto& [k, n] : st.faults_by_kind) std::printf(" %s %llu,", k.c_str(), static_cast<unsigned long long>(n));
  std::printf("\nrefused as due:");
  for (int i = 0; i < 5; ++i) std::printf(" %s %llu", code_name(i), static_cast<unsigned long long>(st.refused[i]));
  std::printf("\nnon-finite results shared with standard attention in the same precision: %lld elements\n",
              static_cast<long long>(st.precision_limited));
  std::printf("closest to its tolerance: %s of call %llu at %.3f of the tolerance\n", g_closest.what.c_str(),
              static_cast<unsigned long long>(g_closest.call), g_closest.ratio);
  std::printf("mismatches (wrong results): %llu\n", static_cast<unsigned long long>(st.mismatches));
  std::printf("failures (wrong results, wrong errors, modified buffers; a crash ends the run): %llu\nwall time %.1f s (%.3f ms per call), seed %llu\n",
              static_cast<unsigned long long>(st.failures), secs, 1e3 * secs / static_cast<double>(std::max<std::uint64_t>(st.calls, 1)),
              static_cast<unsigned long long>(a.seed));
  return st.failures == 0 ? 0 : 1;
}

}  // namespace flashtile::app
