// The general CUDA kernel of prism_int8_gemm (int8_gemm_simt.cu), as a plain launch function
// like those of int8_gemm_kernels.h:
//   y[m, n] = float(sum_k x[m, k] * w[n, k]) * s_x[m] * s_w[n]   (fp32, in that order)
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace prism {

// Any M, K, N and alignment (16-byte loads where K % 16 == 0 and x, w are aligned, bytes
// otherwise). OutT: float, or uint16_t holding bf16 bits. Returns the launch's status
// (cudaErrorInvalidValue past 65535 x 64 rows).
template <typename OutT>
cudaError_t RunSimt(cudaStream_t stream, const int8_t* x, const float* sx, const int8_t* w,
                    const float* sw, OutT* y, int64_t m, int64_t k, int64_t n);

}  // namespace prism
