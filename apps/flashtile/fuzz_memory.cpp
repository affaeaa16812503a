// See fuzz_memory.h.
#include "fuzz_memory.h"

#include <algorithm>
#include <bit>
#include <cmath>

#if FT_FUZZ_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace flashtile::app::fuzz {

void Block::poison([[maybe_unused]] bool on) {
#if FT_FUZZ_ASAN
  if (on) {
    ASAN_POISON_MEMORY_REGION(mem_.data(), kGuard);
    ASAN_POISON_MEMORY_REGION(mem_.data() + kGuard + n_, kGuard);
  } else {
    ASAN_UNPOISON_MEMORY_REGION(mem_.data(), mem_.size());
  }
#endif
}

std::uint32_t pattern(DType t, bool sentinel) {
  // float32, and int32 index tensors (their padding then reads as a huge index)
  if (dtype_size(t) == 4) return sentinel ? 0x7FA5A5A5u : 0x7FC00000u;
  if (t == DType::float16) return sentinel ? 0x7D5Au : 0x7E00u;
  return sentinel ? 0x7F9Bu : 0x7FC0u;
}

void write_elem(unsigned char* p, DType t, double x) {
  const float f = static_cast<float>(x);
  if (t == DType::int32) {
    const auto i = static_cast<std::int32_t>(std::isfinite(x) ? std::clamp(x, -2e9, 2e9) : 0.0);
    std::memcpy(p, &i, 4);
  } else if (t == DType::float32) {
    std::memcpy(p, &f, 4);
  } else if (t == DType::float16) {
    const _Float16 h = static_cast<_Float16>(f);
    std::memcpy(p, &h, 2);
  } else {
    std::uint32_t u = std::bit_cast<std::uint32_t>(f);
    u = std::isnan(f) ? (u | 0x400000u) : u + 0x7fffu + ((u >> 16) & 1u);
    const auto b = static_cast<std::uint16_t>(u >> 16);
    std::memcpy(p, &b, 2);
  }
}

std::vector<std::size_t> element_offsets(const TensorSpec& s) {
  std::vector<std::size_t> out;
  if (s.numel() <= 0) return out;
  out.reserve(static_cast<std::size_t>(s.numel()));
  std::array<std::int64_t, 4> sh{1, 1, 1, 1}, st{0, 0, 0, 0};
  for (int i = 0; i < s.rank; ++i) {
    sh[static_cast<std::size_t>(4 - s.rank + i)] = s.shape[static_cast<std::size_t>(i)];
    st[static_cast<std::size_t>(4 - s.rank + i)] = s.stride[static_cast<std::size_t>(i)];
  }
  const auto es = static_cast<std::int64_t>(dtype_size(s.dtype));
  for (std::int64_t a = 0; a < sh[0]; ++a)
    for (std::int64_t b = 0; b < sh[1]; ++b)
      for (std::int64_t c = 0; c < sh[2]; ++c)
        for (std::int64_t d = 0; d < sh[3]; ++d)
          out.push_back(s.offset + static_cast<std::size_t>((a * st[0] + b * st[1] + c * st[2] + d * st[3]) * es));
  return out;
}

// Roughly N(0, 1) (Irwin-Hall of four uniforms, |x| < 3.5): data for the calls, ten times cheaper than
// std::normal_distribution and no less good at finding bugs.
double normal(std::mt19937_64& rng) {
  const std::uint64_t x = rng();
  double s = 0;
  for (int i = 0; i < 4; ++i) s += static_cast<double>((x >> (16 * i)) & 0xffff) / 65536.0;
  return (s - 2.0) * 1.7320508075688772;
}

// An input's value at logical index n: the call's cu_seqlens / seqused_k entries (an extra entry of a wrong
// shape reads 0), ALiBi slopes of either sign around 0.25, sink logits around 0 with spread 2, else N(0, 1).
double input_value(const Call& c, int a, std::size_t n, std::mt19937_64& rng) {
  auto entry = [n](const std::vector<std::int32_t>& x) { return n < x.size() ? x[n] : 0; };
  switch (a) {
    case CUQ: return entry(c.cu_q);
    case CUK: return entry(c.cu_k);
    case SEQUSED: return entry(c.seqused);
    case ALIBI: return 0.25 * normal(rng);
    case SINKS: return 2.0 * normal(rng);
    default: return normal(rng);
  }
}

Arena::Arena(const Call& c, std::mt19937_64& rng) {
  block_of.fill(-1);
  for (int a = 0; a < kArgs; ++a) {
    const TensorSpec& s = c.t[static_cast<std::size_t>(a)];
    if (!s.used || s.host >= 0) continue;
    std::size_t n = s.offset + s.span_bytes();
    for (const TensorSpec& g : c.t)
      if (g.used && g.host == a) n = std::max(n, g.offset + g.span_bytes());
    block_of[static_cast<std::size_t>(a)] = static_cast<int>(blocks.size());
    blocks.push_back(std::make_unique<Block>(std::max<std::size_t>(n, 16)));
    fill_block(*blocks.back(), s.dtype, !s.input);
  }
  for (int a = 0; a < kArgs; ++a) {
    const TensorSpec& s = c.t[static_cast<std::size_t>(a)];
    if (!s.used) continue;
    elems[static_cast<std::size_t>(a)] = element_offsets(s);
    if (s.host >= 0) block_of[static_cast<std::size_t>(a)] = block_of[static_cast<std::size_t>(s.host)];
    unsigned char* base = blocks[static_cast<std::size_t>(block_of[static_cast<std::size_t>(a)])]->data();
    if (s.host < 0) {  // an alias keeps its host's bytes
      std::size_t n = 0;
      const bool sentinel = !s.input || (c.is_backward() && (a == OUT || a == LSE));
      for (std::size_t off : elems[static_cast<std::size_t>(a)]) {
        if (sentinel) write_bits(base + off, s.dtype, pattern(s.dtype, true));
        else write_elem(base + off, s.dtype, input_value(c, a, n, rng));
        ++n;
      }
    }
    TensorView& v = clean[static_cast<std::size_t>(a)];
    v.data = base + s.offset;
    v.dtype = s.dtype;
    v.rank = s.rank;
    v.shape = s.shape;
    v.stride = s.stride;
    if (s.numel() == 0 && rng() % 4 == 0) v.data = nullptr;  // allowed: no element to point at
  }
  for (const Special& sp : c.specials) {
    const auto& offs = elems[static_cast<std::size_t>(sp.arg)];
    write_elem(blocks[static_cast<std::size_t>(block_of[static_cast<std::size_t>(sp.arg)])]->data() + offs[static_cast<std::size_t>(sp.flat)],
               c.t[static_cast<std::size_t>(sp.arg)].dtype, sp.value);
  }
  view = clean;
  for (const Mutation& m : c.mutations)
    for (int a = 0; a < kArgs; ++a) {
      if (!c.t[static_cast<std::size_t>(a)].used || (m.arg >= 0 && m.arg != a)) continue;
      TensorView& v = view[static_cast<std::size_t>(a)];
      switch (m.kind) {
        case Mutation::shape: v.shape[static_cast<std::size_t>(m.dim)] = m.value; break;
        case Mutation::stride: v.stride[static_cast<std::size_t>(m.dim)] = m.value; break;
        case Mutation::rank: v.rank = static_cast<int>(m.value); break;
        case Mutation::device: v.device = Device::cuda; break;
        case Mutation::device_index: v.device_index = static_cast<int>(m.value); break;
        case Mutation::null_data: v.data = nullptr; break;
      }
    }
}

void Arena::write_bits(unsigned char* p, DType t, std::uint32_t bits) {
  if (dtype_size(t) == 4) std::memcpy(p, &bits, 4);
  else {
    const auto h = static_cast<std::uint16_t>(bits);
    std::memcpy(p, &h, 2);
  }
}
void Arena::fill_block(Block& b, DType t, bool sentinel) {
  const std::size_t es = dtype_size(t);
  for (std::size_t i = 0; i + es <= b.size(); i += es) write_bits(b.data() + i, t, pattern(t, sentinel));
}
std::vector<std::vector<unsigned char>> Arena::snapshot() const {
  std::vector<std::vector<unsigned char>> s;
  for (const auto& b : blocks) s.push_back(b->bytes());
  return s;
}
std::vector<int> Arena::output_blocks(const Call& c) const {
  std::vector<int> v;
  for (int a : c.is_backward() ? std::vector<int>{DQ, DK, DV, DSINKS} : std::vector<int>{OUT, LSE})
    if (c.t[static_cast<std::size_t>(a)].used) v.push_back(block_of[static_cast<std::size_t>(a)]);
  return v;
}

}  // namespace flashtile::app::fuzz
