// See kernel_switch.h. FT_CUDA_INSTANCES(X) comes from the generated flashtile_cuda_instances.h and lists
// X(dtype, hdim) for every (dtype, bucket) this build compiled; nothing else is referenced, so a subset
// build links.
#include <cutlass/numeric_types.h>

#include "flashtile_cuda_instances.h"
#include "kernel_switch.h"
#include "common/mask.h"
#include "decode/launch.h"
#include "sm80/launch.h"
#include "sm90/launch.h"

namespace flashtile::cuda {
namespace {

template <Elem E>
struct ElementOf;
template <>
struct ElementOf<Elem::fp16> {
  using type = cutlass::half_t;
};
template <>
struct ElementOf<Elem::bf16> {
  using type = cutlass::bfloat16_t;
};

}  // namespace

// The X-macros every instance list is expanded with: "is (dtype, bucket) built" and "the list, for messages".
#define FT_X_BUILT(dt, d) \
  if (dtype == Elem::dt && hdim_bucket == d) return true;
#define FT_X_NAME(dt, d) #dt ":" #d " "

Kind kind_of(const detail::AttnParams& p) {
  if (p.has_score_hook()) return Kind::hooks;
  if (p.causal || p.has_window()) return Kind::masked;
  return Kind::plain;
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::plain: return "plain";
    case Kind::masked: return "masked";
    case Kind::hooks: return "hooks";
  }
  return "?";
}

bool kernel_built(Elem dtype, int hdim_bucket) {
  FT_CUDA_INSTANCES(FT_X_BUILT)
  return false;
}

#define FT_STR2(x) #x
#define FT_STR(x) FT_STR2(x)
const char* built_kernels() { return "" FT_CUDA_INSTANCES(FT_X_NAME); }

#define FT_X_FWD(dt, d)                                                         \
  if (dtype == Elem::dt && hdim_bucket == d) {                                  \
    using T = ElementOf<Elem::dt>::type;                                        \
    switch (kind) {                                                             \
      case Kind::plain: return sm80::run_fwd<T, d, Plain>(p, stream);           \
      case Kind::masked: return sm80::run_fwd<T, d, Masked>(p, stream);         \
      case Kind::hooks: return sm80::run_fwd<T, d, Hooks>(p, stream);           \
    }                                                                           \
  }
cudaError_t launch_fwd(Elem dtype, int hdim_bucket, Kind kind, const FwdParams& p, cudaStream_t stream) {
  FT_CUDA_INSTANCES(FT_X_FWD)
  return cudaErrorNotSupported;
}
#undef FT_X_FWD

#define FT_X_BWD(dt, d)                                                         \
  if (dtype == Elem::dt && hdim_bucket == d) {                                  \
    using T = ElementOf<Elem::dt>::type;                                        \
    switch (kind) {                                                             \
      case Kind::plain: return sm80::run_bwd<T, d, Plain>(p, stream);           \
      case Kind::masked: return sm80::run_bwd<T, d, Masked>(p, stream);         \
      case Kind::hooks: return sm80::run_bwd<T, d, Hooks>(p, stream);           \
    }                                                                           \
  }
cudaError_t launch_bwd(Elem dtype, int hdim_bucket, Kind kind, const BwdParams& p, cudaStream_t stream) {
  FT_CUDA_INSTANCES(FT_X_BWD)
  return cudaErrorNotSupported;
}
#undef FT_X_BWD

bool sm90_kernel_built(Elem dtype, int hdim_bucket) {
  FT_CUDA_SM90_INSTANCES(FT_X_BUILT)
  return false;
}

const char* sm90_built_kernels() { return "" FT_CUDA_SM90_INSTANCES(FT_X_NAME); }

#define FT_X_FWD(dt, d)                                                         \
  if (dtype == Elem::dt && hdim_bucket == d) {                                  \
    using T = ElementOf<Elem::dt>::type;                                        \
    switch (kind) {                                                             \
      case Kind::plain: return sm90::run_fwd<T, d, Plain>(p, stream);           \
      case Kind::masked: return sm90::run_fwd<T, d, Masked>(p, stream);         \
      case Kind::hooks: return sm90::run_fwd<T, d, Hooks>(p, stream);           \
    }                                                                           \
  }
cudaError_t launch_fwd_sm90(Elem dtype, int hdim_bucket, Kind kind, const FwdParams& p, cudaStream_t stream) {
  FT_CUDA_SM90_INSTANCES(FT_X_FWD)
  return cudaErrorNotSupported;
}
#undef FT_X_FWD

bool sm90_bwd_kernel_built(Elem dtype, int hdim_bucket) {
  FT_CUDA_SM90_BWD_INSTANCES(FT_X_BUILT)
  return false;
}

#define FT_X_BWD(dt, d)                                                         \
  if (dtype == Elem::dt && hdim_bucket == d) {                                  \
    using T = ElementOf<Elem::dt>::type;                                        \
    switch (kind) {                                                             \
      case Kind::plain: return sm90::run_bwd<T, d, Plain>(p, stream);           \
      case Kind::masked: return sm90::run_bwd<T, d, Masked>(p, stream);         \
      case Kind::hooks: return sm90::run_bwd<T, d, Hooks>(p, stream);           \
    }                                                                           \
  }
cudaError_t launch_bwd_sm90(Elem dtype, int hdim_bucket, Kind kind, const BwdParams& p, cudaStream_t stream) {
  FT_CUDA_SM90_BWD_INSTANCES(FT_X_BWD)
  return cudaErrorNotSupported;
}
#undef FT_X_BWD

bool decode_built(Elem dtype, int hdim_bucket) {
  FT_CUDA_DECODE_INSTANCES(FT_X_BUILT)
  return false;
}

const char* decode_built_kernels() { return "" FT_CUDA_DECODE_INSTANCES(FT_X_NAME); }

bool sm90_decode_built(Elem dtype, int hdim_bucket) {
  FT_CUDA_SM90_DECODE_INSTANCES(FT_X_BUILT)
  return false;
}

const char* sm90_decode_built_kernels() { return "" FT_CUDA_SM90_DECODE_INSTANCES(FT_X_NAME); }

// One switch for both decode kernels (fn: run_decode or run_decode_sm90).
#define FT_X_DECODE(fn, dt, d)                                                  \
  if (dtype == Elem::dt && hdim_bucket == d) {                                  \
    using T = ElementOf<Elem::dt>::type;                                        \
    switch (kind) {                                                             \
      case Kind::plain: e = decode::fn<T, d, Plain>(p, stream); break;          \
      case Kind::masked: e = decode::fn<T, d, Masked>(p, stream); break;        \
      case Kind::hooks: e = decode::fn<T, d, Hooks>(p, stream); break;          \
    }                                                                           \
    found = true;                                                               \
  }
#define FT_X_DECODE_MMA(dt, d) FT_X_DECODE(run_decode, dt, d)
#define FT_X_DECODE_WGMMA(dt, d) FT_X_DECODE(run_decode_sm90, dt, d)
cudaError_t launch_kvcache(Elem dtype, int hdim_bucket, Kind kind, decode::DecodeMma mma,
                           const decode::DecodeParams& p, cudaStream_t stream) {
  cudaError_t e = cudaSuccess;
  bool found = false;
  if (mma == decode::DecodeMma::wgmma) {
    FT_CUDA_SM90_DECODE_INSTANCES(FT_X_DECODE_WGMMA)
  } else {
    FT_CUDA_DECODE_INSTANCES(FT_X_DECODE_MMA)
  }
  return found ? e : cudaErrorNotSupported;
}
#undef FT_X_DECODE_WGMMA
#undef FT_X_DECODE_MMA
#undef FT_X_DECODE

#undef FT_X_NAME
#undef FT_X_BUILT

}  // namespace flashtile::cuda
