// Generation of one fuzz call and of the answer the library owes it (see fuzz_call.h).
#include "fuzz_call.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <sstream>

#include "flashtile/attention.h"
#include "flashtile/errors.h"

namespace flashtile::app::fuzz {

const char* const kArgName[kArgs] = {"q",     "k",     "v",      "out",          "lse",          "dout",     "dq", "dk",
                                     "dv",    "alibi_slopes", "sinks", "dsinks", "cu_seqlens_q", "cu_seqlens_k", "seqused_k"};

const char* op_name(Op op) {
  switch (op) {
    case Op::forward: return "forward";
    case Op::backward: return "backward";
    case Op::explain_forward: return "explain_forward";
    case Op::explain_backward: return "explain_backward";
    case Op::make_view: return "make_view";
  }
  return "?";
}

const char* fault_name(Fault f) {
  static const char* const names[] = {"dtype", "lse_dtype", "device", "device_index", "null_data", "misaligned",
                                      "neg_size", "neg_stride", "last_stride", "overflow_stride", "self_overlap",
                                      "rank", "shape", "head_dim", "gqa", "alias", "threads", "scale",
                                      "unknown_backend", "bad_isa", "all_cuda", "window", "softcap", "variant_shape",
                                      "variant_dtype", "cu_values", "max_seqlen", "seqused", "dsinks", "sm_margin"};
  static_assert(sizeof(names) / sizeof(names[0]) == static_cast<std::size_t>(Fault::kCount));
  return names[static_cast<int>(f)];
}

std::int64_t TensorSpec::numel() const {
  std::int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= shape[static_cast<std::size_t>(i)];
  return n;
}

std::size_t TensorSpec::span_bytes() const {
  if (numel() <= 0) return 0;
  std::int64_t max_off = 0;
  for (int i = 0; i < rank; ++i) max_off += (shape[static_cast<std::size_t>(i)] - 1) * stride[static_cast<std::size_t>(i)];
  return static_cast<std::size_t>(max_off + 1) * dtype_size(dtype);
}

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct Rng {
  std::mt19937_64 g;
  std::int64_t u(std::int64_t n) { return static_cast<std::int64_t>(g() % static_cast<std::uint64_t>(n)); }  // [0, n)
  bool chance(int percent) { return u(100) < percent; }
  template <class T>
  T pick(std::initializer_list<T> xs) { return *(xs.begin() + u(static_cast<std::int64_t>(xs.size()))); }
};

DType other_dtype(DType t, Rng& r) {
  return static_cast<DType>((static_cast<int>(t) + 1 + r.u(2)) % 3);
}

std::int64_t head_dim(Rng& r) {
  const auto x = r.u(100);
  if (x < 35) return 1 + r.u(16);
  if (x < 70) return r.pick<std::int64_t>({8, 16, 32, 40, 64, 80, 96, 128, 160, 192, 256});
  if (x < 96) return 1 + r.u(256);
  if (x < 99) return 257 + r.u(44);  // out of range: InvalidArgument
  return 0;                          // likewise
}

std::int64_t seqlen(Rng& r, int size_class, std::int64_t max_s) {
  if (size_class == 0) return r.chance(12) ? 0 : 1 + r.u(5);
  if (size_class == 1) return 1 + r.u(std::max<std::int64_t>(max_s / 4, 1));
  return max_s / 2 + r.u(max_s - max_s / 2 + 1);
}

// Strides for a tensor of spec.shape: contiguous, padded, head-major, permuted, or (inputs) broadcast
// with a zero stride; size-1 dims sometimes get arbitrary strides (allowed: they are never stepped).
void layout(TensorSpec& s, Rng& r, bool may_broadcast) {
  const int last = s.rank - 1;
  std::vector<int> order;  // outer dims, outermost first
  for (int i = 0; i < last; ++i) order.push_back(i);
  const auto kind = r.u(100);
  const bool padded = (kind >= 50 && kind < 70) || kind >= 82;
  if (kind >= 70 && kind < 82 && order.size() >= 2) std::swap(order[0], order[1]);  // [B, H, S, D] memory for q..dv, [H, B, S] for lse
  if (kind >= 82) std::shuffle(order.begin(), order.end(), r.g);
  s.stride[static_cast<std::size_t>(last)] = 1;
  std::int64_t st = std::max<std::int64_t>(s.shape[static_cast<std::size_t>(last)], 1) + (padded ? r.u(9) : 0);
  for (int p = last - 1; p >= 0; --p) {
    const auto dim = static_cast<std::size_t>(order[static_cast<std::size_t>(p)]);
    s.stride[dim] = st;
    st = st * std::max<std::int64_t>(s.shape[dim], 1) + (padded ? r.u(17) : 0);
  }
  if (may_broadcast && last > 0 && kind >= 94) s.stride[static_cast<std::size_t>(r.u(last))] = 0;
  if (r.chance(20))
    for (int i = 0; i <= last; ++i)
      if (s.shape[static_cast<std::size_t>(i)] == 1) s.stride[static_cast<std::size_t>(i)] = r.u(100000);
}

std::vector<int> used_args(const Call& c) {
  std::vector<int> v;
  for (int a = 0; a < kArgs; ++a)
    if (c.t[static_cast<std::size_t>(a)].used) v.push_back(a);
  return v;
}

std::vector<int> output_args(const Call& c) {
  return c.is_backward() ? std::vector<int>{DQ, DK, DV} : std::vector<int>{OUT, LSE};
}

template <class Pred>
int pick_arg(const Call& c, Rng& r, Pred ok) {
  std::vector<int> v;
  for (int a : used_args(c))
    if (ok(c.t[static_cast<std::size_t>(a)], a)) v.push_back(a);
  return v.empty() ? -1 : v[static_cast<std::size_t>(r.u(static_cast<std::int64_t>(v.size())))];
}

// Applies fault f; false when it has nothing to act on here (it would be vacuous).
bool inject(Fault f, Call& c, Rng& r, const std::vector<std::string>& backends) {
  auto any = [](const TensorSpec&, int) { return true; };
  auto nonempty = [](const TensorSpec& s, int) { return s.numel() > 0; };
  auto& t = c.t;
  int a = -1;
  switch (f) {
    case Fault::dtype:
      a = pick_arg(c, r, [](const TensorSpec&, int x) { return x != Q && x != LSE && x < ALIBI; });
      t[static_cast<std::size_t>(a)].dtype = other_dtype(c.dtype, r);
      return true;
    case Fault::variant_dtype: {
      if ((a = pick_arg(c, r, [](const TensorSpec&, int x) { return x >= ALIBI; })) < 0) return false;
      TensorSpec& s = t[static_cast<std::size_t>(a)];
      s.dtype = static_cast<DType>((static_cast<int>(s.dtype) + 1 + r.u(3)) % 4);  // any of the other three
      return true;
    }
    case Fault::variant_shape: {
      if ((a = pick_arg(c, r, [](const TensorSpec&, int x) { return x >= ALIBI; })) < 0) return false;
      TensorSpec& s = t[static_cast<std::size_t>(a)];
      auto& dim = s.shape[static_cast<std::size_t>(r.u(s.rank))];
      dim += dim > 0 && r.chance(50) ? -1 : 1;
      return true;
    }
    case Fault::cu_values: {  // the three ways a cu_seqlens array can be wrong
      if (!c.varlen) return false;
      auto& cu = r.chance(50) ? c.cu_q : c.cu_k;
      const std::size_t n = cu.size();
      const std::int64_t kind = r.u(3);
      if (kind == 0) {
        cu[0] = static_cast<std::int32_t>(1 + r.u(3));
      } else if (kind == 1 && n >= 3) {
        const auto at = static_cast<std::size_t>(1 + r.u(static_cast<std::int64_t>(n) - 2));
        cu[at] = cu[at - 1] - static_cast<std::int32_t>(1 + r.u(2));
      } else {
        cu[n - 1] += static_cast<std::int32_t>(r.chance(50) ? 1 + r.u(3) : -1 - r.u(3));
      }
      return true;
    }
    case Fault::max_seqlen: {  // below the longest sequence of one side (that side has a non-empty one)
      if (!c.varlen) return false;
      auto longest = [](const std::vector<std::int32_t>& cu) {
        std::int64_t m = 0;
        for (std::size_t b = 1; b < cu.size(); ++b) m = std::max<std::int64_t>(m, cu[b] - cu[b - 1]);
        return m;
      };
      const bool q_side = r.chance(50);
      for (bool side : {q_side, !q_side}) {
        const std::int64_t m = longest(side ? c.cu_q : c.cu_k);
        if (m == 0) continue;
        (side ? c.options.max_seqlen_q : c.options.max_seqlen_k) = r.u(m);
        return true;
      }
      return false;
    }
    case Fault::seqused: {
      if (!t[SEQUSED].used || c.seqused.empty()) return false;
      const auto b = static_cast<std::size_t>(r.u(static_cast<std::int64_t>(c.seqused.size())));
      const std::int64_t keys = c.varlen ? c.cu_k[b + 1] - c.cu_k[b] : c.sk;
      c.seqused[b] = static_cast<std::int32_t>(r.chance(50) ? keys + 1 + r.u(3) : -1 - r.u(3));
      return true;
    }
    case Fault::dsinks:  // the backward's dsinks missing with sinks, or given without them
      if (!c.is_backward()) return false;
      if (c.sinks) {
        for (const TensorSpec& x : t)
          if (x.host == DSINKS) return false;  // an alias of dsinks would lose its memory block
        t[DSINKS].used = false;
      } else {
        t[DSINKS] = TensorSpec{true, false, DType::float32, 1, {c.hq, 0, 0, 0}, {1, 0, 0, 0}};
      }
      return true;
    case Fault::lse_dtype:
      t[LSE].dtype = r.pick({DType::float16, DType::bfloat16});
      return true;
    case Fault::device:
      c.mutations.push_back({Mutation::device, pick_arg(c, r, any)});
      return true;
    case Fault::device_index:
      c.mutations.push_back({Mutation::device_index, pick_arg(c, r, any), 0, r.pick<std::int64_t>({1, 7, -1})});
      return true;
    case Fault::all_cuda:
      for (int x : used_args(c)) c.mutations.push_back({Mutation::device, x});
      return true;
    case Fault::null_data:
      if ((a = pick_arg(c, r, nonempty)) < 0) return false;
      c.mutations.push_back({Mutation::null_data, a});
      return true;
    case Fault::misaligned:
      if ((a = pick_arg(c, r, [&](const TensorSpec& s, int) { return s.numel() > 0 && s.host < 0; })) < 0) return false;
      t[static_cast<std::size_t>(a)].offset += static_cast<std::size_t>(1 + r.u(static_cast<std::int64_t>(dtype_size(t[static_cast<std::size_t>(a)].dtype)) - 1));
      return true;
    case Fault::neg_size:
    case Fault::neg_stride: {
      a = pick_arg(c, r, any);
      const TensorSpec& s = t[static_cast<std::size_t>(a)];
      const int dim = static_cast<int>(r.u(s.rank));
      if (f == Fault::neg_size) c.mutations.push_back({Mutation::shape, a, dim, -1 - r.u(3)});
      else c.mutations.push_back({Mutation::stride, a, dim, -1 - s.stride[static_cast<std::size_t>(dim)]});
      return true;
    }
    case Fault::last_stride:
      a = pick_arg(c, r, [](const TensorSpec& s, int) { return s.numel() > 0 && s.shape[static_cast<std::size_t>(s.rank - 1)] >= 2; });
      if (a < 0) return false;
      c.mutations.push_back({Mutation::stride, a, t[static_cast<std::size_t>(a)].rank - 1, r.pick<std::int64_t>({0, 2, 3})});
      return true;
    case Fault::overflow_stride:
    case Fault::self_overlap: {
      const bool overlap = f == Fault::self_overlap;
      const auto outs = output_args(c);
      a = pick_arg(c, r, [&](const TensorSpec& s, int x) {
        if (overlap && (s.numel() == 0 || std::find(outs.begin(), outs.end(), x) == outs.end())) return false;
        for (int i = 0; i + 1 < s.rank; ++i)
          if (s.shape[static_cast<std::size_t>(i)] >= 2) return true;
        return false;
      });
      if (a < 0) return false;
      const TensorSpec& s = t[static_cast<std::size_t>(a)];
      int dim = 0;
      do dim = static_cast<int>(r.u(s.rank - 1));
      while (s.shape[static_cast<std::size_t>(dim)] < 2);
      std::int64_t v = overlap ? 0 : r.pick<std::int64_t>({std::int64_t{1} << 62, LLONG_MAX, std::int64_t{3} << 61});
      c.mutations.push_back({Mutation::stride, a, dim, v});
      return true;
    }
    case Fault::rank: {  // any rank but the valid ones (and but 0 for an option, which would mean "absent")
      a = pick_arg(c, r, any);
      const std::int64_t qlike = c.varlen ? 3 : 4;
      std::vector<std::int64_t> bad;
      for (std::int64_t k : {-1, 0, 1, 2, 3, 4, 5, 1000}) {
        const bool valid = a == LSE ? k == qlike - 1 : a < ALIBI ? k == qlike : a == ALIBI ? (k == 1 || k == 2) : k == 1;
        if (!valid && !(a >= ALIBI && k == 0)) bad.push_back(k);
      }
      c.mutations.push_back({Mutation::rank, a, 0, bad[static_cast<std::size_t>(r.u(static_cast<std::int64_t>(bad.size())))]});
      return true;
    }
    case Fault::shape: {
      a = pick_arg(c, r, [](const TensorSpec&, int x) { return x != Q && x < ALIBI; });
      auto& dim = t[static_cast<std::size_t>(a)].shape[static_cast<std::size_t>(r.u(t[static_cast<std::size_t>(a)].rank))];
      dim += dim > 0 && r.chance(50) ? -1 : 1;
      return true;
    }
    case Fault::alias: {
      const auto outs = output_args(c);
      a = outs[static_cast<std::size_t>(r.u(static_cast<std::int64_t>(outs.size())))];
      TensorSpec& s = t[static_cast<std::size_t>(a)];
      bool hosts = false;
      for (const TensorSpec& x : t) hosts = hosts || x.host == a;
      const int h = pick_arg(c, r, [&](const TensorSpec& x, int y) { return y != a && x.host < 0 && x.numel() > 0; });
      if (hosts || h < 0 || s.numel() == 0 || s.host >= 0) return false;
      const TensorSpec& hs = t[static_cast<std::size_t>(h)];
      const auto es = dtype_size(s.dtype);
      s.host = h;
      s.offset = hs.offset + (r.chance(50) ? 0 : static_cast<std::size_t>(r.u(std::max<std::int64_t>(static_cast<std::int64_t>(hs.span_bytes() / es), 1))) * es);
      return true;
    }
    case Fault::sm_margin:
      c.options.sm_margin = r.pick({-1, -9, INT_MIN});
      return true;
    case Fault::threads:
      c.options.num_threads = r.pick({-1, -3, INT_MIN});
      return true;
    case Fault::scale:
      c.options.softmax_scale = static_cast<float>(r.pick({kNaN, kInf, -kInf}));
      return true;
    case Fault::unknown_backend: {
      std::string name;
      do name = r.pick<const char*>({"", "cpu", "CPU-FLASH", "cpu-flash ", "cuda", "cuda-sm80", "cuda-sm90", "reference"});
      while (std::find(backends.begin(), backends.end(), name) != backends.end());
      c.options.backend = name;
      return true;
    }
    case Fault::bad_isa: {  // names no path, or a path this CPU cannot run (avx512 only where it lacks AVX-512)
      const auto paths = flashtile::cpu_isa_paths();
      const bool has_avx512 = std::find(paths.begin(), paths.end(), "avx512") != paths.end();
      c.isa = has_avx512 ? r.pick<const char*>({"avx9", "sse2", "AVX2"})
                         : r.pick<const char*>({"avx9", "sse2", "AVX2", "avx512"});
      return true;
    }
    case Fault::window:  // a side below -1 (-1 = unbounded)
      c.options.window_size[static_cast<std::size_t>(r.u(2))] = r.pick<std::int64_t>({-2, -3, -1000, LLONG_MIN});
      return true;
    case Fault::softcap:
      c.options.softcap = static_cast<float>(r.pick({-1.0, -1e-30, kNaN, kInf, -kInf}));
      return true;
    case Fault::head_dim:
    case Fault::gqa:
    case Fault::kCount: break;
  }
  return false;
}

// The variants beyond windows: softcap, ALiBi slopes ([Hq] or [B, Hq]), sinks, a varlen batch (cu_seqlens with
// empty sequences, lengths bounded like the batched ones and the same cost cap) and seqused_k.
void draw_variants(Call& c, Rng& r, int size_class, std::int64_t max_s, double cap) {
  Options& o = c.options;
  if (r.chance(20)) o.softcap = static_cast<float>(r.pick({0.05, 1.0, 5.0, 30.0, 50.0, 1e4}));
  c.alibi_rank = r.chance(20) ? 1 + static_cast<int>(r.u(2)) : 0;
  c.sinks = r.chance(20);
  std::vector<std::int64_t> lq, lk;
  if (r.chance(20)) {
    c.varlen = true;
    const std::int64_t nb = size_class == 0 ? r.pick<std::int64_t>({0, 1, 2, 3, 4}) : 1 + r.u(3);
    for (std::int64_t b = 0; b < nb; ++b) {
      lq.push_back(r.chance(20) ? 0 : seqlen(r, size_class, max_s));
      lk.push_back(r.chance(30) ? lq.back() : r.chance(20) ? 0 : seqlen(r, size_class, max_s));
    }
    const double per_pair = static_cast<double>(c.hq) * static_cast<double>(c.d + c.dv);
    for (;;) {
      double cost = 0;
      std::size_t big = 0;
      for (std::size_t b = 0; b < lq.size(); ++b) {
        cost += static_cast<double>(lq[b] * lk[b]) * per_pair;
        if (lq[b] * lk[b] > lq[big] * lk[big]) big = b;
      }
      if (cost <= cap) break;
      (lq[big] > lk[big] ? lq[big] : lk[big]) /= 2;
    }
    c.b = nb;
    c.cu_q.assign(1, 0);
    c.cu_k.assign(1, 0);
    for (std::int64_t b = 0; b < nb; ++b) {
      c.cu_q.push_back(static_cast<std::int32_t>(c.cu_q.back() + lq[static_cast<std::size_t>(b)]));
      c.cu_k.push_back(static_cast<std::int32_t>(c.cu_k.back() + lk[static_cast<std::size_t>(b)]));
    }
    c.sq = c.cu_q.back();
    c.sk = c.cu_k.back();
    const std::int64_t mq = lq.empty() ? 0 : *std::max_element(lq.begin(), lq.end());
    const std::int64_t mk = lk.empty() ? 0 : *std::max_element(lk.begin(), lk.end());
    o.max_seqlen_q = mq + (r.chance(20) ? r.u(4) : 0);  // a generous bound is fine
    o.max_seqlen_k = mk + (r.chance(20) ? r.u(4) : 0);
  }
  if (r.chance(15))
    for (std::int64_t b = 0; b < c.b; ++b)
      c.seqused.push_back(static_cast<std::int32_t>(r.u((c.varlen ? lk[static_cast<std::size_t>(b)] : c.sk) + 1)));
}

}  // namespace

Call generate(std::uint64_t seed, std::uint64_t index, std::int64_t max_seqlen, const std::vector<std::string>& backends,
              const std::vector<std::string>& isa_paths, const std::string& default_isa) {
  Rng r{std::mt19937_64(splitmix(seed ^ splitmix(index)))};
  Call c;
  c.data_seed = r.g();
  const auto x = r.u(100);
  c.op = x < 45 ? Op::forward : x < 80 ? Op::backward : x < 88 ? Op::explain_forward : x < 97 ? Op::explain_backward : Op::make_view;
  c.dtype = static_cast<DType>(r.u(3));
  // Shapes: most calls tiny (0 and 1 included), some a tile or two.
  const int size_class = r.chance(85) ? 0 : r.chance(85) ? 1 : 2;
  c.b = size_class == 0 ? r.pick<std::int64_t>({0, 1, 1, 1, 1, 2, 3}) : 1 + r.u(2);
  c.sq = seqlen(r, size_class, max_seqlen);
  c.sk = r.chance(30) ? c.sq : seqlen(r, size_class, max_seqlen);
  c.hkv = r.pick<std::int64_t>({1, 1, 1, 2, 3});
  c.hq = c.hkv * r.pick<std::int64_t>({1, 1, 2, 3, 4});
  if (r.chance(3)) c.hq = 0;
  if (r.chance(2)) c.hkv = c.hq = 0;
  if (r.chance(3)) {  // Hq not a multiple of Hkv
    c.hkv = 2 + r.u(2);
    c.hq = c.hkv * r.u(3) + 1 + r.u(c.hkv - 1);
    c.faults.push_back(Fault::gqa);
  }
  c.d = head_dim(r);
  c.dv = r.chance(50) ? c.d : head_dim(r);
  if (c.d < 1 || c.d > 256 || c.dv < 1 || c.dv > 256) c.faults.push_back(Fault::head_dim);
  const double cap = c.is_backward() ? 2e5 : 1e6;  // multiply-adds; keeps 10^6 calls near 20 min under ASan
  while (static_cast<double>(c.b * c.hq * c.sq * c.sk) * static_cast<double>(c.d + c.dv) > cap)
    (c.sq > c.sk ? c.sq : c.sk) /= 2;
  // Options.
  Options& o = c.options;
  draw_variants(c, r, size_class, max_seqlen, cap);
  o.causal = r.chance(50);
  if (r.chance(30))  // sliding windows, from one key to past the sequence, one side or both
    for (auto& side : o.window_size)
      side = r.chance(30) ? -1 : r.pick<std::int64_t>({0, 1, 2, 5, 1 + r.u(std::max<std::int64_t>(c.sk, 1) + 2)});
  if (r.chance(45))
    o.softmax_scale = static_cast<float>(r.pick({1 / std::sqrt(static_cast<double>(std::max<std::int64_t>(c.d, 1))), 1e-30, 1e-6, 1e-40,
                                                  4.0, 30.0, 1e4, 0.0, -0.0, -0.3, -0.125, r.chance(10) ? 1e30 : 2.0}));
  // Beyond ~1e4 a backward is ill-conditioned in float32 (dQ = scale * sum dS k with dS recomputed from
  // P = exp(s - LSE), s ~ 1e30): it says nothing about the kernels. Forwards take 1e30.
  if (c.is_backward() && o.softmax_scale && std::abs(*o.softmax_scale) > 1e4f) o.softmax_scale = 1e4f;
  if (r.chance(25) && !isa_paths.empty()) c.isa = isa_paths[static_cast<std::size_t>(r.u(static_cast<std::int64_t>(isa_paths.size())))];
  const std::string isa = c.isa ? *c.isa : default_isa;
  const auto bx = r.u(100);
  o.backend = bx < 55 ? "auto" : bx < 82 ? "cpu-flash" : bx < 94 ? "cpu-reference" : "cuda-sm80";
  if (std::find(backends.begin(), backends.end(), o.backend) == backends.end() && o.backend != "auto")
    c.faults.push_back(Fault::unknown_backend);  // cuda-sm80 in a build without CUDA
  o.strict = r.chance(20);
  o.deterministic = r.chance(30);
  o.num_threads = r.pick({0, 1, 1, 1, 2, 3});
  if (r.chance(10)) o.sm_margin = static_cast<int>(r.u(9));  // a CUDA option: the CPU backends ignore it
  if (r.chance(2)) c.mutations.push_back({Mutation::device_index, -2, 0, 3});  // every tensor on cpu:3: valid
  // Tensors: q, k, v (+ dout) are inputs; out and lse are outputs of forward and inputs of backward.
  const bool bwd = c.is_backward();
  // Varlen: q-like operands [total, H, D] (the batch dim dropped), lse [Hq, total_q].
  std::array<std::int64_t, 4> dims[kArgs] = {{c.b, c.sq, c.hq, c.d},  {c.b, c.sk, c.hkv, c.d}, {c.b, c.sk, c.hkv, c.dv},
                                             {c.b, c.sq, c.hq, c.dv}, {c.b, c.hq, c.sq, 0},    {c.b, c.sq, c.hq, c.dv},
                                             {c.b, c.sq, c.hq, c.d},  {c.b, c.sk, c.hkv, c.d}, {c.b, c.sk, c.hkv, c.dv},
                                             {c.hq},                  {c.hq},                  {c.hq},
                                             {c.b + 1},               {c.b + 1},               {c.b}};
  if (c.alibi_rank == 2) dims[ALIBI] = {c.b, c.hq};
  for (int a = 0; a < kArgs; ++a) {
    TensorSpec& s = c.t[static_cast<std::size_t>(a)];
    const bool variant = a >= ALIBI;
    s.used = variant ? (a == ALIBI   ? c.alibi_rank > 0
                        : a == SINKS ? c.sinks
                        : a == DSINKS ? c.sinks && bwd
                        : a == SEQUSED ? !c.seqused.empty() || (c.b == 0 && r.chance(15))
                                       : c.varlen)
                     : a <= LSE || bwd;
    s.input = a <= V || a == DOUT || (bwd && a <= LSE) || (variant && a != DSINKS);
    s.dtype = a >= CUQ ? DType::int32 : a == LSE || variant ? DType::float32 : c.dtype;
    s.rank = a == ALIBI ? std::max(c.alibi_rank, 1) : variant ? 1 : a == LSE ? 3 : 4;
    s.shape = dims[a];
    if (c.varlen && !variant) {
      s.rank -= 1;
      for (int i = 0; i < 3; ++i) s.shape[static_cast<std::size_t>(i)] = s.shape[static_cast<std::size_t>(i + 1)];
      s.shape[3] = 0;
    }
    // out and lse of a backward come from a forward; a broadcast alibi_slopes [B, Hq] has batch stride 0
    if (s.used) layout(s, r, a <= V || a == DOUT || a == ALIBI);
  }
  // Injected faults: none in most calls, one or two in the rest.
  const auto nf = r.u(100) < 62 ? 0 : r.chance(82) ? 1 : 2;
  for (int i = 0; i < nf; ++i) {
    const auto f = static_cast<Fault>(r.u(static_cast<std::int64_t>(Fault::kCount)));
    if (f == Fault::head_dim || f == Fault::gqa || std::find(c.faults.begin(), c.faults.end(), f) != c.faults.end())
      continue;  // natural faults are set above; a fault twice could undo itself (+1 then -1)
    const bool device_fault = f == Fault::device || f == Fault::all_cuda;  // together they could cancel out
    if (device_fault && std::count_if(c.faults.begin(), c.faults.end(), [](Fault g) { return g == Fault::device || g == Fault::all_cuda; }))
      continue;
    if (inject(f, c, r, backends)) c.faults.push_back(f);
  }
  // Special values in the inputs; Inf in v only at moderate scales, where no probability of a visible key
  // underflows to 0 in float32 (0 * Inf would be NaN there and Inf in the float64 oracle). dout gets NaN
  // only: with an infinite dO the gradients depend on the formula (delta = rowsum(dO o O) in the kernels,
  // rowsum(P o dP) in the oracle: +-inf against NaN), and the README does not define them.
  const float scale = o.softmax_scale ? *o.softmax_scale : 1.0f / std::sqrt(static_cast<float>(std::max<std::int64_t>(c.d, 1)));
  // ALiBi and sinks shift scores far enough to underflow a probability at any scale.
  const bool moderate = std::abs(scale) <= 2.0f / std::sqrt(static_cast<float>(std::max<std::int64_t>(c.d, 1))) &&
                        c.alibi_rank == 0 && !c.sinks;
  if (r.chance(10))
    for (auto n = 1 + r.u(3); n > 0; --n) {
      const int a = bwd ? r.pick({Q, K, V, DOUT}) : r.pick({Q, K, V});
      const auto ne = c.t[static_cast<std::size_t>(a)].numel();
      if (ne <= 0) continue;
      double val = r.pick({kNaN, kInf, -kInf});
      if ((a == V && !moderate) || a == DOUT) val = kNaN;
      c.specials.push_back({a, r.u(ne), val});
    }
  if (r.chance(4) && c.faults.empty() && scale > 0 && c.b > 0 && c.sq > 0 && c.sk > 0 && c.hq > 0 && !c.varlen &&
      o.softcap == 0.0f && !c.sinks) {
    // Row (b0, i0, h0): q = (-inf, 0, ..., 0) against keys whose first component is positive: every
    // visible score is -inf (softcap would make them -c, a sink would give the row its LSE).
    c.neg_inf_row = true;
    c.neg_row_alone = c.specials.empty();
    const std::int64_t b0 = r.u(c.b), i0 = r.u(c.sq), h0 = r.u(c.hq), hk0 = h0 / (c.hq / c.hkv);
    c.neg_row = {b0, i0, h0};
    for (std::int64_t e = 0; e < c.d; ++e) c.specials.push_back({Q, ((b0 * c.sq + i0) * c.hq + h0) * c.d + e, e == 0 ? -kInf : 0.0});
    for (std::int64_t j = 0; j < c.sk; ++j)
      c.specials.push_back({K, ((b0 * c.sk + j) * c.hkv + hk0) * c.d, 0.5 + static_cast<double>(r.u(100)) / 50});
  }
  return c;
}

Expect expect(const Call& c, const std::vector<std::string>& backends) {
  Expect e;
  bool strict_fault = false, unknown = false, nothing = false;
  for (Fault f : c.faults) {
    unsigned cls = 1u << static_cast<int>(ErrorCode::invalid_argument);
    if (f == Fault::dtype || f == Fault::lse_dtype) cls = 1u << static_cast<int>(ErrorCode::dtype);
    if (f == Fault::device || f == Fault::device_index) cls = 1u << static_cast<int>(ErrorCode::device);
    // Values of cu_seqlens / seqused_k live in device memory on a CUDA device: validation reads them on CPU only.
    const bool value_fault = f == Fault::cu_values || f == Fault::max_seqlen || f == Fault::seqused;
    if (value_fault && std::find(c.faults.begin(), c.faults.end(), Fault::all_cuda) != c.faults.end()) continue;
    if (f == Fault::variant_dtype) cls = 1u << static_cast<int>(ErrorCode::dtype);
    if (f == Fault::bad_isa || f == Fault::all_cuda) {
      nothing = nothing || f == Fault::all_cuda || c.options.backend != "cpu-reference";
      // With CUDA compiled in, a CUDA backend may look at the pointers and name them host memory.
      if (f == Fault::all_cuda) e.tolerated |= 1u << static_cast<int>(ErrorCode::device);
      continue;
    }
    if (f == Fault::unknown_backend) unknown = true;
    else if (f == Fault::misaligned) e.may_succeed = true;
    else strict_fault = true;
    e.error_classes |= cls;
  }
  if (strict_fault) e.may_succeed = false;
  if (!strict_fault && !unknown) {
    const bool named_cuda = c.options.backend.rfind("cuda", 0) == 0 &&
                            std::find(backends.begin(), backends.end(), c.options.backend) != backends.end();
    e.nothing_runs = nothing || (named_cuda && c.options.strict);  // no GPU memory here: a CUDA backend refuses
    e.backend = c.options.backend == "cpu-reference" ? "cpu-reference" : "cpu-flash";
  }
  return e;
}

std::string Call::variants() const {
  std::string v;
  auto add = [&v](bool on, const char* name) {
    if (on) v.append(v.empty() ? "" : "+").append(name);
  };
  add(options.window_size[0] != -1 || options.window_size[1] != -1, "window");
  add(options.softcap != 0.0f, "softcap");
  add(alibi_rank == 1, "alibi(Hq)");
  add(alibi_rank == 2, "alibi(B,Hq)");
  add(sinks, "sinks");
  add(varlen, "varlen");
  add(!seqused.empty() || t[SEQUSED].used, "seqused_k");
  return v.empty() ? "plain" : v;
}

std::string Call::describe() const {
  std::ostringstream s;
  s << op_name(op) << " " << dtype_name(dtype) << " B=" << b << " Sq=" << sq << " Sk=" << sk << " Hq=" << hq
    << " Hkv=" << hkv << " D=" << d << " Dv=" << dv << (options.causal ? " causal" : " full") << " window=("
    << options.window_size[0] << ", " << options.window_size[1] << ") softcap=" << options.softcap << " scale="
    << (options.softmax_scale ? std::to_string(*options.softmax_scale) : "default") << " backend='" << options.backend
    << "'" << (options.strict ? " strict" : "") << (options.deterministic ? " deterministic" : "")
    << " threads=" << options.num_threads << " sm_margin=" << options.sm_margin << " isa=" << (isa ? *isa : "(env)");
  if (alibi_rank) s << " alibi[" << (alibi_rank == 2 ? "B, Hq" : "Hq") << "]";
  if (sinks) s << " sinks";
  if (varlen) {
    s << " varlen max_seqlen=(" << options.max_seqlen_q << ", " << options.max_seqlen_k << ") cu_seqlens_q=";
    for (std::size_t i = 0; i < cu_q.size(); ++i) s << (i ? "," : "") << cu_q[i];
    s << " cu_seqlens_k=";
    for (std::size_t i = 0; i < cu_k.size(); ++i) s << (i ? "," : "") << cu_k[i];
  }
  if (!seqused.empty()) {
    s << " seqused_k=";
    for (std::size_t i = 0; i < seqused.size(); ++i) s << (i ? "," : "") << seqused[i];
  }
  s << "\n  faults:";
  for (Fault f : faults) s << " " << fault_name(f);
  if (neg_inf_row) s << " (row with all visible scores -inf)";
  for (int a = 0; a < kArgs; ++a) {
    const TensorSpec& ts = t[static_cast<std::size_t>(a)];
    if (!ts.used) continue;
    s << "\n  " << kArgName[a] << " " << dtype_name(ts.dtype) << " shape [";
    for (int i = 0; i < ts.rank; ++i) s << (i ? "," : "") << ts.shape[static_cast<std::size_t>(i)];
    s << "] stride [";
    for (int i = 0; i < ts.rank; ++i) s << (i ? "," : "") << ts.stride[static_cast<std::size_t>(i)];
    s << "] offset " << ts.offset;
    if (ts.host >= 0) s << " inside " << kArgName[ts.host];
  }
  for (const Mutation& m : mutations)
    s << "\n  mutation kind=" << m.kind << " arg=" << (m.arg >= 0 ? kArgName[m.arg] : "all") << " dim=" << m.dim << " value=" << m.value;
  for (const Special& sp : specials) s << "\n  special " << kArgName[sp.arg] << "[" << sp.flat << "] = " << sp.value;
  return s.str();
}

}  // namespace flashtile::app::fuzz
