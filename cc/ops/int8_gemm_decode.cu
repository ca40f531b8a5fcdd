// prism_int8_gemm for small M (decode steps): a weight-streaming kernel. At M <= 16 the GEMM is
// a read of w (N * K bytes) with a little arithmetic, so the kernel is built around keeping many
// 16-byte loads of w in flight, read once and never cached in L1.
//
// Shapes: M tokens (<= 64), K inputs (% 16 == 0), N outputs; x [M, K], w [N, K], y [M, N].
// Block: 8 warps on one slab of kSlabs x 16 weight rows; warp v takes the 64-byte K chunks
// v, v + 8, v + 16, ... (so the block reads 512 contiguous bytes of each row at a time), keeps
// int32 partial sums in mma.sync m16n8k32 fragments (A = 16 weight rows, B = 8 tokens), adds
// them into shared memory with integer atomics (exact in any order), then applies the epilogue.
//
// K order inside a chunk: lane (g, t) (g = lane / 4, t = lane % 4) loads bytes [16t, 16t + 16)
// of weight rows g and g + 8 and of token row g. The mma sees them as k = 4t..4t+3 and 16+4t..
// 16+4t+3 (two instructions per chunk, bytes 0-7 then 8-15); the same permutation of k is used
// for w and x, and an integer dot product does not depend on the order of its terms.
//
// Split over K in a cluster (kSplit > 1): the kSplit CTAs of a thread-block cluster share one
// slab, CTA r summing the r-th of kSplit contiguous ranges of its K chunks into its own shared
// memory; after a cluster barrier every CTA applies the epilogue to a share of the slab's outputs,
// adding the kSplit partial sums from the peers' shared memory (distributed shared memory). The
// narrow weights otherwise give too few blocks for 132 SMs (o and down: 168 blocks of 32 rows,
// so 36 SMs stream twice what the others do); the sums stay exact int32, so the bits do not move,
// and nothing leaves the cluster: no workspace, no second launch.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include "cc/common.h"
#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/cluster_launch.cuh"
#include "cc/ops/int8_gemm_kernels.h"

namespace prism {
namespace {

namespace cg = cooperative_groups;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kChunk = 64;       // K bytes per warp step (4 lanes x 16 bytes per row)
constexpr int kMaxTokens = 64;

// Streamed once: bypass L1 so x (re-read by every block) stays there; ask L2 for 256-byte lines.
__device__ __forceinline__ int4 LoadStream(const int8_t* p) {
  int4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.s32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ int4 LoadCached(const int8_t* p) {
  return __ldg(reinterpret_cast<const int4*>(p));
}

__device__ __forceinline__ int4 Select(bool keep, int4 v) {
  return keep ? v : make_int4(0, 0, 0, 0);
}

// d += A (16 x 32, row) . B (32 x 8, col), int8 in, int32 accumulate (exact: no saturation
// needed for K <= 2^31 / 127^2).
__device__ __forceinline__ void Mma(int32_t (&d)[4], int a0, int a1, int a2, int a3, int b0,
                                    int b1) {
  asm(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Output i of a slab's kTokens x kRows (token-major) from the kSplit partial sums at peer[q],
// each [kTokens][kRows + 1]: epilogue order is part of the contract, (acc * s_x) * s_w in fp32.
template <int kRows, int kSplit, typename OutT>
__device__ __forceinline__ void WriteOutput(int32_t* const (&peer)[kSplit], int i,
                                            const float* __restrict__ sx,
                                            const float* __restrict__ sw, OutT* __restrict__ y,
                                            int m, int64_t n0, int64_t n) {
  const int tok = i / kRows, r = i % kRows;
  const int64_t col = n0 + r;
  if (tok >= m || col >= n) return;
  int32_t acc = 0;
#pragma unroll
  for (int q = 0; q < kSplit; ++q) acc += peer[q][tok * (kRows + 1) + r];  // exact in any order
  const float v = __fmul_rn(__fmul_rn(static_cast<float>(acc), sx[tok]), sw[col]);
  FromF32(v, y + static_cast<int64_t>(tok) * n + col);
}

// kSlabs x 16 weight rows per block (per cluster of kSplit blocks when kSplit > 1), kTiles x 8
// tokens, kUnroll chunks loaded before use.
template <int kSlabs, int kTiles, int kUnroll, int kSplit, typename OutT>
__global__ void __launch_bounds__(kThreads)
    DecodeKernel(const int8_t* __restrict__ x, const float* __restrict__ sx,
                 const int8_t* __restrict__ w, const float* __restrict__ sw,
                 OutT* __restrict__ y, int m, int64_t k, int64_t n) {
  constexpr int kRows = kSlabs * 16, kTokens = kTiles * 8;
  __shared__ int32_t sums[kTokens][kRows + 1];  // +1: spreads the atomics' banks
  for (int i = threadIdx.x; i < kTokens * (kRows + 1); i += kThreads) (&sums[0][0])[i] = 0;

  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  // A cluster is kSplit consecutive blocks along x: one slab, rank = its share of K.
  int rank = 0;
  if constexpr (kSplit > 1) rank = static_cast<int>(cg::this_cluster().block_rank());
  const int64_t n0 = static_cast<int64_t>(blockIdx.x / kSplit) * kRows;
  // Row pointers of this lane (rows past N are clamped to row 0 and their results dropped).
  const int8_t* wrow[kSlabs][2];
#pragma unroll
  for (int s = 0; s < kSlabs; ++s) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = n0 + s * 16 + h * 8 + g;
      wrow[s][h] = w + (r < n ? r : 0) * k + 16 * t;
    }
  }
  const int8_t* xrow[kTiles];
  bool xlive[kTiles];
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    xlive[j] = j * 8 + g < m;
    xrow[j] = x + (xlive[j] ? j * 8 + g : 0) * k + 16 * t;
  }

  int32_t acc[kSlabs][kTiles][4] = {};
  // This block's chunks [c_lo, c_hi): the rank-th of kSplit near-equal contiguous ranges.
  const int64_t chunks = (k + kChunk - 1) / kChunk, share = (chunks + kSplit - 1) / kSplit;
  const int64_t c_lo = rank * share, c_hi = c_lo + share < chunks ? c_lo + share : chunks;
  for (int64_t c0 = c_lo + warp; c0 < c_hi; c0 += kWarps * kUnroll) {
    int4 wv[kUnroll][kSlabs][2];
    int4 xv[kUnroll][kTiles];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      // Loads are unconditional (a dead chunk re-reads offset 0) and zeroed afterwards by a
      // select: branches around them would stop the compiler from issuing them back to back.
      const int64_t at = (c0 + u * kWarps) * kChunk;
      const bool live = c0 + u * kWarps < c_hi && at + 16 * t < k;  // K % 16 == 0
      const int64_t off = live ? at : 0;
#pragma unroll
      for (int s = 0; s < kSlabs; ++s) {
#pragma unroll
        for (int h = 0; h < 2; ++h) wv[u][s][h] = LoadStream(wrow[s][h] + off);
      }
#pragma unroll
      for (int j = 0; j < kTiles; ++j) xv[u][j] = LoadCached(xrow[j] + off);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t at = (c0 + u * kWarps) * kChunk;
      const bool live = c0 + u * kWarps < c_hi && at + 16 * t < k;
#pragma unroll
      for (int s = 0; s < kSlabs; ++s) {
#pragma unroll
        for (int h = 0; h < 2; ++h) wv[u][s][h] = Select(live, wv[u][s][h]);
      }
#pragma unroll
      for (int j = 0; j < kTiles; ++j) xv[u][j] = Select(live && xlive[j], xv[u][j]);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int s = 0; s < kSlabs; ++s) {
        const int4 lo = wv[u][s][0], hi = wv[u][s][1];  // rows g and g + 8
#pragma unroll
        for (int j = 0; j < kTiles; ++j) {
          Mma(acc[s][j], lo.x, hi.x, lo.y, hi.y, xv[u][j].x, xv[u][j].y);
          Mma(acc[s][j], lo.z, hi.z, lo.w, hi.w, xv[u][j].z, xv[u][j].w);
        }
      }
    }
  }
  __syncthreads();  // sums zeroed
  // Fragment layout: d0 (row g, token 2t), d1 (g, 2t + 1), d2 (g + 8, 2t), d3 (g + 8, 2t + 1).
#pragma unroll
  for (int s = 0; s < kSlabs; ++s) {
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      const int r = s * 16 + g, tok = j * 8 + 2 * t;
      atomicAdd(&sums[tok][r], acc[s][j][0]);
      atomicAdd(&sums[tok + 1][r], acc[s][j][1]);
      atomicAdd(&sums[tok][r + 8], acc[s][j][2]);
      atomicAdd(&sums[tok + 1][r + 8], acc[s][j][3]);
    }
  }
  // Consecutive threads write consecutive outputs of one token row; with a cluster, block r
  // takes every kSplit-th run of kThreads outputs, reading every peer's sums.
  int32_t* peer[kSplit];
  if constexpr (kSplit == 1) {
    __syncthreads();
    peer[0] = &sums[0][0];
  } else {
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every block's sums complete and visible to the cluster
#pragma unroll
    for (int q = 0; q < kSplit; ++q) peer[q] = cluster.map_shared_rank(&sums[0][0], q);
  }
  for (int i = threadIdx.x + rank * kThreads; i < kTokens * kRows; i += kThreads * kSplit) {
    WriteOutput<kRows, kSplit>(peer, i, sx, sw, y, m, n0, n);
  }
  // A block's shared memory must outlive its peers' reads of it.
  if constexpr (kSplit > 1) cg::this_cluster().sync();
}

template <int kSlabs, int kTiles, int kSplit, typename OutT>
cudaError_t Launch(cudaStream_t stream, const int8_t* x, const float* sx, const int8_t* w,
                   const float* sw, OutT* y, int64_t m, int64_t k, int64_t n) {
  // About 64 registers of w loads in flight per lane, whatever the slab count.
  constexpr int kUnroll = kTiles >= 4 ? 2 : 8 / kSlabs;
  auto* kernel = DecodeKernel<kSlabs, kTiles, kUnroll, kSplit, OutT>;
  return LaunchClusters(kernel, CeilDiv(n, kSlabs * 16) * kSplit, kThreads, 0, kSplit, stream, x,
                        sx, w, sw, y, static_cast<int>(m), k, n);
}

template <int kSlabs, int kTiles, typename OutT>
cudaError_t LaunchSplit(int split, cudaStream_t stream, const int8_t* x, const float* sx,
                        const int8_t* w, const float* sw, OutT* y, int64_t m, int64_t k,
                        int64_t n) {
  switch (split) {
    case 1: return Launch<kSlabs, kTiles, 1>(stream, x, sx, w, sw, y, m, k, n);
    case 2: return Launch<kSlabs, kTiles, 2>(stream, x, sx, w, sw, y, m, k, n);
    case 4: return Launch<kSlabs, kTiles, 4>(stream, x, sx, w, sw, y, m, k, n);
    case 8: return Launch<kSlabs, kTiles, 8>(stream, x, sx, w, sw, y, m, k, n);
    default: return cudaErrorNotSupported;
  }
}

template <int kTiles, typename OutT>
cudaError_t LaunchRows(int rows, int split, cudaStream_t stream, const int8_t* x,
                       const float* sx, const int8_t* w, const float* sw, OutT* y, int64_t m,
                       int64_t k, int64_t n) {
  switch (rows) {
    case 16: return LaunchSplit<1, kTiles>(split, stream, x, sx, w, sw, y, m, k, n);
    case 32: return LaunchSplit<2, kTiles>(split, stream, x, sx, w, sw, y, m, k, n);
    case 64:
      if constexpr (kTiles <= 2) {
        return split == 1 ? Launch<4, kTiles, 1>(stream, x, sx, w, sw, y, m, k, n)
                          : cudaErrorNotSupported;
      }
      return cudaErrorNotSupported;
    default: return cudaErrorNotSupported;
  }
}

}  // namespace

bool DecodeSupports(const void* x, const void* w, int64_t m, int64_t k) {
  const auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  return m >= 1 && m <= kMaxTokens && k % 16 == 0 && aligned(x) && aligned(w);
}

template <typename OutT>
cudaError_t RunDecode(int rows_per_block, int split, cudaStream_t stream, const int8_t* x,
                      const float* sx, const int8_t* w, const float* sw, OutT* y, int64_t m,
                      int64_t k, int64_t n) {
  if (rows_per_block == 0) rows_per_block = m <= 8 ? 32 : 16;
  if (split == 0) split = 1;
  if (m <= 8) return LaunchRows<1>(rows_per_block, split, stream, x, sx, w, sw, y, m, k, n);
  if (m <= 16) return LaunchRows<2>(rows_per_block, split, stream, x, sx, w, sw, y, m, k, n);
  if (m <= 32) return LaunchRows<4>(rows_per_block, split, stream, x, sx, w, sw, y, m, k, n);
  if (m <= 64) return LaunchRows<8>(rows_per_block, split, stream, x, sx, w, sw, y, m, k, n);
  return cudaErrorNotSupported;
}

template cudaError_t RunDecode<float>(int, int, cudaStream_t, const int8_t*, const float*,
                                      const int8_t*, const float*, float*, int64_t, int64_t,
                                      int64_t);
template cudaError_t RunDecode<uint16_t>(int, int, cudaStream_t, const int8_t*, const float*,
                                         const int8_t*, const float*, uint16_t*, int64_t,
                                         int64_t, int64_t);

}  // namespace prism
