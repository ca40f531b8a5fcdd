// The general CUDA kernel of prism_int8_gemm ("simt"): a shared-memory-tiled __dp4a GEMM for any
// M, K, N and any alignment, what the dispatch (int8_gemm_cuda.cu) runs where no faster kernel
// applies. The specification is int8_gemm_cpu.cc:
//   y[m, n] = float(sum_k x[m, k] * w[n, k]) * s_x[m] * s_w[n]   (fp32, in that order)
#include <cuda_runtime.h>

#include <cstdint>

#include "cc/common.h"
#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/int8_gemm_simt.h"

namespace prism {
namespace {

// The general kernel ("simt"): a shared-memory-tiled __dp4a GEMM for any M, K, N.
constexpr int kTileM = 64;               // block tile rows of x_q
constexpr int kTileN = 64;               // block tile rows of w_q (columns of y)
constexpr int kTileK = 64;               // K bytes per shared-memory stage
constexpr int kWords = kTileK / 4;       // packed int32 words (4 x int8) per tile row
constexpr int kSegments = kTileK / 16;   // 16-byte segments per tile row
constexpr int kThreads = 256;            // 16 x 16 threads, each owning a 4 x 4 block of y
constexpr int kPad = 4;                  // keeps 16-byte alignment, spreads the stores' banks
static_assert(kTileM * kSegments == kThreads && kTileN * kSegments == kThreads,
              "one 16-byte segment per thread per tile");

// Tile in shared memory, K-major: tile[word][row] holds bytes 4*word .. 4*word+3 of that row,
// so a thread reads its 4 rows' words with one 16-byte load.
using Tile = int32_t[kWords][kTileM + kPad];

// Loads rows [row0, row0 + 64) x bytes [k0, k0 + 64) of src [rows, k], zero outside. kVec16:
// every row starts 16-byte aligned (K % 16 == 0 and an aligned base), so whole segments are
// single int4 loads; otherwise bytes are loaded one by one, since rows may be 1-byte aligned.
template <bool kVec16>
__device__ __forceinline__ void LoadTile(const int8_t* __restrict__ src, int64_t rows,
                                         int64_t k, int64_t row0, int64_t k0, Tile& dst) {
  const int i = static_cast<int>(threadIdx.x) / kSegments;
  const int seg = static_cast<int>(threadIdx.x) % kSegments;
  const int64_t row = row0 + i, kb = k0 + 16 * seg;
  uint32_t w[4] = {0u, 0u, 0u, 0u};
  if (row < rows && kb < k) {
    const int8_t* p = src + row * k + kb;
    if constexpr (kVec16) {
      const int4 v = *reinterpret_cast<const int4*>(p);  // kb < k implies kb + 16 <= k here
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else {
#pragma unroll
      for (int b = 0; b < 16; ++b) {  // little-endian packing, as an aligned int load would
        if (kb + b >= k) break;  // past the row's last byte: stays zero
        w[b / 4] |= static_cast<uint32_t>(static_cast<uint8_t>(p[b])) << (8 * (b % 4));
      }
    }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) dst[4 * seg + j][i] = static_cast<int32_t>(w[j]);
}

// acc[i][j] += dot of row 4*ty+i of x's tile with row 4*tx+j of w's tile over 64 bytes.
__device__ __forceinline__ void MultiplyTiles(const Tile& xs, const Tile& ws, int ty, int tx,
                                              int32_t (&acc)[4][4]) {
#pragma unroll
  for (int kw = 0; kw < kWords; ++kw) {
    const int4 a4 = *reinterpret_cast<const int4*>(&xs[kw][4 * ty]);
    const int4 b4 = *reinterpret_cast<const int4*>(&ws[kw][4 * tx]);
    const int a[4] = {a4.x, a4.y, a4.z, a4.w};
    const int b[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = __dp4a(a[i], b[j], acc[i][j]);
    }
  }
}

// Block (x = 64 columns of y, y = 64 rows of y); thread (ty, tx) owns y[4ty .. 4ty+3, 4tx ..
// 4tx+3] of the block tile.
template <typename OutT, bool kVec16>
__global__ void __launch_bounds__(kThreads)
    Int8GemmKernel(const int8_t* __restrict__ x, const float* __restrict__ sx,
                   const int8_t* __restrict__ w, const float* __restrict__ sw,
                   OutT* __restrict__ y, int64_t m, int64_t k, int64_t n) {
  __shared__ __align__(16) Tile xs;
  __shared__ __align__(16) Tile ws;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTileM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTileN;
  const int ty = static_cast<int>(threadIdx.x) / 16, tx = static_cast<int>(threadIdx.x) % 16;
  int32_t acc[4][4] = {};
  for (int64_t k0 = 0; k0 < k; k0 += kTileK) {
    LoadTile<kVec16>(x, m, k, m0, k0, xs);
    LoadTile<kVec16>(w, n, k, n0, k0, ws);
    __syncthreads();
    MultiplyTiles(xs, ws, ty, tx, acc);
    __syncthreads();  // the next stage overwrites the tiles
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = m0 + 4 * ty + i;
    if (row >= m) break;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t col = n0 + 4 * tx + j;
      // Epilogue order is part of the contract: (acc * s_x) * s_w, in fp32.
      if (col < n) FromF32(static_cast<float>(acc[i][j]) * sx[row] * sw[col], y + row * n + col);
    }
  }
}

}  // namespace

template <typename OutT>
cudaError_t RunSimt(cudaStream_t stream, const int8_t* x, const float* sx, const int8_t* w,
                    const float* sw, OutT* y, int64_t m, int64_t k, int64_t n) {
  const int64_t grid_m = CeilDiv(m, kTileM), grid_n = CeilDiv(n, kTileN);
  if (grid_m > 65535 || grid_n > 0x7fffffff) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(grid_n), static_cast<unsigned>(grid_m));
  const bool vec16 = k % 16 == 0 && (reinterpret_cast<uintptr_t>(x) & 15u) == 0 &&
                     (reinterpret_cast<uintptr_t>(w) & 15u) == 0;
  if (vec16) {
    Int8GemmKernel<OutT, true><<<grid, kThreads, 0, stream>>>(x, sx, w, sw, y, m, k, n);
  } else {
    Int8GemmKernel<OutT, false><<<grid, kThreads, 0, stream>>>(x, sx, w, sw, y, m, k, n);
  }
  return cudaGetLastError();
}

template cudaError_t RunSimt<float>(cudaStream_t, const int8_t*, const float*, const int8_t*,
                                    const float*, float*, int64_t, int64_t, int64_t);
template cudaError_t RunSimt<uint16_t>(cudaStream_t, const int8_t*, const float*, const int8_t*,
                                       const float*, uint16_t*, int64_t, int64_t, int64_t);

}  // namespace prism
