// prism_int8_gemm's CUTLASS SM90 kernels with bfloat16 output: two tiles only (large M and the
// swapped small-M one), to keep the build short; the model itself asks for float32.
#include "cc/ops/int8_gemm_sm90.cuh"

namespace prism {

template <>
cudaError_t RunSm90<uint16_t>(Sm90Tile tile, cudaStream_t stream, const int8_t* x,
                              const float* sx, const int8_t* w, const float* sw, uint16_t* y,
                              int64_t m, int64_t k, int64_t n, void* workspace,
                              size_t workspace_bytes, Sm90Order order) {
  auto* yb = reinterpret_cast<cutlass::bfloat16_t*>(y);
  switch (tile) {
    case Sm90Tile::kCoop128x256:
      return sm90::Gemm<sm90::CfgCoop128x256, cutlass::bfloat16_t>::Run(stream, x, sx, w, sw, yb,
                                                                        m, k, n, workspace,
                                                                        workspace_bytes, order);
    case Sm90Tile::kSwap128x64:
      return sm90::Gemm<sm90::CfgSwap128x64, cutlass::bfloat16_t>::Run(stream, x, sx, w, sw, yb,
                                                                       m, k, n, workspace,
                                                                       workspace_bytes, order);
    default:
      return cudaErrorNotSupported;
  }
}

}  // namespace prism
