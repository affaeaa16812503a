// What ran, and why everything else did not.
#pragma once

#include <string>
#include <vector>

namespace flashtile {

struct KernelInfo {
  std::string backend;   // "cpu-flash"
  std::string kernel;    // "cpu_flash_fwd"
  std::string isa;       // "avx2", "avx512", "scalar", "sm90", ...
  int block_q = 0;       // query rows per tile
  int block_k = 0;       // key rows per tile
  int threads = 0;       // CPU worker threads or GPU threads per block
  int splits = 0;        // forward_kvcache: parts each sequence's keys were split into (split-KV), 0 elsewhere
  std::string detail;    // anything else that identifies the instantiation (stages, warps, ...)
  // The mask the kernel ran with: "none", "causal", "window(left, right)" (causal with a left bound is
  // "window(left, 0)"), prefixed "varlen+" for packed batches and "seqused_k+" when sequences use fewer keys,
  // "kvcache+" / "paged_kvcache+" for forward_kvcache.
  std::string mask;
  // The score hooks it ran with, in the order they apply: "softcap(c)", "alibi", "sinks".
  std::vector<std::string> score_hooks;
};

struct Refusal {
  std::string backend;
  std::vector<std::string> reasons;
};

struct DispatchReport {
  std::string requested;          // the backend the caller asked for ("auto" or a name)
  KernelInfo ran;                 // empty backend when nothing ran (explain() on an unrunnable call)
  bool fell_back = false;         // a named backend could not run and another one did
  std::vector<Refusal> refused;   // every backend that was considered and refused, with reasons

  std::string to_string() const;
};

}  // namespace flashtile
