// prism_int8_gemm's CUTLASS SM90 stream-K kernels (float32 output), in their own file so they
// compile in parallel with the data-parallel tiles; int8_gemm_sm90.cuh says what stream-K buys.
#include <cuda_runtime.h>

#include "cc/ops/int8_gemm_sm90.cuh"

namespace prism {

cudaError_t RunSm90StreamK(Sm90Tile tile, cudaStream_t stream, const int8_t* x, const float* sx,
                           const int8_t* w, const float* sw, float* y, int64_t m, int64_t k,
                           int64_t n, void* workspace, size_t workspace_bytes, Sm90Order order) {
  switch (tile) {
    case Sm90Tile::kStreamK128x128:
      return sm90::Gemm<sm90::CfgStreamK128x128, float>::Run(stream, x, sx, w, sw, y, m, k, n,
                                                              workspace, workspace_bytes, order);
    case Sm90Tile::kStreamK128x256:
      return sm90::Gemm<sm90::CfgStreamK128x256, float>::Run(stream, x, sx, w, sw, y, m, k, n,
                                                              workspace, workspace_bytes, order);
    default:
      return cudaErrorNotSupported;
  }
}

size_t Sm90WorkspaceBytes(Sm90Tile tile, int64_t m, int64_t k, int64_t n, Sm90Order order) {
  int devices = 0;
  // No device (a CUDA build on a CPU-only machine): nothing runs here, so nothing is needed.
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();  // clear the sticky error for later calls
    return 0;
  }
  if (m <= 0 || n <= 0 || k <= 0) return 0;
  switch (tile) {
    case Sm90Tile::kStreamK128x128:
      return sm90::Gemm<sm90::CfgStreamK128x128, float>::WorkspaceBytes(m, k, n, order);
    case Sm90Tile::kStreamK128x256:
      return sm90::Gemm<sm90::CfgStreamK128x256, float>::WorkspaceBytes(m, k, n, order);
    default:
      return 0;
  }
}

}  // namespace prism
