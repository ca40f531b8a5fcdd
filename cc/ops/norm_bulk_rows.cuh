// NormBulkRowsKernel: one block of kBulkThreads per row, whose x (and residual) reach shared
// memory by one bulk copy each (cp.async.bulk, through cuda::memcpy_async on a block barrier).
// While a row's bytes are in flight no thread holds registers for them, so a block needs ~32
// registers a thread and one row of shared memory, and kBulkBlocks rows share an SM where the
// lean register kernel (NormSplitRowsKernel) fits 3. That kernel is bound by its few resident
// rows' serial work, the chained canonical partial and then two passes over y
// (results/ops_h200_session15/); here more resident rows hide that work.
//
// Each thread loads its chunks' gamma while the copy is in flight. After it lands, warp 0 takes
// the canonical sum of squares from shared memory (one lane per canonical lane, in increasing
// d); then every thread computes y for its chunks once and keeps it in registers for the amax,
// the codes and the second digit. Same bits as every other RMSNorm kernel.
#pragma once

#include <cuda/barrier>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/norm_args.cuh"
#include "cc/reg_chunk.cuh"

namespace prism {

constexpr int kBulkThreads = 256;
constexpr int kBulkBlocks = 6;  // 8 x 256 threads fill an SM's 2048: 32 registers a thread
constexpr int kBulkResidualBlocks = 5;  // x and residual of D = 5376 f32: 43 KB a block
constexpr int kBulkChunks = 3;          // chunks a thread: rows of D <= 3 * 256 * kVec = 6144
constexpr size_t kBulkMaxSmem = 48 * 1024;  // the dynamic shared memory needing no opt-in

// Elements of a staged row: D rounded up to whole chunks, since the passes read and write the
// tail chunk whole (NormalizeRow's stage); the copy fills only D of them.
__host__ __device__ inline int64_t BulkRowElements(int64_t d) { return (d + kVec - 1) / kVec * kVec; }

// Shared memory: the row (T, padded to whole chunks), the residual's after it, and for bf16
// rows an f32 row for y (f32 rows keep y in place of h: each thread rewrites only its chunks,
// after the sum has read them).
template <typename T>
__host__ __device__ inline int64_t BulkRowsBytes(int64_t d, bool residual) {
  const int64_t padded = BulkRowElements(d);
  const int64_t y = std::is_same_v<T, float> ? 0 : padded * 4;
  return (residual ? 2 : 1) * padded * static_cast<int64_t>(sizeof(T)) + y;
}

template <typename T>
size_t BulkRowsSmem(const NormArgs<T>& a) {
  return static_cast<size_t>(BulkRowsBytes<T>(a.d, a.residual != nullptr));
}

// Where the block's y lives (see BulkRowsBytes).
template <typename T>
__device__ __forceinline__ float* BulkY(T* row, const NormArgs<T>& a) {
  if constexpr (std::is_same_v<T, float>) {
    return row;
  } else {
    const int64_t rows = a.residual != nullptr ? 2 : 1;
    return reinterpret_cast<float*>(row + rows * BulkRowElements(a.d));
  }
}

// Whether the bulk kernel can take a's rows: a bulk copy needs 16-byte-aligned source rows of a
// multiple of 16 bytes, the block's rows must fit the default shared memory, and each thread
// holds at most kBulkChunks chunks of y. Not for the
// fused post-norm (a.x_gamma: norm_add_norm_cuda.cu keeps its own kernels).
template <typename T>
bool BulkRowsFit(const NormArgs<T>& a) {
  auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  return a.x_gamma == nullptr && a.d <= kBulkChunks * kBulkThreads * kVec &&
         (a.d * static_cast<int64_t>(sizeof(T))) % 16 == 0 &&
         aligned(a.x) && aligned(a.residual) && BulkRowsSmem(a) <= kBulkMaxSmem;
}

// h = x + residual rounded to T, in place of the staged x and into a.h (LoadH's bits).
template <typename T>
__device__ void AddStagedResidual(const NormArgs<T>& a, int64_t off, T* row, const T* res) {
  for (int64_t d0 = static_cast<int64_t>(threadIdx.x) * kVec; d0 < a.d;
       d0 += static_cast<int64_t>(blockDim.x) * kVec) {
    const int cnt = ChunkCount(d0, a.d);
    float v[kVec], rv[kVec];
    LoadChunk(row + d0, cnt, v);
    LoadChunk(res + d0, cnt, rv);
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = RoundToStorage<T>(__fadd_rn(v[i], rv[i]));
    StoreChunk(row + d0, cnt, v);
    StoreChunk(a.h + off + d0, cnt, v);
  }
}

// Lane l's canonical partial of the staged row's squares: its chunks in increasing d, each
// element squared then added (WarpCanonicalSum's order). Two chunks a step, not its four: the
// loads are from shared memory, and four chunks' 32 floats spilled at 32 registers.
template <typename T>
__device__ __forceinline__ float StagedLanePartial(const T* row, int64_t d, int lane) {
  float acc = 0.0f;
#pragma unroll 2
  for (int64_t d0 = static_cast<int64_t>(lane) * kVec; d0 < d; d0 += kStride) {
    const int cnt = ChunkCount(d0, d);
    float t[kVec];
    LoadChunk(row + d0, cnt, t);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      if (i < cnt) acc = __fadd_rn(acc, __fmul_rn(t[i], t[i]));
    }
  }
  return acc;
}

// The thread's chunks of the row: chunk c is the row's chunk threadIdx.x + c * kBulkThreads
// (elements d0 = that * kVec ...), present when it starts inside the row.
struct BulkChunks {
  int64_t d;  // the row's length; the rest is recomputed where used, not held in registers

  __device__ __forceinline__ int64_t d0(int c) const {
    return (static_cast<int64_t>(threadIdx.x) + c * kBulkThreads) * kVec;
  }
  __device__ __forceinline__ int cnt(int c) const {  // elements of the row in chunk c (0: absent)
    return d0(c) < d ? ChunkCount(d0(c), d) : 0;
  }
};

// w = weight_offset + gamma for the thread's chunks, all loads in flight together (issued
// before the copy lands, so their latency hides under it).
__device__ __forceinline__ void LoadBulkWeights(const float* gamma, float offset,
                                                const BulkChunks& k,
                                                float (&w)[kBulkChunks][kVec]) {
#pragma unroll
  for (int c = 0; c < kBulkChunks; ++c) {
    float g[kVec] = {};
    if (k.cnt(c) > 0) LoadChunk(gamma + k.d0(c), k.cnt(c), g);
#pragma unroll
    for (int i = 0; i < kVec; ++i) w[c][i] = __fadd_rn(offset, g[i]);
  }
}

// The codes of the staged y (row max amax) and their scale; with a.q2 then the second digit's
// (the remainders' max over the block: scratch is reused after a barrier). Each thread reads
// and rewrites only its own chunks of ys.
template <typename T>
__device__ __forceinline__ void BulkCodes(const NormArgs<T>& a, const BulkChunks& k, float* ys,
                                          float amax, float* scratch) {
  const int64_t off = static_cast<int64_t>(blockIdx.x) * a.d;
  const float qinv = QuantInverse(amax), scale = QuantScale(amax);
  float rmax = 0.0f;
#pragma unroll
  for (int c = 0; c < kBulkChunks; ++c) {
    if (k.cnt(c) == 0) continue;
    float y[kVec];
    LoadVec(ys + k.d0(c), y);
    int8_t codes[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) codes[i] = QuantCode(y[i], qinv);
    StoreCodes(a.q + off + k.d0(c), k.cnt(c), codes);
    if (a.q2 == nullptr) continue;
    rmax = fmaxf(rmax, ChunkRemainders(y, k.cnt(c), qinv, scale));
    StoreVec(ys + k.d0(c), y);
  }
  if (threadIdx.x == 0) a.s[blockIdx.x] = scale;
  if (a.q2 == nullptr) return;  // uniform over the block
  __syncthreads();  // every warp has read BlockMax's scratch
  rmax = BlockMax(rmax, scratch);
  const float rinv = QuantInverse(rmax);
#pragma unroll
  for (int c = 0; c < kBulkChunks; ++c) {
    if (k.cnt(c) == 0) continue;
    float r[kVec];
    LoadVec(ys + k.d0(c), r);
    int8_t codes[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) codes[i] = QuantCode(r[i], rinv);
    StoreCodes(a.q2 + off + k.d0(c), k.cnt(c), codes);
  }
  if (threadIdx.x == 0) a.s2[blockIdx.x] = QuantScale(rmax);
}

// One block per row (blockIdx.x); kResidual: a.residual and a.h are set. y stays in registers
// from the amax to the codes (and the second digit's remainders), so gamma is read once.
template <typename T, bool kResidual>
__global__ void __launch_bounds__(kBulkThreads, kResidual ? kBulkResidualBlocks : kBulkBlocks)
    NormBulkRowsKernel(NormArgs<T> a) {
  using Barrier = cuda::barrier<cuda::thread_scope_block>;
  extern __shared__ __align__(16) unsigned char bulk_rows[];
#pragma nv_diag_suppress static_var_with_dynamic_init
  __shared__ Barrier copied;  // completes when every thread arrived and the copies landed
  __shared__ float inv_shared;
  __shared__ float scratch[kBulkThreads / kWarpSize];
  T* row = reinterpret_cast<T*>(bulk_rows);
  const int64_t off = static_cast<int64_t>(blockIdx.x) * a.d;
  if (threadIdx.x == 0) {
    init(&copied, blockDim.x);
    cuda::device::experimental::fence_proxy_async_shared_cta();  // the copy engine sees it
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const cuda::aligned_size_t<16> bytes(static_cast<size_t>(a.d) * sizeof(T));
    cuda::memcpy_async(row, a.x + off, bytes, copied);
    if constexpr (kResidual) {
      cuda::memcpy_async(row + BulkRowElements(a.d), a.residual + off, bytes, copied);
    }
  }
  const BulkChunks k{a.d};
  copied.arrive_and_wait();
  if constexpr (kResidual) {
    AddStagedResidual(a, off, row, row + BulkRowElements(a.d));
    __syncthreads();  // warp 0 sums every thread's h
  }
  if (threadIdx.x < kWarpSize) {
    const float ss = WarpButterflySum(StagedLanePartial(row, a.d, static_cast<int>(threadIdx.x)));
    if (threadIdx.x == 0) inv_shared = InverseRms(ss, a.d, a.eps);
  }
  __syncthreads();  // publishes inv
  const float inv = inv_shared;
  float w[kBulkChunks][kVec];  // offset + gamma, all loads in flight together
  LoadBulkWeights(a.gamma, a.weight_offset, k, w);
  float* ys = BulkY(row, a);  // y of the thread's chunks, each thread its own: no barrier
  float amax = 0.0f;
#pragma unroll
  for (int c = 0; c < kBulkChunks; ++c) {
    if (k.cnt(c) == 0) continue;
    float h[kVec];
    LoadChunk(row + k.d0(c), k.cnt(c), h);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {  // NormChunk's y; w[c] becomes y
      w[c][i] = __fmul_rn(__fmul_rn(h[i], inv), w[c][i]);
      if (i < k.cnt(c)) amax = fmaxf(amax, fabsf(w[c][i]));
    }
    if (a.y != nullptr) StoreChunk(a.y + off + k.d0(c), k.cnt(c), w[c]);
    if (a.q != nullptr) StoreVec(ys + k.d0(c), w[c]);  // whole chunk: the row is padded
  }
  if (a.q == nullptr) return;  // uniform over the block: every thread skips BlockMax
  BulkCodes(a, k, ys, BlockMax(amax, scratch), scratch);
}

// kBulkBlocks rows of D = 5376 f32 take 172 KB of shared memory an SM: ask for the largest
// carveout once, as a hint (the driver may not grant it; the L1 left still holds gamma).
template <typename T, bool kResidual>
void LaunchBulkRowsAs(cudaStream_t stream, int64_t m, const NormArgs<T>& a) {
  static const cudaError_t carved = cudaFuncSetAttribute(
      NormBulkRowsKernel<T, kResidual>, cudaFuncAttributePreferredSharedMemoryCarveout,
      cudaSharedmemCarveoutMaxShared);
  (void)carved;
  NormBulkRowsKernel<T, kResidual>
      <<<static_cast<unsigned>(m), kBulkThreads, BulkRowsSmem(a), stream>>>(a);
}

// Launches the bulk kernel over m rows; the caller checked BulkRowsFit(a).
template <typename T>
void LaunchBulkRows(cudaStream_t stream, int64_t m, const NormArgs<T>& a) {
  if (a.residual != nullptr) return LaunchBulkRowsAs<T, true>(stream, m, a);
  LaunchBulkRowsAs<T, false>(stream, m, a);
}

}  // namespace prism
