// The flashtile command line: demo | info | check | bench | bench-variants | fuzz.
#include <cstdio>
#include <string>
#include <vector>

#include "args.h"
#include "commands.h"
#include "flashtile/errors.h"
#include "fuzz.h"

int main(int argc, char** argv) {
  using namespace flashtile::app;
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
    std::fputs(usage().c_str(), args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  try {
    const std::vector<std::string> rest(args.begin() + 1, args.end());
    if (args[0] == "demo") {
      if (!rest.empty()) throw flashtile::InvalidArgument("demo takes no flags; use check or bench for other shapes");
      return run_demo();
    }
    if (args[0] == "info") return run_info(rest);
    if (args[0] == "check") return run_check(parse_args(rest));
    if (args[0] == "bench") return run_bench(parse_args(rest));
    if (args[0] == "bench-variants") return run_bench_variants(rest);
    if (args[0] == "fuzz") return run_fuzz(rest);
    throw flashtile::InvalidArgument("unknown command '" + args[0] + "'\n" + usage());
  } catch (const flashtile::Error& e) {
    std::fprintf(stderr, "flashtile: %s\n", e.what());
    return 2;
  }
}
