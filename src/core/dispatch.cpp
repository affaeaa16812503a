// Backend selection. The rules, in one place:
//  - "auto": the first backend in priority order whose can_run() is empty; each one skipped before it
//    is listed in the report with its reasons. Oracles (cpu-reference) are never picked by auto.
//  - a name: that backend if it can run. Otherwise, not strict: auto's choice runs and the report says
//    fell_back = true with the named backend's reasons; strict: UnsupportedError listing the reasons.
//  - strict with "auto": an error unless the first auto-eligible backend runs that does not hand the call over
//    (Backend::hands_over: another device, another GPU architecture, or a call another backend's kernel is made for).
//  - nothing can run: UnsupportedError listing every backend's reasons.
#include <sstream>

#include "core/backend.h"
#include "core/validate.h"
#include "flashtile/attention.h"
#include "flashtile/errors.h"

namespace flashtile {
namespace detail {

const std::vector<std::unique_ptr<Backend>>& registry() {
  static const std::vector<std::unique_ptr<Backend>> backends = [] {
    std::vector<std::unique_ptr<Backend>> v;
#if FLASHTILE_WITH_CUDA
    register_cuda_backends(v);
#endif
    register_cpu_backends(v);
    return v;
  }();
  return backends;
}

namespace {

thread_local DispatchReport g_last;

std::string list_reasons(const std::vector<Refusal>& refused) {
  std::ostringstream s;
  for (const Refusal& r : refused) {
    s << "\n  " << r.backend << ":";
    for (const std::string& why : r.reasons) s << "\n    - " << why;
  }
  return s.str();
}

const Backend* find(const std::string& name) {
  for (const auto& b : registry())
    if (b->name() == name) return b.get();
  return nullptr;
}

// Once `winner` is chosen, every other backend of the build is listed too, so that the report accounts
// for all of them: why it was not picked.
void note_rest(const AttnParams& p, const Options& o, DispatchReport& report, const Backend* winner) {
  for (const auto& b : registry()) {
    if (b.get() == winner) continue;
    bool listed = false;
    for (const Refusal& r : report.refused) listed = listed || r.backend == b->name();
    if (listed) continue;
    Reasons why;
    if (o.backend != "auto" && !report.fell_back) {
      why.push_back("not requested (backend = '" + o.backend + "')");
    } else if (!b->eligible_for_auto()) {
      why.push_back("not chosen by auto: an oracle, run only when requested by name");
    } else {
      why = b->can_run(p);
      if (why.empty()) why.push_back("lower priority than " + winner->name());
    }
    report.refused.push_back({b->name(), std::move(why)});
  }
}

// Picks the backend and fills the report with the backends refused before it (note_rest lists the others);
// throws UnsupportedError when nothing may run.
const Backend* choose(const AttnParams& p, const Options& o, DispatchReport& report, const char* op) {
  report = DispatchReport{};
  report.requested = o.backend;
  const Backend* named = nullptr;
  if (o.backend != "auto") {
    named = find(o.backend);
    if (named == nullptr) {
      std::ostringstream s;
      s << "backend: unknown backend '" << o.backend << "'; this build has: auto";
      for (const auto& b : registry()) s << ", " << b->name();
      throw InvalidArgument(s.str());
    }
    Reasons why = named->can_run(p);
    if (why.empty()) return named;
    report.refused.push_back({named->name(), std::move(why)});
    if (o.strict)
      throw UnsupportedError(std::string("flashtile.") + op + ": strict mode: backend '" + o.backend +
                             "' cannot run this call:" + list_reasons(report.refused));
    report.fell_back = true;
  }
  bool first_choice = true;
  for (const auto& b : registry()) {
    if (b.get() == named) continue;
    if (!b->eligible_for_auto()) {
      report.refused.push_back({b->name(), {"not chosen by auto: an oracle, run only when requested by name"}});
      continue;
    }
    Reasons why = b->can_run(p);
    if (why.empty()) {
      if (o.strict && o.backend == "auto" && !first_choice)
        throw UnsupportedError(std::string("flashtile.") + op + ": strict mode: auto would fall back to '" +
                               b->name() + "' because faster backends refused:" + list_reasons(report.refused));
      return b.get();
    }
    if (!b->hands_over(p)) first_choice = false;  // the next backend to run would be a fall-back
    report.refused.push_back({b->name(), std::move(why)});
  }
  throw UnsupportedError(std::string("flashtile.") + op + ": no backend can run this call:" +
                         list_reasons(report.refused));
}

// What the report says about the variant: the mask and the score hooks, from the validated params (a backend that
// cannot run one of them refuses in can_run, so the one that runs runs them all).
std::string mask_name(const AttnParams& p) {
  std::string s;
  if (p.is_varlen()) s += "varlen+";
  if (p.seqused_k != nullptr) s += "seqused_k+";
  if (p.kvcache) s += p.page_table != nullptr ? "paged_kvcache+" : "kvcache+";
  if (p.causal && p.window_left < 0) {
    s += "causal";
  } else if (p.has_window()) {
    s += "window(" + std::to_string(p.window_left) + ", " + std::to_string(p.window_right) + ")";
  } else {
    s += "none";
  }
  return s;
}

std::vector<std::string> score_hooks(const AttnParams& p) {
  std::vector<std::string> hooks;
  if (p.softcap > 0.0f) {
    std::ostringstream s;
    s << "softcap(" << p.softcap << ")";
    hooks.push_back(s.str());
  }
  if (p.alibi_slopes != nullptr) hooks.emplace_back("alibi");
  if (p.sinks != nullptr) hooks.emplace_back("sinks");
  return hooks;
}

DispatchReport run(const AttnParams& p, const Options& o, const char* op, bool execute) {
  DispatchReport report;
  const Backend* b = nullptr;
  try {
    b = choose(p, o, report, op);
  } catch (const UnsupportedError&) {
    if (execute) throw;
    return report;  // explain(): nothing would run; the report lists every refusal
  }
  // The kernels first: the report's text (plan, the other backends' reasons) is host work a GPU call does while
  // its kernels run, not before they start.
  if (execute && (!p.empty() || (p.kvcache && p.seqlen_new > 0))) b->run(p);  // an append without queries writes
  note_rest(p, o, report, b);
  report.ran = b->plan(p);
  if (report.ran.mask.empty()) report.ran.mask = mask_name(p);
  if (report.ran.score_hooks.empty()) report.ran.score_hooks = score_hooks(p);
  if (execute) g_last = report;
  return report;
}

}  // namespace
}  // namespace detail

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const auto& b : detail::registry()) names.push_back(b->name());
  return names;
}

const DispatchReport& last_dispatch() { return detail::g_last; }

DispatchReport forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                       const TensorView& lse, const Options& options) {
  const auto p = detail::validate_forward(q, k, v, out, lse, options);
  return detail::run(p, options, "forward", true);
}

DispatchReport backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                        const TensorView& dout, const TensorView& lse, const TensorView& dq, const TensorView& dk,
                        const TensorView& dv, const Options& options) {
  const auto p = detail::validate_backward(q, k, v, out, dout, lse, dq, dk, dv, options);
  return detail::run(p, options, "backward", true);
}

std::size_t backward_workspace_bytes(const TensorView& q, const TensorView& k, const TensorView& v,
                                     const TensorView& out, const TensorView& dout, const TensorView& lse,
                                     const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                     const Options& options) {
  const auto p = detail::validate_backward(q, k, v, out, dout, lse, dq, dk, dv, options);
  DispatchReport report;
  return p.empty() ? 0 : detail::choose(p, options, report, "backward")->workspace_bytes(p);
}

DispatchReport forward_kvcache(const TensorView& q, const KVCache& cache, const TensorView& out,
                               const TensorView& lse, const Options& options) {
  const auto p = detail::validate_kvcache(q, cache, out, lse, options);
  return detail::run(p, options, "forward_kvcache", true);
}

std::size_t forward_kvcache_workspace_bytes(const TensorView& q, const KVCache& cache, const TensorView& out,
                                            const TensorView& lse, const Options& options) {
  const auto p = detail::validate_kvcache(q, cache, out, lse, options);
  DispatchReport report;
  return p.empty() ? 0 : detail::choose(p, options, report, "forward_kvcache")->workspace_bytes(p);
}

DispatchReport explain_forward_kvcache(const TensorView& q, const KVCache& cache, const TensorView& out,
                                       const TensorView& lse, const Options& options) {
  const auto p = detail::validate_kvcache(q, cache, out, lse, options);
  return detail::run(p, options, "forward_kvcache", false);
}

DispatchReport explain_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& lse, const Options& options) {
  const auto p = detail::validate_forward(q, k, v, out, lse, options);
  return detail::run(p, options, "forward", false);
}

DispatchReport explain_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& out, const TensorView& dout, const TensorView& lse,
                                const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                const Options& options) {
  const auto p = detail::validate_backward(q, k, v, out, dout, lse, dq, dk, dv, options);
  return detail::run(p, options, "backward", false);
}

std::string DispatchReport::to_string() const {
  std::ostringstream s;
  if (ran.backend.empty()) {
    s << "nothing ran";
  } else {
    s << "ran " << ran.backend << " / " << ran.kernel;
    if (!ran.isa.empty()) s << " [" << ran.isa << "]";
    s << " block_q=" << ran.block_q << " block_k=" << ran.block_k << " threads=" << ran.threads;
    if (ran.splits > 0) s << " splits=" << ran.splits;
    if (!ran.detail.empty()) s << " " << ran.detail;
    if (!ran.mask.empty()) s << " mask=" << ran.mask;
    for (std::size_t i = 0; i < ran.score_hooks.size(); ++i) s << (i == 0 ? " hooks=" : ",") << ran.score_hooks[i];
  }
  if (requested != "auto" && !requested.empty()) s << " (requested " << requested << (fell_back ? ", fell back" : "") << ")";
  for (const Refusal& r : refused) {
    s << "\n  refused " << r.backend << ":";
    for (const std::string& why : r.reasons) s << "\n    - " << why;
  }
  return s.str();
}

}  // namespace flashtile
