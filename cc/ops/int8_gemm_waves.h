// The int8 GEMM dispatch's wave split (int8_gemm_cuda.cu): how many of y's columns a CUTLASS
// tile covers in whole waves of the card's SMs, so that one launch runs those and a second one
// (stream-K) spreads the ragged rest over every SM. Host code; needs a CUDA device for its SM
// count (DeviceSmCount).
#pragma once

#include <cstdint>

#include "cc/cuda_common.cuh"
#include "cc/ops/int8_gemm_kernels.h"

namespace prism {

// A CUTLASS tile's output extent: rows and columns of y.
struct TileExtent {
  int64_t m, n;
};
inline TileExtent Sm90Extent(Sm90Tile tile) {
  switch (tile) {
    case Sm90Tile::kCoop128x256:
    case Sm90Tile::kStreamK128x256: return {128, 256};
    case Sm90Tile::kPing64x256: return {64, 256};
    case Sm90Tile::kCoop128x192: return {128, 192};
    case Sm90Tile::kCoop128x128:
    case Sm90Tile::kStreamK128x128: return {128, 128};
    case Sm90Tile::kSwap128x64: return {64, 128};  // swapped: 64 tokens x 128 weight rows
    case Sm90Tile::kSwapPing64x32: return {32, 64};
    case Sm90Tile::kSwapPing64x64: return {64, 64};
  }
  return {128, 128};
}

// The columns [0, head) of y that `tile` covers in whole waves of the SMs, as whole columns of
// tiles (a tile is an (M-tile, N-tile) pair, and the persistent grid is one CTA an SM); 0 when
// there is no ragged last wave to split off, or less than one wave.
inline int64_t WaveHeadColumns(Sm90Tile tile, int64_t m, int64_t n) {
  const TileExtent t = Sm90Extent(tile);
  const int64_t mt = CeilDiv(m, t.m), nt = CeilDiv(n, t.n), sms = DeviceSmCount();
  const int64_t tiles = mt * nt, waves = tiles / sms;
  if (waves == 0 || tiles % sms == 0) return 0;
  const int64_t head = waves * sms / mt * t.n;
  return head < n ? head : 0;
}

}  // namespace prism
