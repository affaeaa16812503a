// The CPU backends: cpu-flash (tiled FlashAttention, SIMD per ISA, OpenMP) and cpu-reference (the
// float64 oracle, chosen only by name).
#include <algorithm>
#include <numeric>
#include <sstream>

#include "core/backend.h"
#include "cpu/convert.h"
#include "cpu/decode_plan.h"
#include "cpu/kernels.h"
#include "cpu/reference.h"
#include "flashtile/errors.h"
#if FLASHTILE_WITH_CUDA
#include "cuda/pointer_check.h"
#endif

namespace flashtile::detail {
namespace {

Reasons host_only(const AttnParams& p) {
  if (p.device == Device::cpu) {
#if FLASHTILE_WITH_CUDA  // device pointers passed as CPU tensors are refused, not dereferenced
    for (const void* ptr : {p.q, p.k, p.v, p.dout, static_cast<const void*>(p.out), static_cast<const void*>(p.lse),
                            static_cast<const void*>(p.dq), static_cast<const void*>(p.dk), static_cast<const void*>(p.dv),
                            static_cast<const void*>(p.alibi_slopes), static_cast<const void*>(p.sinks),
                            static_cast<const void*>(p.dsinks), static_cast<const void*>(p.cu_seqlens_q),
                            static_cast<const void*>(p.cu_seqlens_k), static_cast<const void*>(p.seqused_k),
                            static_cast<const void*>(p.cache_seqlens), static_cast<const void*>(p.cache_batch_idx),
                            static_cast<const void*>(p.page_table), p.k_new, p.v_new})
      if (is_device_pointer(ptr)) return {"device: tensors are declared cpu but hold CUDA device memory"};
#endif
    return {};
  }
  std::ostringstream s;
  s << "device: tensors are on " << device_name(p.device) << ":" << p.device_index
    << "; CPU backends read host memory";
  return {s.str()};
}

class CpuFlash final : public Backend {
  static cpu::TileConfig tiles(const AttnParams& p, const cpu::KernelSet& ks) {
    const std::int64_t d = p.hdim > p.hdim_v ? p.hdim : p.hdim_v;
    return p.is_backward() ? cpu::backward_tile_config(d) : ks.forward_tiles(d, p.dtype);
  }

 public:
  std::string name() const override { return "cpu-flash"; }
  bool hands_over(const AttnParams& p) const override { return p.device != Device::cpu; }
  Reasons can_run(const AttnParams& p) const override {
    Reasons why = host_only(p);
    try {
      cpu::select_kernels();
      cpu::forward_kernel_choice();
    } catch (const Error& e) {
      why.emplace_back(e.what());
    }
    return why;
  }
  KernelInfo plan(const AttnParams& given) const override {
    const AttnParams p = longest_sequences(given);  // what run() plans with
    const cpu::KernelSet& ks = cpu::select_kernels();
    const cpu::TileConfig t = tiles(p, ks);
    KernelInfo k;
    k.backend = name();
    k.kernel = p.is_backward() ? "cpu_flash_bwd" : "cpu_flash_fwd";
    k.isa = std::string(ks.isa);
    k.block_q = t.block_q;
    k.block_k = t.block_k;
    k.threads = cpu::resolve_threads(p.num_threads);
    k.detail = std::string("dtype=") + std::string(dtype_name(p.dtype)) + " accumulate=float32";
    if (t.group_q > 1) k.detail += " query_tiles_per_key_pass=" + std::to_string(t.group_q);
    if (p.dtype == DType::bfloat16 && !p.kvcache) {
      k.detail += " bf16 products: " + std::string(ks.bf16_products);
      if (p.is_backward() && ks.has_bf16_tiles())
        k.detail += " (float32 FMAs when Q, K, V or dO holds an Inf or NaN)";
    }
    const cpu::ForwardKernel choice = cpu::forward_kernel_choice();
    if (on_decode(p, ks, choice)) {
      const cpu::DecodePlan d = cpu::decode_plan(p, k.threads);
      k.kernel = "cpu_flash_decode";
      k.block_q = cpu::kDecodeRows;
      k.block_k = cpu::kDecodeKeys;
      k.splits = d.splits;
      const std::string_view tiles = ks.has_bf16_tiles() ? ks.bf16_products : std::string_view{};
      k.detail += " gqa_rows=" + std::to_string(p.group() * p.seqlen_q) +
                  " products: " + d.products(p, tiles, ks.decode_row_dots) + " splits: " + d.reason();
      if (!p.kvcache)
        k.detail += choice == cpu::ForwardKernel::decode
                        ? " (a forward, on this kernel as FLASHTILE_CPU_FORWARD=decode asks)"
                        : " (a forward whose " + std::to_string(p.group() * p.seqlen_q) +
                              " query rows per KV head fit one decode tile: each K/V row read once for them)";
    }
    return k;
  }
  void run(const AttnParams& p) const override {
    const cpu::KernelSet& ks = cpu::select_kernels();
    const int threads = cpu::resolve_threads(p.num_threads);
    const AttnParams sized = longest_sequences(p);
    if (on_decode(sized, ks, cpu::forward_kernel_choice()))
      return ks.decode(sized, cpu::decode_plan(sized, threads), threads);
    (p.is_backward() ? ks.backward : ks.forward)(sized, tiles(p, ks), threads);
  }

 private:
  // Whether the call (sized by longest_sequences) runs on the decode kernel: every forward_kvcache, and the forwards
  // of cpu::forward_on_decode's rule. plan() and run() both ask here.
  static bool on_decode(const AttnParams& sized, const cpu::KernelSet& ks, cpu::ForwardKernel choice) {
    return sized.kvcache || cpu::forward_on_decode(sized, ks.has_bf16_tiles(), choice);
  }
  // In a varlen call the kernels size their scratch (a K/V cache linear in Sk) and their tile loops by seqlen_q /
  // seqlen_k, and the decode kernel's rule and plan count rows and keys by them: there the longest sequences'
  // lengths (validation checked that max_seqlen_q / _k bound them, and a caller's generous bound need not cost
  // memory).
  static AttnParams longest_sequences(const AttnParams& p) {
    AttnParams s = p;
    if (!p.is_varlen()) return s;
    s.seqlen_q = s.seqlen_k = 0;
    for (std::int64_t b = 0; b < p.batch; ++b) {
      s.seqlen_q = std::max<std::int64_t>(s.seqlen_q, p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b]);
      s.seqlen_k = std::max<std::int64_t>(s.seqlen_k, p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b]);
    }
    return s;
  }
};

// Writes float64 rows into a [B, S, H, D] output of the call's dtype.
void scatter(const std::vector<double>& src, void* dst, const Strides& st, DType dtype, std::int64_t batch,
             std::int64_t seq, std::int64_t heads, std::int64_t dim) {
  cpu::visit_dtype(dtype, [&]<class T>() {
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t i = 0; i < seq; ++i)
        for (std::int64_t h = 0; h < heads; ++h) {
          T* d = cpu::row_ptr<T>(dst, st, b, i, h);
          const double* s = src.data() + ((b * seq + i) * heads + h) * dim;
          for (std::int64_t c = 0; c < dim; ++c) d[c] = cpu::from_float<T>(static_cast<float>(s[c]));
        }
  });
}

class CpuReference final : public Backend {
 public:
  std::string name() const override { return "cpu-reference"; }
  bool eligible_for_auto() const override { return false; }
  bool hands_over(const AttnParams& p) const override { return p.device != Device::cpu; }
  Reasons can_run(const AttnParams& p) const override {
    Reasons why = host_only(p);
    // The oracle takes dense K and V: a test gathers the cache into them itself (tests/test_kvcache.cpp), so that
    // kv_row(), the rule under test, is not also the oracle's.
    if (p.kvcache) why.emplace_back("KV cache: the oracle runs on dense K/V (gather the cache and call forward)");
    return why;
  }
  KernelInfo plan(const AttnParams& p) const override {
    KernelInfo k;
    k.backend = name();
    k.kernel = p.is_backward() ? "reference_bwd_f64" : "reference_fwd_f64";
    k.isa = "scalar";
    k.threads = 1;
    k.detail = "materialises S and P in float64, one row at a time";
    return k;
  }
  void run(const AttnParams& p) const override {
    // The oracle's dense shapes: [B, S, ...], or one packed batch of total rows (varlen).
    const std::int64_t db = p.is_varlen() ? 1 : p.batch;
    const std::int64_t sq = p.is_varlen() ? p.total_q : p.seqlen_q, sk = p.is_varlen() ? p.total_k : p.seqlen_k;
    if (!p.is_backward()) {
      std::vector<std::int64_t> rows(static_cast<std::size_t>(sq));
      std::iota(rows.begin(), rows.end(), std::int64_t{0});
      const auto r = cpu::reference_forward(p, rows);
      scatter(r.out, p.out, p.out_stride, p.dtype, db, sq, p.heads_q, p.hdim_v);
      for (std::int64_t b = 0; b < db; ++b)
        for (std::int64_t h = 0; h < p.heads_q; ++h)
          for (std::int64_t i = 0; i < sq; ++i)
            p.lse[b * p.lse_stride.batch + h * p.lse_stride.head + i * p.lse_stride.row] =
                static_cast<float>(r.lse[static_cast<std::size_t>((b * p.heads_q + h) * sq + i)]);
      return;
    }
    const auto g = cpu::reference_backward(p);
    scatter(g.dq, p.dq, p.dq_stride, p.dtype, db, sq, p.heads_q, p.hdim);
    scatter(g.dk, p.dk, p.dk_stride, p.dtype, db, sk, p.heads_kv, p.hdim);
    scatter(g.dv, p.dv, p.dv_stride, p.dtype, db, sk, p.heads_kv, p.hdim_v);
    for (std::size_t h = 0; h < g.dsinks.size(); ++h) p.dsinks[h] = static_cast<float>(g.dsinks[h]);
  }
};

}  // namespace

void register_cpu_backends(std::vector<std::unique_ptr<Backend>>& out) {
  out.push_back(std::make_unique<CpuFlash>());
  out.push_back(std::make_unique<CpuReference>());
}

}  // namespace flashtile::detail

namespace flashtile {

std::vector<std::string> cpu_isa_paths() {
  std::vector<std::string> out;
  for (std::string_view isa : cpu::runnable_isas()) out.emplace_back(isa);
  return out;
}

std::string cpu_isa_selected() { return std::string(cpu::select_kernels().isa); }

}  // namespace flashtile
