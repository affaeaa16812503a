#include "args.h"

#include <charconv>
#include <sstream>

#include "flashtile/errors.h"

namespace flashtile::app {
namespace {

std::int64_t to_int(const std::string& flag, const std::string& value, std::int64_t lo) {
  std::int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || ptr != value.data() + value.size() || v < lo)
    throw InvalidArgument(flag + ": expected an integer >= " + std::to_string(lo) + ", got '" + value + "'");
  return v;
}

DType to_dtype(const std::string& value) {
  if (value == "float32" || value == "fp32" || value == "f32") return DType::float32;
  if (value == "float16" || value == "fp16" || value == "f16") return DType::float16;
  if (value == "bfloat16" || value == "bf16") return DType::bfloat16;
  throw InvalidArgument("--dtype: expected float32, float16 or bfloat16, got '" + value + "'");
}

}  // namespace

std::string Shape::describe() const {
  std::ostringstream s;
  s << "B=" << batch << " Hq=" << heads << " Hkv=" << kv() << " Sq=" << seqlen_q << " Sk=" << sk() << " D=" << hdim;
  if (dv() != hdim) s << " Dv=" << dv();
  s << " " << dtype_name(dtype) << (causal ? " causal" : " full");
  return s.str();
}

double Shape::forward_flops() const {
  double visible = static_cast<double>(seqlen_q) * static_cast<double>(sk());
  if (causal) {  // query i sees min(Sk, max(0, i + Sk - Sq + 1)) keys
    visible = 0;
    for (std::int64_t i = 0; i < seqlen_q; ++i) {
      const std::int64_t e = i + sk() - seqlen_q + 1;
      visible += static_cast<double>(e < 0 ? 0 : (e > sk() ? sk() : e));
    }
  }
  return 2.0 * static_cast<double>(batch * heads) * visible * static_cast<double>(hdim + dv());
}

Args parse_args(const std::vector<std::string>& argv) {
  Args a;
  for (std::size_t i = 0; i < argv.size(); ++i) {
    const std::string& f = argv[i];
    auto value = [&]() -> const std::string& {
      if (i + 1 >= argv.size()) throw InvalidArgument(f + ": missing value");
      return argv[++i];
    };
    if (f == "--batch") a.shape.batch = to_int(f, value(), 0);
    else if (f == "--heads") a.shape.heads = to_int(f, value(), 1);
    else if (f == "--kv-heads") a.shape.kv_heads = to_int(f, value(), 1);
    else if (f == "--seqlen") a.shape.seqlen_q = a.shape.seqlen_k = to_int(f, value(), 0);
    else if (f == "--seqlen-q") a.shape.seqlen_q = to_int(f, value(), 0);
    else if (f == "--seqlen-k") a.shape.seqlen_k = to_int(f, value(), 1);
    else if (f == "--hdim") a.shape.hdim = to_int(f, value(), 1);
    else if (f == "--hdim-v") a.shape.hdim_v = to_int(f, value(), 1);
    else if (f == "--dtype") a.shape.dtype = to_dtype(value());
    else if (f == "--causal") a.shape.causal = true;
    else if (f == "--backend") a.backend = value();
    else if (f == "--threads") a.threads = static_cast<int>(to_int(f, value(), 0));
    else if (f == "--iters") a.iters = static_cast<int>(to_int(f, value(), 1));
    else if (f == "--backward") a.backward = true;
    else if (f == "--json") a.json = true;
    else if (f == "--seed") a.seed = static_cast<std::uint64_t>(to_int(f, value(), 0));
    else throw InvalidArgument("unknown flag '" + f + "'\n" + usage());
  }
  return a;
}

std::string usage() {
  return "usage: flashtile demo            standard attention vs FlashTile on the embedded default problem\n"
         "       flashtile info [--isa-paths] backends in this build, CPU ISA paths, threads (--isa-paths: one runnable path per line)\n"
         "       flashtile check [flags]   FlashTile vs the float64 reference (sampled rows) and vs standard attention\n"
         "       flashtile bench [flags]   time and GFLOP/s of FlashTile and standard attention in one run\n"
         "       flashtile bench-variants [--threads N --iters N --heads N --hdim N --quick --cells window,hooks,varlen]\n"
         "                                 window / score hooks / varlen against their plain peers, one process\n"
         "       flashtile fuzz [--calls N --seed S --skip K --max-seqlen N --verbose --buckets]\n"
         "                                 random API calls: each must match the float64 oracle or throw its typed error\n"
         "flags: --batch N --heads N --kv-heads N --seqlen N | --seqlen-q N --seqlen-k N --hdim N --hdim-v N\n"
         "       --dtype float32|float16|bfloat16 --causal --backend auto|cpu-flash|cpu-reference|...\n"
         "       --threads N --iters N --backward --seed N --json\n";
}

}  // namespace flashtile::app
