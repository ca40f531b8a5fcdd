// prism_int8_gemm on the CPU: y[m, n] = float(sum_k x_q[m, k] * w_q[n, k]) * s_x[m] * s_w[n].
// Shapes: M tokens, K input features, N output features; w_q is [N, K] (K contiguous).
// M is y's rows: x_q and s_x may hold more rows, of which the first M are used
// (int8_gemm_shapes.h).
#include <immintrin.h>

#include <algorithm>

#include "cc/common.h"
#include "cc/cpu_parallel.h"
#include "cc/numerics.h"
#include "cc/ops/int8_gemm_shapes.h"

namespace prism {
namespace {

constexpr int64_t kColBlock = 64;  // weight rows per work item, kept hot in cache

// Integer dot product: exact in any order, so every path below gives the same bits.
inline int32_t DotS8(const int8_t* a, const int8_t* b, int64_t k) {
  int32_t acc = 0;
  for (int64_t i = 0; i < k; ++i) acc += static_cast<int32_t>(a[i]) * static_cast<int32_t>(b[i]);
  return acc;
}

__attribute__((target("avx2"))) inline int32_t HorizontalSum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

__attribute__((target("avx2"))) inline __m256i Widen(const int8_t* p) {
  return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// acc[r][j] = x[r] . w[j] for 2 activation rows and 4 weight rows: each widened weight vector
// feeds two multiply-adds, 16 int8 products per instruction.
__attribute__((target("avx2"))) void Dot2x4Avx2(const int8_t* x0, const int8_t* x1,
                                                const int8_t* const* w, int64_t k,
                                                int32_t acc[2][4]) {
  __m256i a[2][4];
  for (auto& row : a)
    for (auto& v : row) v = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    const __m256i u0 = Widen(x0 + i), u1 = Widen(x1 + i);
    for (int j = 0; j < 4; ++j) {
      const __m256i b = Widen(w[j] + i);
      a[0][j] = _mm256_add_epi32(a[0][j], _mm256_madd_epi16(u0, b));
      a[1][j] = _mm256_add_epi32(a[1][j], _mm256_madd_epi16(u1, b));
    }
  }
  for (int j = 0; j < 4; ++j) {
    acc[0][j] = HorizontalSum(a[0][j]) + DotS8(x0 + i, w[j] + i, k - i);
    acc[1][j] = HorizontalSum(a[1][j]) + DotS8(x1 + i, w[j] + i, k - i);
  }
}

template <typename OutT>
inline void Store(int32_t acc, float sx, float sw, OutT* y) {
  // Epilogue order is part of the contract: (acc * s_x) * s_w, in fp32.
  FromF32(static_cast<float>(acc) * sx * sw, y);
}

// All M rows against weight rows [n0, n1): one work item.
template <typename OutT>
void GemmColumns(const int8_t* x, const float* sx, const int8_t* w, const float* sw, OutT* y,
                 int64_t m, int64_t k, int64_t n, int64_t n0, int64_t n1, bool avx2) {
  int64_t j = n0;
  if (avx2) {
    for (; j + 4 <= n1; j += 4) {
      const int8_t* wj[4] = {w + j * k, w + (j + 1) * k, w + (j + 2) * k, w + (j + 3) * k};
      int64_t i = 0;
      for (; i + 2 <= m; i += 2) {
        int32_t acc[2][4];
        Dot2x4Avx2(x + i * k, x + (i + 1) * k, wj, k, acc);
        for (int r = 0; r < 2; ++r)
          for (int c = 0; c < 4; ++c) Store(acc[r][c], sx[i + r], sw[j + c], y + (i + r) * n + j + c);
      }
      for (; i < m; ++i)
        for (int c = 0; c < 4; ++c) Store(DotS8(x + i * k, wj[c], k), sx[i], sw[j + c], y + i * n + j + c);
    }
  }
  for (; j < n1; ++j)
    for (int64_t i = 0; i < m; ++i) Store(DotS8(x + i * k, w + j * k, k), sx[i], sw[j], y + i * n + j);
}

template <typename OutT>
void Gemm(ffi::ThreadPool& pool, const int8_t* x, const float* sx, const int8_t* w,
          const float* sw, OutT* y, int64_t m, int64_t k, int64_t n) {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  const int64_t blocks = (n + kColBlock - 1) / kColBlock;
  ParallelFor(pool, blocks, [&](int64_t b) {
    GemmColumns(x, sx, w, sw, y, m, k, n, b * kColBlock, std::min(n, (b + 1) * kColBlock), avx2);
  });
}

ffi::Error Int8GemmCpu(ffi::ThreadPool pool, ffi::BufferR2<ffi::S8> x_q, ffi::BufferR1<ffi::F32> s_x,
                       ffi::BufferR2<ffi::S8> w_q, ffi::BufferR1<ffi::F32> s_w,
                       ffi::Result<ffi::AnyBuffer> y,
                       ffi::Result<ffi::BufferR1<ffi::U8>> /*workspace: CUDA stream-K only*/) {
  int64_t m = 0, k = 0, n = 0;
  if (auto e = CheckInt8GemmShapes(x_q, s_x, w_q, s_w, *y, &m, &k, &n); e.failure()) return e;
  if (y->element_type() == ffi::DataType::F32) {
    Gemm(pool, x_q.typed_data(), s_x.typed_data(), w_q.typed_data(), s_w.typed_data(),
         y->typed_data<float>(), m, k, n);
  } else if (y->element_type() == ffi::DataType::BF16) {
    Gemm(pool, x_q.typed_data(), s_x.typed_data(), w_q.typed_data(), s_w.typed_data(),
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
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .Arg<xla::ffi::BufferR2<xla::ffi::S8>>()   // x_q [M, K]
                                  .Arg<xla::ffi::BufferR1<xla::ffi::F32>>()  // s_x [M]
                                  .Arg<xla::ffi::BufferR2<xla::ffi::S8>>()   // w_q [N, K]
                                  .Arg<xla::ffi::BufferR1<xla::ffi::F32>>()  // s_w [N]
                                  .Ret<xla::ffi::AnyBuffer>()                // y [M, N]
                                  .Ret<xla::ffi::BufferR1<xla::ffi::U8>>());  // workspace, unused
