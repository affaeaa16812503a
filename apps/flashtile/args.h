// The flag vocabulary shared by `flashtile check` and `flashtile bench` (and the GPU benchmark):
// --batch --heads --kv-heads --seqlen-q --seqlen-k --seqlen --hdim --hdim-v --dtype --causal --backend
// plus --threads --iters --backward --seed --json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flashtile/types.h"

namespace flashtile::app {

struct Shape {
  std::int64_t batch = 1, heads = 8, kv_heads = 0, seqlen_q = 4096, seqlen_k = 0, hdim = 128, hdim_v = 0;
  DType dtype = DType::float32;
  bool causal = false;
  std::int64_t kv() const { return kv_heads > 0 ? kv_heads : heads; }
  std::int64_t sk() const { return seqlen_k > 0 ? seqlen_k : seqlen_q; }
  std::int64_t dv() const { return hdim_v > 0 ? hdim_v : hdim; }
  std::string describe() const;
  // Forward FLOPs: 2·B·Hq·Sq·Sk·(D + Dv), counting only visible (unmasked) scores under causal.
  double forward_flops() const;
};

struct Args {
  Shape shape;
  std::string backend = "auto";
  int threads = 0;
  int iters = 5;
  bool backward = false;
  bool json = false;  // bench: also print one JSON object with every figure
  std::uint64_t seed = 0;  // 0 = fresh
};

// Parses argv (after the subcommand). Throws flashtile::InvalidArgument naming the flag on bad input.
Args parse_args(const std::vector<std::string>& argv);
std::string usage();

}  // namespace flashtile::app
