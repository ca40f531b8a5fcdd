// prism_int8_gemm's CUTLASS SM90 data-parallel tile variants (float32 output), in their own file
// so they compile in parallel with int8_gemm_sm90_f32.cu: other tile shapes, a 1x2 cluster
// (x multicast instead of w), ping-pong at 128 rows and no cluster, and swapped tiles of 64
// weight rows (at small M the swapped 128x64 tile gives qkv, N = 8192, 64 CTAs and o and down,
// N = 5376, 42 on 132 SMs), measured against the default tiles per M bucket
// (benchmarks/gemm_bench.py --kernels).
#include <cuda_runtime.h>

#include "cc/ops/int8_gemm_sm90.cuh"

namespace prism {

cudaError_t RunSm90Variant(Sm90Tile tile, cudaStream_t stream, const int8_t* x, const float* sx,
                           const int8_t* w, const float* sw, float* y, int64_t m, int64_t k,
                           int64_t n, Sm90Order order) {
  using sm90::Gemm;
  switch (tile) {
    case Sm90Tile::kCoop256x128:
      return Gemm<sm90::CfgCoop256x128, float>::Run(stream, x, sx, w, sw, y, m, k, n, nullptr, 0,
                                                    order);
    case Sm90Tile::kPing128x128:
      return Gemm<sm90::CfgPing128x128, float>::Run(stream, x, sx, w, sw, y, m, k, n, nullptr, 0,
                                                    order);
    case Sm90Tile::kCoop128x256C1:
      return Gemm<sm90::CfgCoop128x256C1, float>::Run(stream, x, sx, w, sw, y, m, k, n, nullptr,
                                                      0, order);
    case Sm90Tile::kCoop128x192:
      return Gemm<sm90::CfgCoop128x192, float>::Run(stream, x, sx, w, sw, y, m, k, n, nullptr, 0,
                                                    order);
    case Sm90Tile::kSwapPing64x32:
      return Gemm<sm90::CfgSwapPing64x32, float>::Run(stream, x, sx, w, sw, y, m, k, n, nullptr,
                                                      0, order);
    case Sm90Tile::kSwapPing64x64:
      return Gemm<sm90::CfgSwapPing64x64, float>::Run(stream, x, sx, w, sw, y, m, k, n, nullptr,
                                                      0, order);
    default:
      return cudaErrorNotSupported;
  }
}

}  // namespace prism
