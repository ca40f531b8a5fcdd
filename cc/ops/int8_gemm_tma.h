// The TMA-fed weight-streaming kernel of prism_int8_gemm for 8 < M <= 64 (int8_gemm_tma.cu), as
// a plain launch function like those of int8_gemm_kernels.h; its own header so that changing it
// leaves the CUTLASS sources (which include int8_gemm_kernels.h) alone.
//   y[m, n] = float(sum_k x[m, k] * w[n, k]) * s_x[m] * s_w[n]   (fp32, in that order)
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace prism {

// Blocks of `rows` (64 or 128) weight rows x all tokens: a producer warp loads [rows x 128-byte]
// boxes of w and x into a ring of `stages` stages; the consumers are warps adding mma.sync
// m16n8k32 products, or (wgmma) warpgroups adding wgmma m64nNk32 products read straight from the
// stages (float32 output only); split: 1, 2 or 4 blocks (a cluster) sharing a slab's K, their
// sums added through distributed shared memory. stages 0: as many as keep the whole grid
// resident at once (at most 8). Needs M <= 64, K % 16 == 0 and 16-byte-aligned x and w.
// Returns cudaErrorNotSupported, with nothing launched, for a configuration it does not build.
struct TmaConfig {
  int rows = 128;
  int split = 1;
  bool wgmma = false;
  int stages = 0;
};
bool TmaSupports(const void* x, const void* w, int64_t m, int64_t k, int64_t n);
template <typename OutT>
cudaError_t RunTma(const TmaConfig& config, cudaStream_t stream, const int8_t* x, const float* sx,
                   const int8_t* w, const float* sw, OutT* y, int64_t m, int64_t k, int64_t n);

}  // namespace prism
