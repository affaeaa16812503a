#pragma once

#include "args.h"

namespace flashtile::app {

int run_demo();
int run_info(const std::vector<std::string>& flags);  // flags: none, or --isa-paths
int run_check(const Args& a);
int run_bench(const Args& a);

}  // namespace flashtile::app
