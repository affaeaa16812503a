// The C API range-checks its integer arguments before they become C++ enums or bools: every out-of-range
// value returns FT_ERR_INVALID_ARGUMENT with a message naming the argument and the value, and the output
// buffers are left as they were. A valid call on host memory runs and returns the dispatch report.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "flashtile/capi.h"

namespace {

constexpr int B = 1, S = 3, H = 2, D = 4;
constexpr float kUntouched = -12345.0f;
const double kDefaultScale = std::numeric_limits<double>::quiet_NaN();

ft_tensor bshd(std::vector<float>& data) {  // [B, S, H, D], contiguous
  return ft_tensor{data.data(), {B, S, H, D}, {S * H * D, H * D, D, 1}, 4};
}
ft_tensor bhs(std::vector<float>& data) {  // lse [B, H, S]
  return ft_tensor{data.data(), {B, H, S, 0}, {H * S, S, 1, 0}, 3};
}

struct Problem {
  std::vector<float> q, k, v, out, lse, dout, dq, dk, dv;
  Problem() {
    const std::size_t n = B * S * H * D;
    float phase = 0.0f;
    for (auto* t : {&q, &k, &v, &dout}) {
      t->resize(n);
      for (std::size_t i = 0; i < n; ++i) (*t)[i] = std::sin(0.7f * static_cast<float>(i) + phase);
      phase += 1.3f;
    }
    out.assign(n, kUntouched);
    dq.assign(n, kUntouched);
    dk.assign(n, kUntouched);
    dv.assign(n, kUntouched);
    lse.assign(B * H * S, kUntouched);
  }
  // Returns ft_forward's code; msg receives its text.
  int forward(int dtype, int device, int causal, int strict, std::string& msg, const ft_tensor* q_override = nullptr,
              bool null_q = false) {
    ft_tensor tq = bshd(q), tk = bshd(k), tv = bshd(v), to = bshd(out), tl = bhs(lse);
    const ft_tensor* pq = null_q ? nullptr : (q_override != nullptr ? q_override : &tq);
    char buf[512];
    const int rc = ft_forward(pq, &tk, &tv, &to, &tl, dtype, device, kDefaultScale, causal, nullptr, strict, buf,
                              sizeof buf);
    msg = buf;
    return rc;
  }
  int backward(int dtype, int device, int causal, int deterministic, int strict, std::string& msg) {
    ft_tensor tq = bshd(q), tk = bshd(k), tv = bshd(v), to = bshd(out), tdo = bshd(dout), tl = bhs(lse);
    ft_tensor tdq = bshd(dq), tdk = bshd(dk), tdv = bshd(dv);
    char buf[512];
    const int rc = ft_backward(&tq, &tk, &tv, &to, &tdo, &tl, &tdq, &tdk, &tdv, dtype, device, kDefaultScale, causal,
                               deterministic, nullptr, strict, buf, sizeof buf);
    msg = buf;
    return rc;
  }
  bool outputs_untouched() const {
    for (const auto* t : {&out, &lse, &dq, &dk, &dv})
      for (float x : *t)
        if (x != kUntouched) return false;
    return true;
  }
};

void expect_refused(int rc, const std::string& msg, const std::string& arg, const std::string& value,
                    const Problem& p) {
  EXPECT_EQ(rc, FT_ERR_INVALID_ARGUMENT) << msg;
  EXPECT_NE(msg.find(arg + ":"), std::string::npos) << msg;
  EXPECT_NE(msg.find("got " + value), std::string::npos) << msg;
  EXPECT_TRUE(p.outputs_untouched()) << "a refused call wrote to an output";
}

TEST(CApi, ValidForwardAndBackwardRunOnHostMemory) {
  Problem p;
  std::string msg;
  ASSERT_EQ(p.forward(FT_DTYPE_FLOAT32, FT_DEVICE_HOST, 1, 0, msg), FT_OK) << msg;
  EXPECT_NE(msg.find("ran"), std::string::npos) << msg;
  for (float x : p.out) EXPECT_TRUE(std::isfinite(x));
  ASSERT_EQ(p.backward(FT_DTYPE_FLOAT32, FT_DEVICE_HOST, 1, 0, 0, msg), FT_OK) << msg;
  for (float x : p.dq) EXPECT_TRUE(std::isfinite(x));
}

TEST(CApi, DTypeOutOfRangeIsRefused) {
  for (int dtype : {-1, 3, 255, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()}) {
    Problem p;
    std::string msg;
    expect_refused(p.forward(dtype, FT_DEVICE_HOST, 0, 0, msg), msg, "dtype", std::to_string(dtype), p);
    expect_refused(p.backward(dtype, FT_DEVICE_HOST, 0, 0, 0, msg), msg, "dtype", std::to_string(dtype), p);
  }
}

TEST(CApi, DeviceOutOfRangeIsRefused) {
  for (int device : {-2, -100, std::numeric_limits<int>::min()}) {
    Problem p;
    std::string msg;
    expect_refused(p.forward(FT_DTYPE_FLOAT32, device, 0, 0, msg), msg, "device", std::to_string(device), p);
    expect_refused(p.backward(FT_DTYPE_FLOAT32, device, 0, 0, 0, msg), msg, "device", std::to_string(device), p);
  }
}

TEST(CApi, FlagsOtherThanZeroOrOneAreRefused) {
  for (int bad : {2, -1, 7}) {
    Problem p;
    std::string msg;
    expect_refused(p.forward(FT_DTYPE_FLOAT32, FT_DEVICE_HOST, bad, 0, msg), msg, "causal", std::to_string(bad), p);
    expect_refused(p.forward(FT_DTYPE_FLOAT32, FT_DEVICE_HOST, 0, bad, msg), msg, "strict", std::to_string(bad), p);
    expect_refused(p.backward(FT_DTYPE_FLOAT32, FT_DEVICE_HOST, 0, bad, 0, msg), msg, "deterministic",
                   std::to_string(bad), p);
  }
}

TEST(CApi, NullTensorAndRankOutOfRangeAreRefused) {
  Problem p;
  std::string msg;
  expect_refused(p.forward(FT_DTYPE_FLOAT32, FT_DEVICE_HOST, 0, 0, msg, nullptr, true), msg, "q", "NULL", p);
  for (int rank : {-1, 5, 1000}) {
    ft_tensor q = bshd(p.q);
    q.rank = rank;
    expect_refused(p.forward(FT_DTYPE_FLOAT32, FT_DEVICE_HOST, 0, 0, msg, &q), msg, "q", std::to_string(rank), p);
  }
}

TEST(CApi, LibraryErrorsKeepTheirCode) {  // in range for the C API, refused by the library: its own code
  Problem p;
  ft_tensor q = bshd(p.q);
  q.shape[3] = D + 1;  // head dim differs from k's
  std::string msg;
  EXPECT_EQ(p.forward(FT_DTYPE_FLOAT32, FT_DEVICE_HOST, 0, 0, msg, &q), FT_ERR_INVALID_ARGUMENT) << msg;
  EXPECT_TRUE(p.outputs_untouched());
}

}  // namespace
