// prism_int8_gemm on the CPU: y[m, n] = float(sum_k x_q[m, k] * w_q[n, k]) * s_x[m] * s_w[n].
// Shapes: M tokens, K input features, N output features; w_q is [N, K] (K contiguous).
#include <algorithm>

#include "cc/common.h"
#include "cc/numerics.h"

namespace prism {
namespace {

constexpr int64_t kRowBlock = 4;   // activation rows sharing one pass over a weight row
constexpr int64_t kColBlock = 64;  // weight rows kept hot in cache across the row block

// Integer dot product: exact in any order, so it is written for the vectoriser.
inline int32_t DotS8(const int8_t* a, const int8_t* b, int64_t k) {
  int32_t acc = 0;
  for (int64_t i = 0; i < k; ++i) acc += static_cast<int32_t>(a[i]) * static_cast<int32_t>(b[i]);
  return acc;
}

template <typename OutT>
void Gemm(const int8_t* x, const float* sx, const int8_t* w, const float* sw, OutT* y,
          int64_t m, int64_t k, int64_t n) {
  for (int64_t n0 = 0; n0 < n; n0 += kColBlock) {
    const int64_t n1 = std::min(n, n0 + kColBlock);
    for (int64_t m0 = 0; m0 < m; m0 += kRowBlock) {
      const int64_t m1 = std::min(m, m0 + kRowBlock);
      for (int64_t j = n0; j < n1; ++j) {
        for (int64_t i = m0; i < m1; ++i) {
          const int32_t acc = DotS8(x + i * k, w + j * k, k);
          // Epilogue order is part of the contract: (acc * s_x) * s_w, in fp32.
          FromF32(static_cast<float>(acc) * sx[i] * sw[j], y + i * n + j);
        }
      }
    }
  }
}

ffi::Error Int8GemmCpu(ffi::BufferR2<ffi::S8> x_q, ffi::BufferR1<ffi::F32> s_x,
                       ffi::BufferR2<ffi::S8> w_q, ffi::BufferR1<ffi::F32> s_w,
                       ffi::Result<ffi::AnyBuffer> y) {
  const int64_t m = x_q.dimensions()[0], k = x_q.dimensions()[1];
  const int64_t n = w_q.dimensions()[0];
  PRISM_REQUIRE(w_q.dimensions()[1] == k, "prism_int8_gemm: w_q must be [N, K] with x_q's K");
  PRISM_REQUIRE(s_x.dimensions()[0] == m, "prism_int8_gemm: s_x must be [M]");
  PRISM_REQUIRE(s_w.dimensions()[0] == n, "prism_int8_gemm: s_w must be [N]");
  PRISM_REQUIRE(y->dimensions().size() == 2 && y->dimensions()[0] == m && y->dimensions()[1] == n,
                "prism_int8_gemm: y must be [M, N], got " + DimsToString(y->dimensions()));
  if (y->element_type() == ffi::DataType::F32) {
    Gemm(x_q.typed_data(), s_x.typed_data(), w_q.typed_data(), s_w.typed_data(),
         y->typed_data<float>(), m, k, n);
  } else if (y->element_type() == ffi::DataType::BF16) {
    Gemm(x_q.typed_data(), s_x.typed_data(), w_q.typed_data(), s_w.typed_data(),
         y->reinterpret_data<uint16_t>(), m, k, n);
  } else {
    return ffi::Error::InvalidArgument("prism_int8_gemm: y must be float32 or bfloat16");
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace prism

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismInt8GemmCpu, prism::Int8GemmCpu,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::BufferR2<xla::ffi::S8>>()   // x_q [M, K]
                                  .Arg<xla::ffi::BufferR1<xla::ffi::F32>>()  // s_x [M]
                                  .Arg<xla::ffi::BufferR2<xla::ffi::S8>>()   // w_q [N, K]
                                  .Arg<xla::ffi::BufferR1<xla::ffi::F32>>()  // s_w [N]
                                  .Ret<xla::ffi::AnyBuffer>());               // y [M, N]
