// One random call of `flashtile fuzz`: what it does, with what arguments, which faults were injected and
// therefore what the library must answer. Generated from (seed, call number) alone, so that any call
// replays by itself.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "flashtile/options.h"
#include "flashtile/types.h"

namespace flashtile::app::fuzz {

// q..dv as in forward/backward; then the variants' tensors of Options: alibi_slopes, sinks, dsinks (a backward
// output), cu_seqlens_q / _k and seqused_k (int32). Varlen calls pack q-like operands as [total, H, D].
enum Arg { Q, K, V, OUT, LSE, DOUT, DQ, DK, DV, ALIBI, SINKS, DSINKS, CUQ, CUK, SEQUSED, kArgs };
extern const char* const kArgName[kArgs];

enum class Op { forward, backward, explain_forward, explain_backward, make_view };
const char* op_name(Op op);

// Injected faults. Each names the typed error it calls for (fuzz_call.cpp, fault_classes).
enum class Fault {
  dtype, lse_dtype, device, device_index, null_data, misaligned, neg_size, neg_stride, last_stride,
  overflow_stride, self_overlap, rank, shape, head_dim, gqa, alias, threads, scale, unknown_backend,
  bad_isa, all_cuda, window, softcap,
  variant_shape,  // alibi_slopes / sinks / dsinks / cu_seqlens / seqused_k of a wrong shape
  variant_dtype,  // ... of a wrong dtype
  cu_values,      // cu_seqlens not starting at 0, not non-decreasing, or not ending at the packed length
  max_seqlen,     // max_seqlen_q / _k below a sequence's length (or negative)
  seqused,        // seqused_k[b] outside [0, keys of sequence b]
  dsinks,         // a backward with sinks and no dsinks, or dsinks without sinks
  sm_margin,      // Options::sm_margin below 0
  kCount
};
const char* fault_name(Fault f);

// A change made to a view after make_view built it (layouts the allocation must not follow).
struct Mutation {
  enum Kind { shape, stride, rank, device, device_index, null_data } kind;
  int arg;
  int dim = 0;
  std::int64_t value = 0;
};

// An element set to a special value after the random fill: (arg, logical row-major index, value).
struct Special {
  int arg;
  std::int64_t flat;
  double value;
};

struct TensorSpec {
  bool used = false, input = false;
  DType dtype = DType::float32;
  int rank = 4;
  std::array<std::int64_t, 4> shape{}, stride{};
  int host = -1;            // the argument whose memory block this one lives in (aliasing); -1: its own
  std::size_t offset = 0;   // bytes from the start of the block (misaligned pointers, aliasing)
  std::int64_t numel() const;
  std::size_t span_bytes() const;  // bytes from the first to one past the last element; 0 when empty
};

struct Call {
  Op op = Op::forward;
  DType dtype = DType::float32;
  std::int64_t b = 1, sq = 1, sk = 1, hq = 1, hkv = 1, d = 1, dv = 1;
  std::array<TensorSpec, kArgs> t{};
  Options options;
  std::optional<std::string> isa;  // FLASHTILE_CPU_ISA for this call
  std::vector<Mutation> mutations;
  std::vector<Special> specials;
  std::vector<Fault> faults;       // injected and not vacuous
  int alibi_rank = 0;              // alibi_slopes: 0 none, 1 [Hq], 2 [B, Hq]
  bool sinks = false;              // sinks [Hq] (and dsinks in a backward)
  bool varlen = false;             // packed: b sequences, sq = total_q, sk = total_k
  std::vector<std::int32_t> cu_q, cu_k, seqused;  // the values of CUQ, CUK, SEQUSED
  bool neg_inf_row = false;        // a row built so that every visible score is -inf
  bool neg_row_alone = false;      // ... and no other special value in the inputs
  std::array<std::int64_t, 3> neg_row{};  // its (batch, query row, head)
  std::uint64_t data_seed = 0;

  bool is_backward() const { return op == Op::backward || op == Op::explain_backward; }
  std::string describe() const;
  // The variants drawn, "window+softcap+alibi(B,Hq)+sinks+varlen+seqused_k", or "plain".
  std::string variants() const;
};

// What the library must answer.
struct Expect {
  unsigned error_classes = 0;  // bit (1 << ErrorCode): a validation fault must raise one of these
  bool may_succeed = false;    // a fault the API does not document (misaligned pointers): success is fine too
  unsigned tolerated = 0;      // further error classes accepted but not required
  bool nothing_runs = false;   // no backend can run it: forward/backward UnsupportedError, explain an empty report
  std::string backend;         // the backend that must run when the call succeeds
};

// `backends` is flashtile::backend_names(), `isa_paths` flashtile::cpu_isa_paths(); `max_seqlen` bounds Sq, Sk.
Call generate(std::uint64_t seed, std::uint64_t index, std::int64_t max_seqlen, const std::vector<std::string>& backends,
              const std::vector<std::string>& isa_paths, const std::string& default_isa);
Expect expect(const Call& c, const std::vector<std::string>& backends);

}  // namespace flashtile::app::fuzz
