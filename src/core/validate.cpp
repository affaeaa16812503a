#include "core/validate.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "core/validate_args.h"
#include "flashtile/errors.h"

namespace flashtile::detail {
namespace {

using namespace args;

// Values of a cu_seqlens array in host memory: 0 first, non-decreasing, the packed length last, and no sequence
// longer than max_seqlen.
void check_cu_values(const char* name, const TensorView& cu, std::int64_t total, const char* total_name,
                     const char* max_name, std::int64_t max_len) {
  const std::int64_t n = cu.shape[0];
  if (entry(cu, 0) != 0) fail<InvalidArgument>(name, ": must start at 0, got ", name, "[0] = ", entry(cu, 0));
  for (std::int64_t b = 1; b < n; ++b)
    if (entry(cu, b) < entry(cu, b - 1))
      fail<InvalidArgument>(name, ": must be non-decreasing, got ", name, "[", b, "] = ", entry(cu, b), " < ", name,
                            "[", b - 1, "] = ", entry(cu, b - 1));
  if (entry(cu, n - 1) != total)
    fail<InvalidArgument>(name, ": must end at the packed length ", total_name, " = ", total, ", got ", name, "[",
                          n - 1, "] = ", entry(cu, n - 1));
  for (std::int64_t b = 1; b < n; ++b) {
    const std::int64_t len = std::int64_t{entry(cu, b)} - entry(cu, b - 1);
    if (len > max_len)
      fail<InvalidArgument>(max_name, ": ", max_len, " is smaller than sequence ", b - 1, "'s length ", len, " (",
                            name, ")");
  }
}

// cu_seqlens_q / cu_seqlens_k (both or neither) and seqused_k. Values are read only for host tensors: CUDA
// tensors' values live in device memory (the CUDA backend decides what it checks there).
void check_varlen(Checked& c, const Options& o, const TensorView& q) {
  AttnParams& p = c.p;
  if (c.varlen) {
    if (present(o.cu_seqlens_q) != present(o.cu_seqlens_k))
      fail<InvalidArgument>(present(o.cu_seqlens_q) ? "cu_seqlens_k: required with cu_seqlens_q"
                                                    : "cu_seqlens_q: required with cu_seqlens_k");
    const TensorView& cq = o.cu_seqlens_q;
    if (cq.rank == 1 && cq.shape[0] < 1)
      fail<InvalidArgument>("cu_seqlens_q: expected [B + 1] with B >= 0, got ", shape_str(cq));
    c.inputs.emplace_back("cu_seqlens_q", check_index({"cu_seqlens_q", cq, "[B + 1]", false}, q,
                                                      cq.rank == 1 ? std::max<std::int64_t>(cq.shape[0], 1) : 1));
    p.batch = cq.shape[0] - 1;
    c.inputs.emplace_back("cu_seqlens_k", check_index({"cu_seqlens_k", o.cu_seqlens_k, "[B + 1]", false}, q, p.batch + 1));
    for (auto [name, value] : {std::pair{"max_seqlen_q", o.max_seqlen_q}, std::pair{"max_seqlen_k", o.max_seqlen_k}})
      if (value < 0) fail<InvalidArgument>(name, ": must be >= 0, got ", value);
    p.seqlen_q = o.max_seqlen_q;
    p.seqlen_k = o.max_seqlen_k;
    p.cu_seqlens_q = static_cast<const std::int32_t*>(cq.data);
    p.cu_seqlens_k = static_cast<const std::int32_t*>(o.cu_seqlens_k.data);
    if (q.device == Device::cpu) {
      check_host_readable("cu_seqlens_q", cq);
      check_host_readable("cu_seqlens_k", o.cu_seqlens_k);
      check_cu_values("cu_seqlens_q", cq, p.total_q, "total_q", "max_seqlen_q", p.seqlen_q);
      check_cu_values("cu_seqlens_k", o.cu_seqlens_k, p.total_k, "total_k", "max_seqlen_k", p.seqlen_k);
    }
  }
  if (!present(o.seqused_k)) return;
  c.inputs.emplace_back("seqused_k", check_index({"seqused_k", o.seqused_k, "[B]", false}, q, p.batch));
  p.seqused_k = static_cast<const std::int32_t*>(o.seqused_k.data);
  if (q.device != Device::cpu) return;
  check_host_readable("seqused_k", o.seqused_k);
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int64_t keys = c.varlen ? std::int64_t{entry(o.cu_seqlens_k, b + 1)} - entry(o.cu_seqlens_k, b)
                                       : p.seqlen_k;
    if (entry(o.seqused_k, b) < 0 || entry(o.seqused_k, b) > keys)
      fail<InvalidArgument>("seqused_k: seqused_k[", b, "] = ", entry(o.seqused_k, b), " is outside [0, ", keys,
                            "] (the keys of sequence ", b, ")");
  }
}

// q, k, v (+ dout) sizes, dtypes, devices, and the options.
Checked check_inputs(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView* dout,
                     const Options& o) {
  Checked c;
  c.varlen = present(o.cu_seqlens_q) || present(o.cu_seqlens_k);
  const int rank = c.rank();
  const Arg aq{"q", q, c.q_layout(false), false}, ak{"k", k, c.k_layout(false), false},
      av{"v", v, c.k_layout(true), false};
  check_float(aq);
  c.inputs.emplace_back("q", check_layout(aq, rank));
  c.inputs.emplace_back("k", check_layout(ak, rank));
  c.inputs.emplace_back("v", check_layout(av, rank));
  AttnParams& p = c.p;
  // Dims of a q-like operand: [B, S, H, D] or [total, H, D].
  const std::size_t ds = c.varlen ? 0 : 1, dh = ds + 1, dd = ds + 2;
  p.batch = c.varlen ? 0 : q.shape[0];
  p.seqlen_q = q.shape[ds];
  p.heads_q = q.shape[dh];
  p.hdim = q.shape[dd];
  p.seqlen_k = k.shape[ds];
  p.heads_kv = k.shape[dh];
  p.hdim_v = v.shape[dd];
  p.total_q = c.varlen ? q.shape[0] : p.batch * p.seqlen_q;
  p.total_k = c.varlen ? k.shape[0] : p.batch * p.seqlen_k;
  if (p.hdim < 1 || p.hdim > kMaxHeadDim)
    fail<InvalidArgument>("q: head dim D = ", p.hdim, " is out of range [1, ", kMaxHeadDim, "] (shape ",
                          shape_str(q), ")");
  if ((!c.varlen && k.shape[0] != p.batch) || k.shape[dd] != p.hdim)
    fail<InvalidArgument>("k: expected ", c.k_layout(false), c.varlen ? "" : " with B = ", c.varlen ? "" : std::to_string(p.batch),
                          " and D = ", p.hdim, " from q ", shape_str(q), ", got ", shape_str(k));
  if (p.hdim_v < 1 || p.hdim_v > kMaxHeadDim)
    fail<InvalidArgument>("v: head dim Dv = ", p.hdim_v, " is out of range [1, ", kMaxHeadDim, "] (shape ",
                          shape_str(v), ")");
  check_dims(av, c.k_like(p.hdim_v));
  if (p.heads_kv == 0 ? p.heads_q != 0 : p.heads_q % p.heads_kv != 0)
    fail<InvalidArgument>("k: query heads Hq = ", p.heads_q, " must be a multiple of key/value heads Hkv = ",
                          p.heads_kv);
  check_dtype(ak, q.dtype, "q's dtype");
  check_dtype(av, q.dtype, "q's dtype");
  check_same_device(ak, q);
  check_same_device(av, q);
  check_varlen(c, o, q);  // sets batch and the maxima in varlen mode
  if (dout != nullptr) {
    const Arg ad{"dout", *dout, c.q_layout(true), false};
    c.inputs.emplace_back("dout", check_layout(ad, rank));
    check_dims(ad, c.q_like(p.hdim_v));
    check_dtype(ad, q.dtype, "q's dtype");
    check_same_device(ad, q);
    p.dout = dout->data;
    p.dout_stride = rows_of(*dout);
  }
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.q_stride = rows_of(q);
  p.k_stride = rows_of(k);
  p.v_stride = rows_of(v);
  p.dtype = q.dtype;
  p.device = q.device;
  p.device_index = q.device_index;
  check_options(c, o, q);
  return c;
}
}  // namespace

AttnParams validate_inputs(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView* dout,
                           const Options& options) {
  return check_inputs(q, k, v, dout, options).p;
}

AttnParams validate_forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                            const TensorView& lse, const Options& options) {
  Checked c = check_inputs(q, k, v, nullptr, options);
  AttnParams& p = c.p;
  check_output(c, {"out", out, c.q_layout(true), true}, c.rank(), c.q_like(p.hdim_v), q.dtype, "q's dtype", q);
  check_output(c, {"lse", lse, c.lse_layout(), true}, c.rank() - 1, c.lse_dims(), DType::float32,
               "the required float32", q);
  check_no_aliasing(c);
  p.out = out.data;
  p.lse = static_cast<float*>(lse.data);
  p.out_stride = rows_of(out);
  p.lse_stride = lse_of(lse);
  return p;
}

AttnParams validate_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                             const TensorView& dout, const TensorView& lse, const TensorView& dq,
                             const TensorView& dk, const TensorView& dv, const Options& options) {
  Checked c = check_inputs(q, k, v, &dout, options);
  AttnParams& p = c.p;
  // out and lse are inputs of the backward pass.
  const Arg ao{"out", out, c.q_layout(true), false}, al{"lse", lse, c.lse_layout(), false};
  c.inputs.emplace_back("out", check_layout(ao, c.rank()));
  check_dims(ao, c.q_like(p.hdim_v));
  check_dtype(ao, q.dtype, "q's dtype");
  check_same_device(ao, q);
  c.inputs.emplace_back("lse", check_layout(al, c.rank() - 1));
  check_dims(al, c.lse_dims());
  check_dtype(al, DType::float32, "the required float32");
  check_same_device(al, q);
  check_output(c, {"dq", dq, c.q_layout(false), true}, c.rank(), c.q_like(p.hdim), q.dtype, "q's dtype", q);
  check_output(c, {"dk", dk, c.k_layout(false), true}, c.rank(), c.k_like(p.hdim), q.dtype, "q's dtype", q);
  check_output(c, {"dv", dv, c.k_layout(true), true}, c.rank(), c.k_like(p.hdim_v), q.dtype, "q's dtype", q);
  check_dsinks(c, options, q);
  check_no_aliasing(c);
  p.backward = true;
  p.out = out.data;
  p.lse = static_cast<float*>(lse.data);
  p.out_stride = rows_of(out);
  p.lse_stride = lse_of(lse);
  p.dq = dq.data;
  p.dk = dk.data;
  p.dv = dv.data;
  p.dq_stride = rows_of(dq);
  p.dk_stride = rows_of(dk);
  p.dv_stride = rows_of(dv);
  return p;
}

}  // namespace flashtile::detail
