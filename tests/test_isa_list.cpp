// Prints the CPU ISA paths this machine executes in a fixed form, so that scripts that run the suite once
// per path (scripts/seed_sweep.sh) can list them from the test binary alone, without the CLI.
#include <gtest/gtest.h>

#include <iostream>

#include "flashtile/flashtile.h"

namespace {

TEST(IsaPaths, Listed) {
  const auto paths = flashtile::cpu_isa_paths();
  ASSERT_FALSE(paths.empty()) << "no CPU ISA path is runnable here; scalar always should be";
  std::cout << "[flashtile] cpu isa paths runnable here:";
  for (const auto& p : paths) std::cout << ' ' << p;
  std::cout << '\n';
}

}  // namespace
