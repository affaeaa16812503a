// Memory of one fuzz call: each tensor in its own heap block with guard zones (poisoned under ASan,
// checked byte by byte otherwise); input padding holds quiet NaNs (a kernel that reads padding shows
// it), output elements start as a signalling-NaN sentinel that no arithmetic produces (an element left
// unwritten shows it).
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "flashtile/tensor.h"
#include "fuzz_call.h"

#if defined(__SANITIZE_ADDRESS__)
#define FT_FUZZ_ASAN 1
#else
#define FT_FUZZ_ASAN 0
#endif

namespace flashtile::app::fuzz {

constexpr std::size_t kGuard = 64;
constexpr unsigned char kGuardByte = 0xA7;

class Block {
 public:
  explicit Block(std::size_t n) : n_(n), mem_(n + 2 * kGuard, kGuardByte) { poison(true); }
  ~Block() { poison(false); }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
  unsigned char* data() { return mem_.data() + kGuard; }
  std::size_t size() const { return n_; }
  std::vector<unsigned char> bytes() const { return {mem_.begin() + kGuard, mem_.begin() + static_cast<std::ptrdiff_t>(kGuard + n_)}; }
  void restore(const std::vector<unsigned char>& b) { std::memcpy(data(), b.data(), n_); }
  bool guards_intact() const {
    if (FT_FUZZ_ASAN) return true;  // ASan reports any access to them
    for (std::size_t i = 0; i < kGuard; ++i)
      if (mem_[i] != kGuardByte || mem_[kGuard + n_ + i] != kGuardByte) return false;
    return true;
  }

 private:
  void poison(bool on);
  std::size_t n_;
  std::vector<unsigned char> mem_;
};

// Bit patterns of one element: quiet NaN (input padding) and a signalling NaN (unwritten output).
std::uint32_t pattern(DType t, bool sentinel);
// Stores x, rounded to the dtype, at p (any alignment).
void write_elem(unsigned char* p, DType t, double x);
// Byte offsets (from the block start) of the elements of a spec, in logical row-major order.
std::vector<std::size_t> element_offsets(const TensorSpec& s);
// Roughly N(0, 1): the calls' data.
double normal(std::mt19937_64& rng);

// The memory and views of one call.
struct Arena {
  std::vector<std::unique_ptr<Block>> blocks;
  std::array<int, kArgs> block_of{};
  std::array<std::vector<std::size_t>, kArgs> elems;  // element_offsets of each argument
  std::array<TensorView, kArgs> view{};    // as passed to the call (mutations applied)
  std::array<TensorView, kArgs> clean{};   // before the mutations, for reading results

  Arena(const Call& c, std::mt19937_64& rng);
  static void write_bits(unsigned char* p, DType t, std::uint32_t bits);
  static void fill_block(Block& b, DType t, bool sentinel);
  std::vector<std::vector<unsigned char>> snapshot() const;
  std::vector<int> output_blocks(const Call& c) const;
};

}  // namespace flashtile::app::fuzz
