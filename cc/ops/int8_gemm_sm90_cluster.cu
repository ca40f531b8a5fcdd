// prism_int8_gemm's CUTLASS SM90 data-parallel tiles with 2x2 clusters (float32 output), in
// their own file so they compile in parallel with the others (int8_gemm_sm90.cuh).
#include <cuda_runtime.h>

#include "cc/ops/int8_gemm_sm90.cuh"

namespace prism {

cudaError_t RunSm90Cluster(Sm90Tile tile, cudaStream_t stream, const int8_t* x, const float* sx,
                           const int8_t* w, const float* sw, float* y, int64_t m, int64_t k,
                           int64_t n) {
  switch (tile) {
    case Sm90Tile::kCoop128x256C22:
      return sm90::Gemm<sm90::CfgCoop128x256C22, float>::Run(stream, x, sx, w, sw, y, m, k, n,
                                                              nullptr, 0);
    case Sm90Tile::kCoop128x128C22:
      return sm90::Gemm<sm90::CfgCoop128x128C22, float>::Run(stream, x, sx, w, sw, y, m, k, n,
                                                              nullptr, 0);
    default:
      return cudaErrorNotSupported;
  }
}

}  // namespace prism
