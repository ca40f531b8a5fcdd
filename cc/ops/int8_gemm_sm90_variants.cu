// prism_int8_gemm's CUTLASS SM90 data-parallel tiles added for the per-M choice (float32
// output), in their own file so they compile in parallel with int8_gemm_sm90_f32.cu: 128x192
// (N = 5376 in whole tiles) and swapped tiles of 64 weight rows (at small M the swapped 128x64
// tile gives qkv, N = 8192, 64 CTAs and o and down, N = 5376, 42 on 132 SMs). Tiles that lost
// every measured cell are not built (results/gemm_h200_session9/README.md).
#include <cuda_runtime.h>

#include "cc/ops/int8_gemm_sm90.cuh"

namespace prism {
namespace {

// A data-parallel tile: no workspace.
template <class Cfg>
cudaError_t RunTile(cudaStream_t stream, const int8_t* x, const float* sx, const int8_t* w,
                    const float* sw, float* y, int64_t m, int64_t k, int64_t n, Sm90Order order) {
  return sm90::Gemm<Cfg, float>::Run(stream, x, sx, w, sw, y, m, k, n, nullptr, 0, order);
}

}  // namespace

cudaError_t RunSm90Variant(Sm90Tile tile, cudaStream_t stream, const int8_t* x, const float* sx,
                           const int8_t* w, const float* sw, float* y, int64_t m, int64_t k,
                           int64_t n, Sm90Order order) {
  switch (tile) {
    case Sm90Tile::kCoop128x192:
      return RunTile<sm90::CfgCoop128x192>(stream, x, sx, w, sw, y, m, k, n, order);
    case Sm90Tile::kSwapPing64x32:
      return RunTile<sm90::CfgSwapPing64x32>(stream, x, sx, w, sw, y, m, k, n, order);
    case Sm90Tile::kSwapPing64x64:
      return RunTile<sm90::CfgSwapPing64x64>(stream, x, sx, w, sw, y, m, k, n, order);
    default:
      return cudaErrorNotSupported;
  }
}

}  // namespace prism
