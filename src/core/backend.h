// The interface every backend implements, and the registry that orders them for "auto".
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/params.h"
#include "flashtile/dispatch.h"

namespace flashtile::detail {

using Reasons = std::vector<std::string>;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // False for oracles that "auto" must never pick (they are chosen only by name).
  virtual bool eligible_for_auto() const { return true; }
  // Empty when the backend can run the call; otherwise one line per reason.
  virtual Reasons can_run(const AttnParams& p) const = 0;
  // True when p is not this backend's to run: its tensors are on another kind of device, the GPU is of another
  // architecture, or another backend holds the kernel made for the call (cuda-sm90's KV-cache calls of up to 16
  // packed rows run cuda-sm80's). Such a refusal is the plan, not a limit: strict "auto" does not call the backend
  // that runs instead a fall-back.
  virtual bool hands_over(const AttnParams& p) const = 0;
  // Describes the kernel that run() would launch for p (same tile sizes, ISA, threads).
  virtual KernelInfo plan(const AttnParams& p) const = 0;
  // Scratch bytes run(p) needs for a backward (Options::workspace); 0 when it needs none.
  virtual std::size_t workspace_bytes(const AttnParams& /*p*/) const { return 0; }
  // Runs forward (p.is_backward() false) or backward. Only called when can_run(p) is empty.
  virtual void run(const AttnParams& p) const = 0;
};

// All backends compiled into this build, in auto priority order (fastest first).
const std::vector<std::unique_ptr<Backend>>& registry();

// Registration hooks, one per backend family; each appends its backends.
void register_cpu_backends(std::vector<std::unique_ptr<Backend>>& out);
#if FLASHTILE_WITH_CUDA
void register_cuda_backends(std::vector<std::unique_ptr<Backend>>& out);
#endif

}  // namespace flashtile::detail
