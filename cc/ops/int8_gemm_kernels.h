// The CUDA kernels behind prism_int8_gemm, as plain launch functions (no XLA, no CUTLASS types),
// so the handler (int8_gemm_cuda.cu) picks one per call and each family compiles on its own.
//   y[m, n] = float(sum_k x[m, k] * w[n, k]) * s_x[m] * s_w[n]   (fp32, in that order)
// Shapes: M tokens, K input features, N outputs; x [M, K] and w [N, K] row-major, y [M, N].
// Every kernel computes the int32 sum exactly and applies that epilogue, so all give the same
// bits; they differ only in speed.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace prism {

// CUTLASS 3.x SM90 kernels (TMA, warp-specialised, wgmma), int8_gemm_sm90_*.cu. Need K % 16 == 0,
// N * sizeof(OutT) % 16 == 0 and 16-byte-aligned pointers (TMA); Sm90Supports() checks that.
enum class Sm90Tile {
  kCoop128x256,  // cooperative 128x256x128, cluster 2x1: large M
  kPing64x256,   // ping-pong 64x256x128, cluster 2x1: large M, fewer rows per tile
  kCoop128x128,  // cooperative 128x128x128, cluster 2x1: mid M (more tiles than 128x256)
  kSwap128x64,   // y^T = w x^T: tile 128 weight rows x 64 tokens x 128, ping-pong: small M
  kStreamK128x128,  // cooperative 128x128x128 with the stream-K scheduler (needs workspace)
  kStreamK128x256,  // cooperative 128x256x128 with the stream-K scheduler (needs workspace)
  // Data-parallel tiles of int8_gemm_sm90_variants.cu, for the per-M choice:
  kCoop128x192,    // cooperative 128x192x128, cluster 2x1: N = 5376 is 28 tiles, 43008 224
  // Swapped, 64 weight rows per tile: twice the 128-row tile's CTAs for the narrow weights
  // (qkv 128, o and down 84), which leave SMs idle at small M.
  kSwapPing64x32,  // ping-pong, 64 weight rows x 32 tokens x 128, cluster 2x1
  kSwapPing64x64,  // ping-pong, 64 weight rows x 64 tokens x 128, cluster 2x1
};
constexpr int kSm90TileCount = 9;
const char* Sm90TileName(Sm90Tile tile);

// The persistent schedulers' tile order: raster 'm' (consecutive tiles walk along M), 'n', or 0
// (CUTLASS's heuristic: along the shorter side), swizzle 1, 2, 4 or 8. It decides which tiles
// share the L2 at a time, never a result. The stream-K tiles also take a decomposition:
// 0 (CUTLASS's heuristic, which keeps data-parallel waves when the last one is at least half
// full: down and o at M = 256, 84 tiles on 132 SMs, run data-parallel), 's' (stream-K: the
// first two waves' tiles split along K so every SM gets the same k-iterations), 'k' (split-K
// into `splits` shares) or 'd' (data-parallel). Int32 partials add exactly in any order, so
// this too decides only the time.
struct Sm90Order {
  char raster = 0;
  int swizzle = 1;
  char decomposition = 0;
  int splits = 1;
};

bool Sm90Supports(const void* x, const void* w, const void* y, int64_t k, int64_t n,
                  int out_bytes);

// Returns cudaSuccess, or the error (a CUTLASS refusal, or less workspace than the tile needs, is
// cudaErrorNotSupported, with nothing launched). OutT: float, or uint16_t holding bf16 bits. Only
// some tiles are built for bf16 (see int8_gemm_sm90_bf16.cu); the others return
// cudaErrorNotSupported. workspace: device memory of workspace_bytes, used by stream-K tiles.
template <typename OutT>
cudaError_t RunSm90(Sm90Tile tile, cudaStream_t stream, const int8_t* x, const float* sx,
                    const int8_t* w, const float* sw, OutT* y, int64_t m, int64_t k, int64_t n,
                    void* workspace, size_t workspace_bytes, Sm90Order order);

// The tiles of int8_gemm_sm90_variants.cu, float32 output: same contract.
cudaError_t RunSm90Variant(Sm90Tile tile, cudaStream_t stream, const int8_t* x, const float* sx,
                           const int8_t* w, const float* sw, float* y, int64_t m, int64_t k,
                           int64_t n, Sm90Order order);

// Stream-K tiles, float32 output (int8_gemm_sm90_streamk.cu): same contract as RunSm90.
cudaError_t RunSm90StreamK(Sm90Tile tile, cudaStream_t stream, const int8_t* x, const float* sx,
                           const int8_t* w, const float* sw, float* y, int64_t m, int64_t k,
                           int64_t n, void* workspace, size_t workspace_bytes, Sm90Order order);

// Workspace bytes `tile` needs for an [M, K] x [N, K] GEMM with float32 output on this device
// (0 for the data-parallel tiles, and when no CUDA device is visible).
size_t Sm90WorkspaceBytes(Sm90Tile tile, int64_t m, int64_t k, int64_t n, Sm90Order order);

// Weight-streaming kernel for small M (int8_gemm_decode.cu): mma.sync m16n8k32 on 16-row slabs
// of w, K split across the 8 warps of a block, partial sums added exactly in shared memory.
// Needs M <= 64, K % 16 == 0 and 16-byte-aligned x and w. rows_per_block: 16, 32 or 64 weight
// rows per block (0: the default for M); split: 1, 2, 4 or 8 blocks (a cluster) sharing a slab's
// K, their sums added through distributed shared memory (0: 1; rows 64 only with 1).
bool DecodeSupports(const void* x, const void* w, int64_t m, int64_t k);
template <typename OutT>
cudaError_t RunDecode(int rows_per_block, int split, cudaStream_t stream, const int8_t* x,
                      const float* sx, const int8_t* w, const float* sw, OutT* y, int64_t m,
                      int64_t k, int64_t n);

}  // namespace prism
