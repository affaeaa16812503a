// The CPU FlashAttention kernels. kernels_impl.h is compiled once per ISA (see CMakeLists.txt), each copy
// in its own namespace; isa.cpp picks one at run time from the CPU's features.
#pragma once

#include <string_view>
#include <vector>

#include "core/params.h"
#include "cpu/tile_config.h"

namespace flashtile::cpu {

struct DecodePlan;  // decode_plan.h

inline TileConfig default_forward_tiles(std::int64_t hdim, DType) { return tile_config(hdim); }

struct KernelSet {
  std::string_view isa;
  void (*forward)(const detail::AttnParams&, TileConfig, int threads);
  void (*backward)(const detail::AttnParams&, TileConfig, int threads);
  void (*decode)(const detail::AttnParams&, const DecodePlan&, int threads);  // forward_kvcache
  // Whether the dispatch may pick it by itself on a CPU that executes it; never: only when FLASHTILE_CPU_ISA names
  // it (a test path, or a set that loses where measured).
  bool (*chosen_by_itself)() = [] { return true; };
  // Forward tile sizes for a head dim and dtype (tile_config.h); the backward's are backward_tile_config.
  TileConfig (*forward_tiles)(std::int64_t hdim, DType dtype) = &default_forward_tiles;
  // What the products of a bf16 forward, backward and many-row decode run on (the dispatch report's "bf16
  // products"): the set's bf16 tile products (bf16_tiles.h), or the float32 kernels.
  std::string_view bf16_products = kFloat32Products;
  // Whether the decode's per-row path (fewer than kMatrixRows rows of a KV head) takes a bf16 cache's Q·Kᵀ on
  // vdpbf16ps (flash_decode.cpp qk_rows_dots, FT_DECODE_DOTS: the avx512-bf16 set).
  bool decode_row_dots = false;
  static constexpr std::string_view kFloat32Products = "float32 FMAs on converted tiles";
  bool has_bf16_tiles() const { return bf16_products != kFloat32Products; }
};

// AMX sets: bf16 forwards on amx_tile_config, other dtypes on their float32 kernels' tiles (the emulated set's are
// AVX2's, the real one's AVX-512's).
inline TileConfig amx_forward_tiles(std::int64_t hdim, DType dtype) {
  return dtype == DType::bfloat16 ? amx_tile_config(hdim) : tile_config(hdim);
}
inline TileConfig avx512_amx_forward_tiles(std::int64_t hdim, DType dtype) {
  return dtype == DType::bfloat16 ? amx_tile_config(hdim) : avx512_tile_config(hdim);
}
// AVX-512 sets without AMX: the float32 kernels on avx512_tile_config, except avx512-bf16's bf16 forward on pairs
// (bf16_pairs.h), whose tiles stay tile_config's (measured there on the Zen 4-class EPYC).
inline TileConfig avx512_forward_tiles(std::int64_t hdim, DType) { return avx512_tile_config(hdim); }
inline TileConfig avx512_bf16_forward_tiles(std::int64_t hdim, DType dtype) {
  return dtype == DType::bfloat16 ? tile_config(hdim) : avx512_tile_config(hdim);
}

#define FLASHTILE_DECLARE_ISA(ns)                                                  \
  namespace ns {                                                                   \
  void forward(const detail::AttnParams& p, TileConfig tile, int threads);        \
  void backward(const detail::AttnParams& p, TileConfig tile, int threads);       \
  void decode(const detail::AttnParams& p, const DecodePlan& plan, int threads);  \
  }
FLASHTILE_DECLARE_ISA(scalar)
FLASHTILE_DECLARE_ISA(avx2)
FLASHTILE_DECLARE_ISA(avx512)
#undef FLASHTILE_DECLARE_ISA
// Sets whose bf16 forward, backward and many-row decode run on bf16 dot-product pairs (bf16_pairs.h); their other
// dtypes run the float32 kernels.
namespace avx512_bf16 {
void forward(const detail::AttnParams& p, TileConfig tile, int threads);
void backward(const detail::AttnParams& p, TileConfig tile, int threads);
void decode(const detail::AttnParams& p, const DecodePlan& plan, int threads);
}
namespace avx2_bf16emu {
void forward(const detail::AttnParams& p, TileConfig tile, int threads);
void backward(const detail::AttnParams& p, TileConfig tile, int threads);
void decode(const detail::AttnParams& p, const DecodePlan& plan, int threads);
}
// Sets whose bf16 forward and backward run on AMX tiles (amx_tiles.h); the emulated one is for the tests.
namespace avx512_amx {
void forward(const detail::AttnParams& p, TileConfig tile, int threads);
void backward(const detail::AttnParams& p, TileConfig tile, int threads);
void decode(const detail::AttnParams& p, const DecodePlan& plan, int threads);
}
namespace avx2_amxemu {
void forward(const detail::AttnParams& p, TileConfig tile, int threads);
void backward(const detail::AttnParams& p, TileConfig tile, int threads);
void decode(const detail::AttnParams& p, const DecodePlan& plan, int threads);
}

// The kernel set for this CPU, or the one forced by FLASHTILE_CPU_ISA=scalar|avx2|avx512|avx512-bf16|avx512-amx|
// avx2-bf16emu|avx2-amxemu.
// Throws UnsupportedError when the forced ISA is not available here.
const KernelSet& select_kernels();

// Kernel sets this CPU can execute, best last (test paths included: the test script forces each).
std::vector<std::string_view> runnable_isas();

// Worker threads a call with num_threads (0 = default) will use.
int resolve_threads(int num_threads);

}  // namespace flashtile::cpu
