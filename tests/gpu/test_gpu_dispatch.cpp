// Dispatch around the CUDA backends: auto picks cuda-sm90 on Hopper, else cuda-sm80, for device tensors and reports the instantiation;
// refusals carry reasons; host pointers given to the CUDA backend and device pointers given to the CPU
// backends are errors, not crashes; rows that see no key give O = 0 and LSE = -inf.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "device.h"
#include "support.h"

namespace ft_gpu {
namespace {

using ft_test::Case;
using ft_test::DType;

Case small_case(std::int64_t d = 64) {
  Case c;
  c.sq = 33;
  c.sk = 47;
  c.hq = 4;
  c.hkv = 2;
  c.d = c.dv = d;
  c.dtype = DType::bfloat16;
  return c;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const flashtile::Error& e) {
    return e.what();
  }
  return {};
}

TEST(GpuDispatch, RegisteredFirst) {
  const auto names = flashtile::backend_names();
  ASSERT_GE(names.size(), 2u);
  EXPECT_EQ(names[0], "cuda-sm90");  // auto takes the first that can run a call: Hopper's kernels first
  EXPECT_EQ(names[1], "cuda-sm80");
}

TEST(GpuDispatch, AutoPicksCudaAndReportsTiles) {
  FT_REQUIRE_GPU();
  auto rng = ft_test::test_rng();
  ft_test::Problem p(small_case(), rng);
  DevProblem d(p);
  if (const std::string why = refusal(d, p.c); !why.empty()) GTEST_SKIP() << why;
  flashtile::Options o;
  const auto r = flashtile::forward(d.q.view(), d.k.view(), d.v.view(), d.out.view(), d.lse.view(), o);
  FT_CUDA_OK(cudaDeviceSynchronize());
  // On compute capability 9.0 with the sm90 kernels built, cuda-sm90; else cuda-sm80, with sm90's reason.
  int dev = 0, major = 0, minor = 0;
  FT_CUDA_OK(cudaGetDevice(&dev));
  FT_CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  FT_CUDA_OK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  const bool sm90_built = r.to_string().find("cuda-sm90 built:") == std::string::npos;  // no "not built" reason
  EXPECT_EQ(r.ran.backend, major == 9 && minor == 0 && sm90_built ? "cuda-sm90" : "cuda-sm80") << r.to_string();
  EXPECT_GT(r.ran.block_q, 0);
  EXPECT_GT(r.ran.block_k, 0);
  EXPECT_GT(r.ran.threads, 0);
  EXPECT_NE(r.ran.detail.find("hdim_bucket=64"), std::string::npos) << r.to_string();
  std::cout << r.to_string() << "\n";
}

TEST(GpuDispatch, HostPointersRefusedByCuda) {
  FT_REQUIRE_GPU();
  auto rng = ft_test::test_rng();
  ft_test::Problem p(small_case(), rng);
  auto as_cuda = [](flashtile::TensorView v) {
    v.device = flashtile::Device::cuda;
    return v;
  };
  const std::string err = error_of([&] {
    flashtile::forward(as_cuda(p.q.view()), as_cuda(p.k.view()), as_cuda(p.v.view()), as_cuda(p.out.view()),
                       as_cuda(p.lse.view()), {});
  });
  EXPECT_NE(err.find("host memory"), std::string::npos) << err;
}

TEST(GpuDispatch, DevicePointersRefusedByCpu) {
  FT_REQUIRE_GPU();
  auto rng = ft_test::test_rng();
  ft_test::Problem p(small_case(), rng);
  DevProblem d(p);
  auto as_cpu = [](flashtile::TensorView v) {
    v.device = flashtile::Device::cpu;
    return v;
  };
  for (const char* backend : {"cpu-flash", "cpu-reference", "auto"}) {
    flashtile::Options o;
    o.backend = backend;
    const std::string err = error_of([&] {
      flashtile::forward(as_cpu(d.q.view()), as_cpu(d.k.view()), as_cpu(d.v.view()), as_cpu(d.out.view()),
                         as_cpu(d.lse.view()), o);
    });
    EXPECT_NE(err.find("device"), std::string::npos) << backend << ": " << err;
  }
}

// Index tensors whose values validation reads on the host (cu_seqlens, seqused_k): device memory declared cpu is a
// DeviceError naming the argument, not a dereference.
TEST(GpuDispatch, DeviceIndexTensorsDeclaredCpuRefused) {
  FT_REQUIRE_GPU();
  std::vector<float> q(8 * 8, 0.5f), k(8 * 8, 0.25f), v(8 * 8, 1.f), out(8 * 8), lse(8);
  auto host = [](std::vector<float>& x, std::initializer_list<std::int64_t> shape) {
    return flashtile::make_view(x.data(), DType::float32, shape);
  };
  void* cu = nullptr;
  FT_CUDA_OK(cudaMalloc(&cu, 2 * sizeof(std::int32_t)));
  const std::int32_t host_cu[2] = {0, 8};
  FT_CUDA_OK(cudaMemcpy(cu, host_cu, sizeof host_cu, cudaMemcpyHostToDevice));
  flashtile::Options o;
  o.cu_seqlens_q = flashtile::make_view(cu, DType::int32, {2});  // declared cpu (make_view's default)
  o.cu_seqlens_k = flashtile::make_view(const_cast<std::int32_t*>(host_cu), DType::int32, {2});
  o.max_seqlen_q = o.max_seqlen_k = 8;
  const std::string err = error_of([&] {
    flashtile::forward(host(q, {8, 1, 8}), host(k, {8, 1, 8}), host(v, {8, 1, 8}), host(out, {8, 1, 8}),
                       host(lse, {1, 8}), o);
  });
  EXPECT_NE(err.find("cu_seqlens_q"), std::string::npos) << err;
  EXPECT_NE(err.find("device memory"), std::string::npos) << err;
  FT_CUDA_OK(cudaFree(cu));
}

TEST(GpuDispatch, RefusalReasons) {
  FT_REQUIRE_GPU();
  auto rng = ft_test::test_rng();
  flashtile::Options strict;
  strict.backend = "cuda-sm80";
  strict.strict = true;
  {  // float32
    Case c = small_case();
    c.dtype = DType::float32;
    ft_test::Problem p(c, rng);
    DevProblem d(p);
    const std::string err = error_of([&] {
      flashtile::forward(d.q.view(), d.k.view(), d.v.view(), d.out.view(), d.lse.view(), strict);
    });
    EXPECT_NE(err.find("float32"), std::string::npos) << err;
  }
  {  // head dim not a multiple of 8
    ft_test::Problem p(small_case(36), rng);
    DevProblem d(p);
    const std::string err = error_of([&] {
      flashtile::forward(d.q.view(), d.k.view(), d.v.view(), d.out.view(), d.lse.view(), strict);
    });
    EXPECT_NE(err.find("multiples of 8"), std::string::npos) << err;
  }
  {  // misaligned base pointer (one element in)
    ft_test::Problem p(small_case(), rng);
    DevProblem d(p);
    flashtile::TensorView q = d.q.view();
    q.shape[1] -= 1;
    flashtile::TensorView out = d.out.view();
    out.shape[1] -= 1;
    flashtile::TensorView lse = d.lse.view();
    lse.shape[2] -= 1;
    q.data = static_cast<char*>(q.data) + 2;
    const std::string err = error_of([&] {
      flashtile::forward(q, d.k.view(), d.v.view(), out, lse, strict);
    });
    EXPECT_NE(err.find("aligned"), std::string::npos) << err;
  }
}

// A broadcast dO (batch, row and head strides 0: the gradient of (out * w).sum() for a w of shape (Dv)). The
// tensor-memory accelerator takes no zero strides, so cuda-sm90 refuses it and names it; auto runs cuda-sm80, whose
// loads read it as it is. The gradients match the oracle's for the materialised dO (every row the same).
TEST(GpuDispatch, BroadcastDoutFallsBackWithReason) {
  FT_REQUIRE_GPU();
  auto rng = ft_test::test_rng();
  const Case c = small_case();
  ft_test::Problem p(c, rng);
  for (std::int64_t i = c.dv; i < p.dout.numel(); ++i) p.dout.set(i, p.dout.get(i % c.dv));
  DevProblem d(p);
  if (const std::string why = refusal(d, p.c); !why.empty()) GTEST_SKIP() << why;  // a subset build without it
  flashtile::TensorView dout = d.dout.view();
  for (int i = 0; i < 3; ++i) dout.stride[static_cast<std::size_t>(i)] = 0;
  flashtile::Options o;
  flashtile::forward(d.q.view(), d.k.view(), d.v.view(), d.out.view(), d.lse.view(), o);
  const auto r = flashtile::backward(d.q.view(), d.k.view(), d.v.view(), d.out.view(), dout, d.lse.view(),
                                     d.dq.view(), d.dk.view(), d.dv.view(), o);
  FT_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(r.ran.backend, "cuda-sm80") << r.to_string();
  int dev = 0, major = 0;
  FT_CUDA_OK(cudaGetDevice(&dev));
  FT_CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  if (major == 9) {
    EXPECT_NE(r.to_string().find("TMA: dout strides"), std::string::npos) << r.to_string();
  }
  d.dq.download(p.dq);
  d.dk.download(p.dk);
  d.dv.download(p.dv);
  const ft_test::Results ref = ft_test::oracle(p, true);
  const ft_test::Results std_attn = ft_test::standard_attention(p, true);
  const double mag = std::max({ft_test::max_abs(ref.dq), ft_test::max_abs(ref.dk), ft_test::max_abs(ref.dv)});
  ft_test::expect_close("dq", p.dq.to_double(), std_attn.dq, ref.dq, c.dtype, mag);
  ft_test::expect_close("dk", p.dk.to_double(), std_attn.dk, ref.dk, c.dtype, mag);
  ft_test::expect_close("dv", p.dv.to_double(), std_attn.dv, ref.dv, c.dtype, mag);
}

TEST(GpuDispatch, RowsWithoutKeys) {
  FT_REQUIRE_GPU();
  auto rng = ft_test::test_rng();
  Case c = small_case();
  c.sq = 150;  // causal with Sq > Sk: the first 100 rows see no key (bottom-right alignment)
  c.sk = 50;
  c.causal = true;
  ft_test::Problem p(c, rng);
  DevProblem d(p);
  if (const std::string why = refusal(d, p.c); !why.empty()) GTEST_SKIP() << why;
  flashtile::forward(d.q.view(), d.k.view(), d.v.view(), d.out.view(), d.lse.view(), cuda_options(c));
  FT_CUDA_OK(cudaDeviceSynchronize());
  d.out.download(p.out);
  d.lse.download(p.lse);
  const auto out = p.out.to_double(), lse = p.lse.to_double();
  for (std::int64_t i = 0; i < c.sq; ++i)
    for (std::int64_t h = 0; h < c.hq; ++h) {
      const double l = lse[static_cast<std::size_t>(h * c.sq + i)];
      if (i < c.sq - c.sk) {
        EXPECT_TRUE(std::isinf(l) && l < 0) << "row " << i << " lse " << l;
        for (std::int64_t e = 0; e < c.dv; ++e)
          ASSERT_EQ(out[static_cast<std::size_t>((i * c.hq + h) * c.dv + e)], 0.0) << "row " << i;
      } else {
        EXPECT_TRUE(std::isfinite(l)) << "row " << i;
      }
    }
  // Backward: no NaN anywhere, dq = 0 on the rows without keys.
  flashtile::backward(d.q.view(), d.k.view(), d.v.view(), d.out.view(), d.dout.view(), d.lse.view(), d.dq.view(),
                      d.dk.view(), d.dv.view(), cuda_options_bwd(c));
  FT_CUDA_OK(cudaDeviceSynchronize());
  d.dq.download(p.dq);
  const auto dq = p.dq.to_double();
  for (std::size_t i = 0; i < dq.size(); ++i) ASSERT_FALSE(std::isnan(dq[i])) << "dq element " << i;
  EXPECT_EQ(dq[0], 0.0);
}

}  // namespace
}  // namespace ft_gpu
