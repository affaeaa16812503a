#pragma once

#include <string>
#include <vector>

#include "args.h"

namespace flashtile::app {

int run_demo();
int run_info(const std::vector<std::string>& flags);  // flags: none, or --isa-paths
int run_check(const Args& a);
int run_bench(const Args& a);
// `flashtile bench-variants`: the issue-12 variants against their plain peers (bench_variants.cpp).
int run_bench_variants(const std::vector<std::string>& args);

}  // namespace flashtile::app
