// prism_int8_gemm_add_pair on CUDA; the specification is int8_gemm_cpu.cc's handler:
//   y[m, n] = a[m, n] + (b[m, n] + gemm[m, n]),  a = pair[:M], b = pair[M:],
//   gemm[m, n] = float(sum_k x_q[m, k] * w_q[n, k]) * s_x[m] * s_w[n], all fp32.
// The adds run in the CUTLASS kernel's epilogue (int8_gemm_sm90.cuh, kAddPair): the GEMM reads
// the two partials once and writes the sum, where XLA would write the GEMM's output, read it and
// both partials back and write the sum. Tiles: the swapped 128x64 for M <= 64, else 128x128
// (the same choice prism_int8_gemm makes for those M, without the wide-N and long-K variants).
// Shapes the kernels do not support run prism_int8_gemm's dispatch and then AddPairKernel.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cc/common.h"
#include "cc/cuda_common.cuh"
#include "cc/handlers.h"
#include "cc/ops/int8_gemm_kernels.h"
#include "cc/ops/int8_gemm_sm90.cuh"

namespace prism {

cudaError_t RunSm90AddPair(Sm90Tile tile, cudaStream_t stream, const int8_t* x, const float* sx,
                           const int8_t* w, const float* sw, const float* a, const float* b,
                           float* y, int64_t m, int64_t k, int64_t n) {
  switch (tile) {
    case Sm90Tile::kCoop128x128:
      return sm90::Gemm<sm90::CfgCoop128x128, float, true>::Run(stream, x, sx, w, sw, y, m, k, n,
                                                                 nullptr, 0, a, b);
    case Sm90Tile::kSwap128x64:
      return sm90::Gemm<sm90::CfgSwap128x64, float, true>::Run(stream, x, sx, w, sw, y, m, k, n,
                                                                nullptr, 0, a, b);
    default:
      return cudaErrorNotSupported;
  }
}

namespace {

constexpr int kAddThreads = 256;

// y = a + (b + y), elementwise: the fallback's second pass.
__global__ void AddPairKernel(const float* __restrict__ a, const float* __restrict__ b,
                              float* __restrict__ y, int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    y[i] = a[i] + (b[i] + y[i]);
  }
}

cudaError_t LaunchAddPair(cudaStream_t stream, const int8_t* x, const float* sx, const int8_t* w,
                          const float* sw, const float* a, const float* b, float* y, int64_t m,
                          int64_t k, int64_t n) {
  const auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  const Sm90Tile tile = m <= 64 ? Sm90Tile::kSwap128x64 : Sm90Tile::kCoop128x128;
  cudaError_t e = cudaErrorNotSupported;
  if (k >= 16 && Sm90Supports(x, w, y, k, n, sizeof(float)) && aligned(a) && aligned(b)) {
    e = RunSm90AddPair(tile, stream, x, sx, w, sw, a, b, y, m, k, n);
  }
  if (e != cudaErrorNotSupported) return e;
  e = RunInt8GemmF32(stream, x, sx, w, sw, y, m, k, n);
  if (e != cudaSuccess) return e;
  const int64_t count = m * n;
  const int64_t blocks = std::min<int64_t>(CeilDiv(count, kAddThreads), 4096);
  AddPairKernel<<<static_cast<unsigned>(blocks), kAddThreads, 0, stream>>>(a, b, y, count);
  return cudaGetLastError();
}

ffi::Error Int8GemmAddPairCuda(cudaStream_t stream, ffi::BufferR2<ffi::S8> x_q,
                               ffi::BufferR1<ffi::F32> s_x, ffi::BufferR2<ffi::S8> w_q,
                               ffi::BufferR1<ffi::F32> s_w, ffi::BufferR2<ffi::F32> pair,
                               ffi::Result<ffi::BufferR2<ffi::F32>> y) {
  const int64_t m = x_q.dimensions()[0], k = x_q.dimensions()[1];
  const int64_t n = w_q.dimensions()[0];
  PRISM_REQUIRE(w_q.dimensions()[1] == k, "prism_int8_gemm_add_pair: w_q must be [N, K]");
  PRISM_REQUIRE(s_x.dimensions()[0] == m && s_w.dimensions()[0] == n,
                "prism_int8_gemm_add_pair: s_x must be [M] and s_w [N]");
  PRISM_REQUIRE(pair.dimensions()[0] == 2 * m && pair.dimensions()[1] == n,
                "prism_int8_gemm_add_pair: pair must be [2M, N], got " +
                    DimsToString(pair.dimensions()));
  PRISM_REQUIRE(y->dimensions()[0] == m && y->dimensions()[1] == n,
                "prism_int8_gemm_add_pair: y must be [M, N]");
  if (m == 0 || n == 0) return ffi::Error::Success();
  const float* a = pair.typed_data();
  const cudaError_t e = LaunchAddPair(stream, x_q.typed_data(), s_x.typed_data(),
                                      w_q.typed_data(), s_w.typed_data(), a, a + m * n,
                                      y->typed_data(), m, k, n);
  if (e == cudaSuccess) return ffi::Error::Success();
  return ffi::Error::Internal(std::string("prism_int8_gemm_add_pair: CUDA launch failed: ") +
                              cudaGetErrorString(e));
}

}  // namespace
}  // namespace prism

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismInt8GemmAddPairCuda, prism::Int8GemmAddPairCuda,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::BufferR2<xla::ffi::S8>>()   // x_q [M, K]
                                  .Arg<xla::ffi::BufferR1<xla::ffi::F32>>()  // s_x [M]
                                  .Arg<xla::ffi::BufferR2<xla::ffi::S8>>()   // w_q [N, K]
                                  .Arg<xla::ffi::BufferR1<xla::ffi::F32>>()  // s_w [N]
                                  .Arg<xla::ffi::BufferR2<xla::ffi::F32>>()  // pair [2M, N]
                                  .Ret<xla::ffi::BufferR2<xla::ffi::F32>>(),  // y [M, N]
                              {xla::ffi::Traits::kCmdBufferCompatible});
