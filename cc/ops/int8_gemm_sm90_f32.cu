// prism_int8_gemm's CUTLASS SM90 kernels with float32 output (the model's path): every tile.
#include "cc/ops/int8_gemm_sm90.cuh"

namespace prism {

const char* Sm90TileName(Sm90Tile tile) {
  switch (tile) {
    case Sm90Tile::kCoop128x256: return "sm90_coop_128x256x128_c2x1";
    case Sm90Tile::kPing64x256: return "sm90_ping_64x256x128_c2x1";
    case Sm90Tile::kCoop128x128: return "sm90_coop_128x128x128_c2x1";
    case Sm90Tile::kSwap128x64: return "sm90_swap_ping_128x64x128_c2x1";
    case Sm90Tile::kStreamK128x128: return "sm90_streamk_128x128x128_c2x1";
    case Sm90Tile::kStreamK128x256: return "sm90_streamk_128x256x128_c2x1";
    case Sm90Tile::kCoop128x192: return "sm90_coop_128x192x128_c2x1";
    case Sm90Tile::kSwapPing64x32: return "sm90_swap_ping_64x32x128_c2x1";
    case Sm90Tile::kSwapPing64x64: return "sm90_swap_ping_64x64x128_c2x1";
  }
  return "?";
}

bool Sm90Supports(const void* x, const void* w, const void* y, int64_t k, int64_t n,
                  int out_bytes) {
  const auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  // TMA: 16-byte-aligned bases and row strides; CUTLASS takes int extents.
  return aligned(x) && aligned(w) && aligned(y) && k % 16 == 0 && (n * out_bytes) % 16 == 0 &&
         k < (int64_t{1} << 31) && n < (int64_t{1} << 31);
}

template <>
cudaError_t RunSm90<float>(Sm90Tile tile, cudaStream_t stream, const int8_t* x, const float* sx,
                           const int8_t* w, const float* sw, float* y, int64_t m, int64_t k,
                           int64_t n, void* workspace, size_t workspace_bytes,
                           Sm90Order order) {
  using sm90::Gemm;
  switch (tile) {
    case Sm90Tile::kCoop128x256:
      return Gemm<sm90::CfgCoop128x256, float>::Run(stream, x, sx, w, sw, y, m, k, n, workspace,
                                                 workspace_bytes, order);
    case Sm90Tile::kPing64x256:
      return Gemm<sm90::CfgPing64x256, float>::Run(stream, x, sx, w, sw, y, m, k, n, workspace,
                                                 workspace_bytes, order);
    case Sm90Tile::kCoop128x128:
      return Gemm<sm90::CfgCoop128x128, float>::Run(stream, x, sx, w, sw, y, m, k, n, workspace,
                                                 workspace_bytes, order);
    case Sm90Tile::kSwap128x64:
      return Gemm<sm90::CfgSwap128x64, float>::Run(stream, x, sx, w, sw, y, m, k, n, workspace,
                                                 workspace_bytes, order);
    case Sm90Tile::kStreamK128x128:
    case Sm90Tile::kStreamK128x256:
      return RunSm90StreamK(tile, stream, x, sx, w, sw, y, m, k, n, workspace, workspace_bytes,
                            order);
    case Sm90Tile::kCoop128x192:
    case Sm90Tile::kSwapPing64x32:
    case Sm90Tile::kSwapPing64x64:
      return RunSm90Variant(tile, stream, x, sx, w, sw, y, m, k, n, order);
  }
  return cudaErrorNotSupported;
}

}  // namespace prism
