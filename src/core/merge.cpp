// merge_attention_states (include/flashtile/merge.h): argument checks, then one pass over the rows.
#include "flashtile/merge.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "core/element.h"
#include "core/merge_rule.h"
#include "flashtile/errors.h"
#if FLASHTILE_WITH_CUDA
#include "cuda/pointer_check.h"
#endif

namespace flashtile {
namespace {

template <class E>
[[noreturn]] void fail(const std::string& what) {
  throw E("merge_attention_states: " + what);
}

std::string shape_str(const TensorView& t) {
  std::ostringstream s;
  s << "(";
  for (int d = 0; d < t.rank; ++d) s << (d ? ", " : "") << t.shape[static_cast<std::size_t>(d)];
  s << ")";
  return s.str();
}

std::int64_t dim(const TensorView& t, int d) { return t.shape[static_cast<std::size_t>(d)]; }
std::int64_t step(const TensorView& t, int d) { return t.stride[static_cast<std::size_t>(d)]; }

std::size_t elem_bytes(DType t) { return t == DType::float16 || t == DType::bfloat16 ? 2 : 4; }

// The bytes a view can touch: [first, last] (an empty view touches none).
struct Bytes {
  std::uintptr_t first = 0, last = 0;
  bool empty = true;
};
Bytes bytes_of(const TensorView& t) {
  Bytes b;
  if (t.numel() <= 0) return b;
  std::int64_t end = 0;
  for (int d = 0; d < t.rank; ++d) end += (dim(t, d) - 1) * step(t, d);
  b.first = reinterpret_cast<std::uintptr_t>(t.data);
  b.last = b.first + static_cast<std::uintptr_t>(end) * elem_bytes(t.dtype) + elem_bytes(t.dtype) - 1;
  b.empty = false;
  return b;
}
bool same_view(const TensorView& a, const TensorView& b) {
  return a.data == b.data && a.dtype == b.dtype && a.rank == b.rank && a.shape == b.shape && a.stride == b.stride;
}
bool overlap(const TensorView& a, const TensorView& b) {
  const Bytes x = bytes_of(a), y = bytes_of(b);
  return !x.empty && !y.empty && x.first <= y.last && y.first <= x.last;
}

void check_view(const char* name, const TensorView& t, bool is_lse, const TensorView& like) {
  const std::string n = name;
  if (t.rank < 1 || t.rank > 4) fail<InvalidArgument>(n + ": rank " + std::to_string(t.rank) + " outside 1..4");
  if (t.numel() < 0) fail<InvalidArgument>(n + ": shape " + shape_str(t) + " overflows int64");
  for (int d = 0; d < t.rank; ++d)
    if (step(t, d) < 0 || dim(t, d) < 0)
      fail<InvalidArgument>(n + ": negative sizes or strides are not supported");
  if (t.numel() > 0 && t.data == nullptr) fail<InvalidArgument>(n + ": null data with " + shape_str(t));
  if (t.device != Device::cpu)
    fail<DeviceError>(n + ": tensors are on cuda:" + std::to_string(t.device_index) +
                      "; the C++ merge runs on host memory (the Python package's torch form runs on any device)");
#if FLASHTILE_WITH_CUDA
  if (flashtile::detail::is_device_pointer(t.data))
    fail<DeviceError>(n + ": declared cpu but holds CUDA device memory");
#endif
  if (is_lse) {
    if (t.dtype != DType::float32)
      fail<DTypeError>(n + ": dtype " + std::string(dtype_name(t.dtype)) + ", expected float32");
  } else {
    if (t.dtype != DType::float32 && t.dtype != DType::float16 && t.dtype != DType::bfloat16)
      fail<DTypeError>(n + ": dtype " + std::string(dtype_name(t.dtype)) +
                       ", expected float32, float16 or bfloat16");
    if (t.dtype != like.dtype)
      fail<DTypeError>(n + ": dtype " + std::string(dtype_name(t.dtype)) + " differs from out's " +
                       std::string(dtype_name(like.dtype)));
    if (dim(t, t.rank - 1) > 1 && step(t, t.rank - 1) != 1)
      fail<InvalidArgument>(n + ": the last dimension must be contiguous (stride 1)");
  }
  if (t.rank != like.rank || !std::equal(t.shape.begin(), t.shape.begin() + t.rank, like.shape.begin()))
    fail<InvalidArgument>(n + ": shape " + shape_str(t) + " differs from " +
                          (is_lse ? "lse's " : "out's ") + shape_str(like));
}

float load(const void* base, DType t, std::int64_t i) {
  return static_cast<float>(detail::load_element(static_cast<const char*>(base) + i * elem_bytes(t), t));
}

// x rounded to the dtype as a framework stores it (core/element.h), then its bits written.
void store(void* base, DType t, std::int64_t i, float x) {
  const float r = detail::round_to(t, x);
  char* dst = static_cast<char*>(base) + i * elem_bytes(t);
  if (t == DType::float16) {
    const _Float16 h = static_cast<_Float16>(r);  // exact: r is a float16 value
    std::memcpy(dst, &h, 2);
  } else if (t == DType::bfloat16) {
    const auto h = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(r) >> 16);
    std::memcpy(dst, &h, 2);
  } else {
    std::memcpy(dst, &r, 4);
  }
}

// Element offset of row r (every index but the last, in row-major order over the first rank - 1 dims) of out.
std::int64_t row_offset(const TensorView& t, std::int64_t r) {
  std::int64_t off = 0;
  for (int d = t.rank - 2; d >= 0; --d) {
    const auto n = t.shape[static_cast<std::size_t>(d)];
    off += (r % n) * t.stride[static_cast<std::size_t>(d)];
    r /= n;
  }
  return off;
}

}  // namespace

void merge_attention_states(std::span<const TensorView> outs, std::span<const TensorView> lses, const TensorView& out,
                            const TensorView& lse) {
  if (outs.empty()) fail<InvalidArgument>("outs: at least one part is needed, got 0");
  if (outs.size() != lses.size())
    fail<InvalidArgument>("lses: " + std::to_string(lses.size()) + " tensors for " + std::to_string(outs.size()) +
                          " outs (one lse per part)");
  check_view("out", out, false, out);
  check_view("lse", lse, true, lse);
  // out [B, S, H, Dv] pairs with lse [B, H, S]; packed out [T, H, Dv] with lse [H, T].
  const bool packed = out.rank == 3;
  if (out.rank != 4 && out.rank != 3)
    fail<InvalidArgument>("out: expected [B, S, H, Dv] or [T, H, Dv], got shape " + shape_str(out));
  const std::int64_t B = packed ? 1 : out.shape[0], S = packed ? out.shape[0] : out.shape[1];
  const std::int64_t H = dim(out, out.rank - 2), D = dim(out, out.rank - 1);
  const bool lse_ok = packed ? (lse.rank == 2 && lse.shape[0] == H && lse.shape[1] == S)
                             : (lse.rank == 3 && lse.shape[0] == B && lse.shape[1] == H && lse.shape[2] == S);
  if (!lse_ok)
    fail<InvalidArgument>("lse: shape " + shape_str(lse) + " does not match out's " + shape_str(out) +
                          (packed ? " (expected [H, T])" : " (expected [B, H, S])"));
  for (std::size_t i = 0; i < outs.size(); ++i) {
    const std::string on = "outs[" + std::to_string(i) + "]", ln = "lses[" + std::to_string(i) + "]";
    check_view(on.c_str(), outs[i], false, out);
    check_view(ln.c_str(), lses[i], true, lse);
    if (!same_view(outs[i], out) && overlap(outs[i], out))
      fail<InvalidArgument>("out: overlaps " + on + " without being the same tensor (in place means identical views)");
    if (!same_view(lses[i], lse) && overlap(lses[i], lse))
      fail<InvalidArgument>("lse: overlaps " + ln + " without being the same tensor (in place means identical views)");
    if (overlap(outs[i], lse) || overlap(lses[i], out))
      fail<InvalidArgument>("out, lse: an output overlaps " + on + " or " + ln);
  }
  if (overlap(out, lse)) fail<InvalidArgument>("out, lse: the two outputs overlap");

  const std::size_t n = outs.size();
  std::vector<float> w(n);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t s = 0; s < S; ++s)
      for (std::int64_t h = 0; h < H; ++h) {
        const std::int64_t lse_off = packed ? h * lse.stride[0] + s * lse.stride[1]
                                            : b * lse.stride[0] + h * lse.stride[1] + s * lse.stride[2];
        auto lse_of = [&](const TensorView& t) {
          const std::int64_t o =
              packed ? h * t.stride[0] + s * t.stride[1] : b * t.stride[0] + h * t.stride[1] + s * t.stride[2];
          return static_cast<const float*>(t.data)[o];
        };
        for (std::size_t i = 0; i < n; ++i) w[i] = lse_of(lses[i]);
        const std::int64_t row = (b * S + s) * H + h;
        const float merged = detail::merged_lse([&](int i) { return w[static_cast<std::size_t>(i)]; }, static_cast<int>(n));
        for (std::size_t i = 0; i < n; ++i) w[i] = detail::part_weight(w[i], merged);
        const std::int64_t out_row = row_offset(out, row);
        for (std::int64_t d = 0; d < D; ++d) {
          float acc = 0.f;
          for (std::size_t i = 0; i < n; ++i)
            if (w[i] != 0.f || std::isnan(w[i]))
              acc += w[i] * load(outs[i].data, out.dtype, row_offset(outs[i], row) + d);
          store(out.data, out.dtype, out_row + d, acc);
        }
        static_cast<float*>(lse.data)[lse_off] = merged;
      }
}

void merge_attention_states(const TensorView& out_a, const TensorView& lse_a, const TensorView& out_b,
                            const TensorView& lse_b, const TensorView& out, const TensorView& lse) {
  const std::array<TensorView, 2> outs{out_a, out_b}, lses{lse_a, lse_b};
  merge_attention_states(outs, lses, out, lse);
}

}  // namespace flashtile
