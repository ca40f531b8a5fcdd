// NormBulkRowsKernel: one block of kBulkThreads per row, whose x (and residual) reach shared
// memory by one bulk copy each (cp.async.bulk, through cuda::memcpy_async on a block barrier).
// While a row's bytes are in flight no thread holds registers for them, so a block needs ~32
// registers a thread and one row of shared memory, and kBulkBlocks rows share an SM where the
// lean register kernel (NormSplitRowsKernel) fits 3. That kernel is bound by its few resident
// rows' serial work, the chained canonical partial and then two passes over y
// (results/ops_h200_session15/); here more resident rows hide that work.
//
// After the copy the block runs the block kernel's passes (norm_block_rows.cuh): warp 0 takes
// the canonical sum of squares from shared memory, then the whole block normalises, takes the
// (exact) amax and quantises; f32 rows keep y in place of h between the passes. Same bits as
// every other RMSNorm kernel.
#pragma once

#include <cuda/barrier>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/norm_args.cuh"
#include "cc/ops/norm_block_rows.cuh"

namespace prism {

constexpr int kBulkThreads = 256;
constexpr int kBulkBlocks = 8;  // 8 x 256 threads fill an SM's 2048: 32 registers a thread
constexpr int kBulkResidualBlocks = 5;  // x and residual of D = 5376 f32: 43 KB a block
constexpr size_t kBulkMaxSmem = 48 * 1024;  // the dynamic shared memory needing no opt-in

// Elements of a staged row: D rounded up to whole chunks, since the passes read and write the
// tail chunk whole (NormalizeRow's stage); the copy fills only D of them.
__host__ __device__ inline int64_t BulkRowElements(int64_t d) { return (d + kVec - 1) / kVec * kVec; }

template <typename T>
size_t BulkRowsSmem(const NormArgs<T>& a) {
  const int64_t rows = a.residual != nullptr ? 2 : 1;
  return static_cast<size_t>(rows * BulkRowElements(a.d)) * sizeof(T);
}

// Whether the bulk kernel can take a's rows: a bulk copy needs 16-byte-aligned source rows of a
// multiple of 16 bytes, and the block's rows must fit the default shared memory. Not for the
// fused post-norm (a.x_gamma: norm_add_norm_cuda.cu keeps its own kernels).
template <typename T>
bool BulkRowsFit(const NormArgs<T>& a) {
  auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  return a.x_gamma == nullptr && (a.d * static_cast<int64_t>(sizeof(T))) % 16 == 0 &&
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

// One block per row (blockIdx.x); kResidual: a.residual and a.h are set.
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
  float* stage = nullptr;  // f32: y overwrites h chunk by chunk (each thread its own chunks)
  if constexpr (std::is_same_v<T, float>) stage = row;
  NormalizeRow(a, static_cast<const T*>(row), off, inv_shared, stage, scratch);
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
