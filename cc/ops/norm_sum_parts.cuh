// The partial-product form's (NormArgs::x_hi) path for the RMSNorm kernels that read x
// directly (the one-warp and block kernels, the fused post-norm's two-launch fallback): one
// pass writes x + (x_hi + x_w2) into h, and the norm then reads h as its x, in place (h may
// alias x: each element is read, then written, by one thread). The split kernel adds the
// parts in its own loads instead (RegSlice::LoadX), with the same two rounded adds.
// Included only by the norm_* CUDA files.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cc/common.h"
#include "cc/cuda_common.cuh"
#include "cc/ops/norm_args.cuh"

namespace prism {

constexpr int kSumPartsThreads = 256;
constexpr int64_t kSumPartsMaxBlocks = 4096;  // grid-stride beyond

// A template (instantiated for float) so that both CUDA files may include it.
template <typename T>
__global__ void __launch_bounds__(kSumPartsThreads)
    SumPartsKernel(const T* x, const T* x_hi, const T* x_w2, T* out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    out[i] = __fadd_rn(x[i], __fadd_rn(x_hi[i], x_w2[i]));
  }
}

// Writes the parts' sum into a->h and makes it a's x (x_hi, x_w2 cleared). f32 rows only.
template <typename T>
ffi::Error SumPartsIntoH(cudaStream_t stream, int64_t m, NormArgs<T>* a, const char* op) {
  PRISM_REQUIRE(a->h != nullptr && a->x_w2 != nullptr,
                std::string(op) + ": the partial-product form needs h and x_w2");
  if constexpr (!std::is_same_v<T, float>) {
    return ffi::Error::InvalidArgument(std::string(op) + ": partial products must be float32");
  } else {
    const int64_t n = m * a->d;
    const int64_t blocks = std::min<int64_t>(CeilDiv(n, kSumPartsThreads), kSumPartsMaxBlocks);
    if (n > 0) {
      SumPartsKernel<float><<<static_cast<unsigned>(blocks), kSumPartsThreads, 0, stream>>>(
          a->x, a->x_hi, a->x_w2, a->h, n);
    }
    a->x = a->h;
    a->x_hi = nullptr;
    a->x_w2 = nullptr;
    return LaunchStatus(op);
  }
}

}  // namespace prism
