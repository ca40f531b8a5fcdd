// prism_int8_gemm for small M (decode steps): a weight-streaming kernel. At M <= 16 the GEMM is
// a read of w (N * K bytes) with a little arithmetic, so the kernel is built around keeping many
// 16-byte loads of w in flight, read once and never cached in L1.
//
// Shapes: M tokens (<= 64), K inputs (% 16 == 0), N outputs; x [M, K], w [N, K], y [M, N].
// Block: 8 warps on one slab of kSlabs x 16 weight rows and one split of K; warp v takes the
// 64-byte K chunks v, v + 8, v + 16, ... of the split (so the block reads 512 contiguous bytes of
// each row at a time), keeps int32 partial sums in mma.sync m16n8k32 fragments (A = 16 weight
// rows, B = 8 tokens), adds them into shared memory with integer atomics (exact in any order),
// then applies the epilogue.
//
// Split-K (Splits below): a shape with few slabs (o and down at N = 5376: 168 slabs of 32 rows,
// 1.27 blocks per SM of an H200, 2.5-3.0 TB/s) gets gridDim.y splits of K, so the grid holds
// ~8 blocks per SM and every SM streams. A split parks its slab's sums in its workspace slot and
// counts itself on the slab's counter (zeroed by a memset before the launch); the split that
// completes the count adds the slots and writes y. Integer sums: the same bits in any order.
//
// K order inside a chunk: lane (g, t) (g = lane / 4, t = lane % 4) loads bytes [16t, 16t + 16)
// of weight rows g and g + 8 and of token row g. The mma sees them as k = 4t..4t+3 and 16+4t..
// 16+4t+3 (two instructions per chunk, bytes 0-7 then 8-15); the same permutation of k is used
// for w and x, and an integer dot product does not depend on the order of its terms.
#include <cuda_runtime.h>

#include <algorithm>

#include "cc/common.h"
#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/int8_gemm_kernels.h"

namespace prism {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kChunk = 64;       // K bytes per warp step (4 lanes x 16 bytes per row)
constexpr int kMaxTokens = 64;
constexpr int64_t kBlocksPerSm = 8;     // split K until the grid has about this many per SM
constexpr int64_t kMinSplitBytes = 512;  // a split gives every warp at least one chunk a row

// 16 bytes at p if `live`, else zeros and no memory access: a predicated load, not a branch, so
// the compiler still issues a chunk's loads back to back. (Dead chunks used to re-read offset
// 0, which split-K's short K ranges turned into most of the loads.)
// kStream: w, streamed once: bypass L1 so x (re-read by every block) stays there, and ask L2
// for 256-byte lines. Otherwise x, through L1.
template <bool kStream>
__device__ __forceinline__ int4 LoadIf(const int8_t* p, bool live) {
  int4 v;
  if constexpr (kStream) {
    asm volatile(
        "{\n.reg .pred q;\nsetp.ne.b32 q, %5, 0;\n"
        "mov.b32 %0, 0;\nmov.b32 %1, 0;\nmov.b32 %2, 0;\nmov.b32 %3, 0;\n"
        "@q ld.global.nc.L1::no_allocate.L2::256B.v4.s32 {%0, %1, %2, %3}, [%4];\n}"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p), "r"(static_cast<int>(live)));
  } else {
    asm volatile(
        "{\n.reg .pred q;\nsetp.ne.b32 q, %5, 0;\n"
        "mov.b32 %0, 0;\nmov.b32 %1, 0;\nmov.b32 %2, 0;\nmov.b32 %3, 0;\n"
        "@q ld.global.nc.v4.s32 {%0, %1, %2, %3}, [%4];\n}"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p), "r"(static_cast<int>(live)));
  }
  return v;
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

// kSlabs x 16 weight rows per block, kTiles x 8 tokens, kUnroll chunks loaded before use.
// Where split blocks meet (gridDim.y > 1): counters [slabs], slots [slabs][splits][tokens][rows].
struct SplitSpace {
  int64_t split_chunks;  // K chunks per split
  int32_t* counters;
  int32_t* slots;
};

// y from the slab's int32 sums (sum(i): tokens x rows, row-major), the contract's epilogue.
template <int kRows, int kTokens, typename OutT, typename SumFn>
__device__ void WriteSlab(const float* sx, const float* sw, OutT* y, int m, int64_t n,
                          int64_t n0, SumFn sum) {
  // Consecutive threads write consecutive outputs of one token row.
  for (int i = threadIdx.x; i < kTokens * kRows; i += kThreads) {
    const int tok = i / kRows, r = i % kRows;
    const int64_t col = n0 + r;
    if (tok < m && col < n) {
      // Epilogue order is part of the contract: (acc * s_x) * s_w, in fp32.
      const float v = __fmul_rn(__fmul_rn(static_cast<float>(sum(i)), sx[tok]), sw[col]);
      FromF32(v, y + static_cast<int64_t>(tok) * n + col);
    }
  }
}

template <int kSlabs, int kTiles, int kUnroll, typename OutT>
__global__ void __launch_bounds__(kThreads)
    DecodeKernel(const int8_t* __restrict__ x, const float* __restrict__ sx,
                 const int8_t* __restrict__ w, const float* __restrict__ sw,
                 OutT* __restrict__ y, int m, int64_t k, int64_t n, SplitSpace split) {
  constexpr int kRows = kSlabs * 16, kTokens = kTiles * 8;
  __shared__ int32_t sums[kTokens][kRows + 1];  // +1: spreads the atomics' banks
  for (int i = threadIdx.x; i < kTokens * (kRows + 1); i += kThreads) (&sums[0][0])[i] = 0;

  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kRows;
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
  const int64_t first = static_cast<int64_t>(blockIdx.y) * split.split_chunks;
  const int64_t chunks = std::min((k + kChunk - 1) / kChunk, first + split.split_chunks);
  for (int64_t c0 = first + warp; c0 < chunks; c0 += kWarps * kUnroll) {
    int4 wv[kUnroll][kSlabs][2];
    int4 xv[kUnroll][kTiles];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t at = (c0 + u * kWarps) * kChunk;
      const bool live = c0 + u * kWarps < chunks && at + 16 * t < k;  // K % 16 == 0
      const int64_t off = live ? at : 0;
#pragma unroll
      for (int s = 0; s < kSlabs; ++s) {
#pragma unroll
        for (int h = 0; h < 2; ++h) wv[u][s][h] = LoadIf<true>(wrow[s][h] + off, live);
      }
#pragma unroll
      for (int j = 0; j < kTiles; ++j) xv[u][j] = LoadIf<false>(xrow[j] + off, live && xlive[j]);
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
  __syncthreads();
  const auto cell = [&](int i) { return (&sums[0][0])[i / kRows * (kRows + 1) + i % kRows]; };
  if (gridDim.y == 1) {
    WriteSlab<kRows, kTokens>(sx, sw, y, m, n, n0, cell);
    return;
  }
  const int64_t splits = gridDim.y;
  const auto slot = [&](int64_t s) {
    return split.slots + (static_cast<int64_t>(blockIdx.x) * splits + s) * (kTokens * kRows);
  };
  int32_t* mine = slot(blockIdx.y);
  for (int i = threadIdx.x; i < kTokens * kRows; i += kThreads) mine[i] = cell(i);
  __threadfence();  // the slot before the count that publishes it
  __syncthreads();
  __shared__ bool last;
  if (threadIdx.x == 0) last = atomicAdd(&split.counters[blockIdx.x], 1) + 1 == splits;
  __syncthreads();
  if (!last) return;
  __threadfence();
  WriteSlab<kRows, kTokens>(sx, sw, y, m, n, n0, [&](int i) {
    int32_t total = 0;
    for (int64_t s = 0; s < splits; ++s) total += __ldcg(slot(s) + i);
    return total;
  });
}

// K splits for `slabs` blocks of a K-long GEMM: enough for ~kBlocksPerSm blocks per SM, each
// split at least kMinSplitBytes; with its chunks per split in *split_chunks.
int64_t Splits(int64_t slabs, int64_t k, int sms, int64_t* split_chunks) {
  const int64_t chunks = CeilDiv(k, kChunk);
  const int64_t wanted = CeilDiv(kBlocksPerSm * std::max(sms, 1), slabs);
  const int64_t most = std::max<int64_t>(1, k / kMinSplitBytes);
  *split_chunks = CeilDiv(chunks, std::min(wanted, most));
  return CeilDiv(chunks, *split_chunks);  // no empty split
}

int SmCount() {
  static const int sms = [] {
    int device = 0, count = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      cudaGetLastError();  // clear it: the default below stands in
      return 132;          // an H200's
    }
    return count;
  }();
  return sms;
}

constexpr int64_t kCounterAlign = 256;

int64_t WorkspaceFor(int64_t slabs, int64_t splits, int tokens, int rows) {
  if (splits <= 1) return 0;
  return CeilDiv(slabs * 4, kCounterAlign) * kCounterAlign + slabs * splits * tokens * rows * 4;
}

template <int kSlabs, int kTiles, typename OutT>
cudaError_t Launch(cudaStream_t stream, const int8_t* x, const float* sx, const int8_t* w,
                   const float* sw, OutT* y, int64_t m, int64_t k, int64_t n, void* workspace,
                   size_t workspace_bytes) {
  // About 64 registers of w loads in flight per lane, whatever the slab count.
  constexpr int kUnroll = kTiles >= 4 ? 2 : 8 / kSlabs;
  constexpr int kRows = kSlabs * 16, kTokens = kTiles * 8;
  const int64_t blocks = CeilDiv(n, kRows);
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  SplitSpace split{CeilDiv(k, kChunk), nullptr, nullptr};
  int64_t splits = Splits(blocks, k, SmCount(), &split.split_chunks);
  if (splits > 1 && (workspace == nullptr ||
                     WorkspaceFor(blocks, splits, kTokens, kRows) >
                         static_cast<int64_t>(workspace_bytes))) {
    splits = 1, split.split_chunks = CeilDiv(k, kChunk);  // sized for another device: unsplit
  }
  if (splits > 1) {
    split.counters = static_cast<int32_t*>(workspace);
    split.slots = reinterpret_cast<int32_t*>(static_cast<int8_t*>(workspace) +
                                             CeilDiv(blocks * 4, kCounterAlign) * kCounterAlign);
    if (auto e = cudaMemsetAsync(split.counters, 0, blocks * 4, stream); e != cudaSuccess) {
      return e;
    }
  }
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(splits));
  DecodeKernel<kSlabs, kTiles, kUnroll, OutT><<<grid, kThreads, 0, stream>>>(
      x, sx, w, sw, y, static_cast<int>(m), k, n, split);
  return cudaGetLastError();
}

template <int kTiles, typename OutT>
cudaError_t LaunchRows(int rows, cudaStream_t stream, const int8_t* x, const float* sx,
                       const int8_t* w, const float* sw, OutT* y, int64_t m, int64_t k,
                       int64_t n, void* ws, size_t ws_bytes) {
  switch (rows) {
    case 16: return Launch<1, kTiles>(stream, x, sx, w, sw, y, m, k, n, ws, ws_bytes);
    case 32: return Launch<2, kTiles>(stream, x, sx, w, sw, y, m, k, n, ws, ws_bytes);
    case 64:
      if constexpr (kTiles <= 2) {
        return Launch<4, kTiles>(stream, x, sx, w, sw, y, m, k, n, ws, ws_bytes);
      }
      return cudaErrorNotSupported;
    default: return cudaErrorNotSupported;
  }
}

int DefaultRows(int64_t m) { return m <= 8 ? 32 : 16; }
int TokensFor(int64_t m) { return m <= 8 ? 8 : m <= 16 ? 16 : m <= 32 ? 32 : 64; }

}  // namespace

bool DecodeSupports(const void* x, const void* w, int64_t m, int64_t k) {
  const auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  return m >= 1 && m <= kMaxTokens && k % 16 == 0 && aligned(x) && aligned(w);
}

size_t DecodeWorkspaceBytes(int rows_per_block, int64_t m, int64_t k, int64_t n) {
  if (rows_per_block == 0) rows_per_block = DefaultRows(m);
  if (m < 1 || m > kMaxTokens || n < 1 || k < 1) return 0;
  const int64_t slabs = CeilDiv(n, rows_per_block);
  int64_t split_chunks = 0;
  const int64_t splits = Splits(slabs, k, SmCount(), &split_chunks);
  return static_cast<size_t>(WorkspaceFor(slabs, splits, TokensFor(m), rows_per_block));
}

template <typename OutT>
cudaError_t RunDecode(int rows_per_block, cudaStream_t stream, const int8_t* x, const float* sx,
                      const int8_t* w, const float* sw, OutT* y, int64_t m, int64_t k,
                      int64_t n, void* ws, size_t ws_bytes) {
  if (rows_per_block == 0) rows_per_block = DefaultRows(m);
  const int r = rows_per_block;
  if (m <= 8) return LaunchRows<1>(r, stream, x, sx, w, sw, y, m, k, n, ws, ws_bytes);
  if (m <= 16) return LaunchRows<2>(r, stream, x, sx, w, sw, y, m, k, n, ws, ws_bytes);
  if (m <= 32) return LaunchRows<4>(r, stream, x, sx, w, sw, y, m, k, n, ws, ws_bytes);
  if (m <= 64) return LaunchRows<8>(r, stream, x, sx, w, sw, y, m, k, n, ws, ws_bytes);
  return cudaErrorNotSupported;
}

template cudaError_t RunDecode<float>(int, cudaStream_t, const int8_t*, const float*,
                                      const int8_t*, const float*, float*, int64_t, int64_t,
                                      int64_t, void*, size_t);
template cudaError_t RunDecode<uint16_t>(int, cudaStream_t, const int8_t*, const float*,
                                         const int8_t*, const float*, uint16_t*, int64_t,
                                         int64_t, int64_t, void*, size_t);

}  // namespace prism
