// NormWarpStagedKernel: one warp per row, the row staged in shared memory instead of registers,
// for many rows without a residual (rmsnorm, rmsnorm_quant; both digits). The split kernels
// (norm_split_rows.cuh) spread a row over 8 warps that hand the canonical partial from warp to
// warp through 8 barriers, and hold three rows per SM: at M = 4096 (D = 5376, f32, H200) their
// lean form moved 2.2 TB/s, 52 % of the copy (results/ops_h200_session15/). The one-warp
// register kernel (norm_reg_rows.cuh) needs 255 registers for such a row. Here a warp's row
// costs 21.5 KB of shared memory and ~40 registers, so ten rows are in flight per SM, each a
// warp that never waits on a barrier.
//
// Same bits as NormRegRowsKernel: each lane copies its canonical chunks (d0 = l * kVec +
// c * kStride) with cp.async, reads back only its own copies, sums their squares in increasing
// c then i, takes the butterfly and InverseRms, then y = (h * inv) * (weight_offset + gamma),
// the exact amax, QuantCode, and for the second digit ChunkRemainders; y is recomputed for each
// pass rather than kept (the same operations on the same values).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/norm_args.cuh"
#include "cc/reg_chunk.cuh"

namespace prism {

constexpr int kStagedWarps = 2;  // rows (warps) per block: 43 KB of f32 rows, five blocks an SM

// 16 bytes global -> shared by cp.async (sm_80+; .cg: through L2 only, a row is read once).
__device__ __forceinline__ void StagedCopy16(void* dst, const void* src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}

// y = (h * inv) * (weight_offset + gamma) for the lane's whole chunk at d0 (StagedRow's pass).
template <typename T>
__device__ __forceinline__ void StagedY(const T* row, const NormArgs<T>& a, int64_t d0,
                                        float inv, float (&y)[kVec]) {
  RegChunk<T> h;
  h.LoadFull(row + d0);
  float g[kVec];
  LoadVec(a.gamma + d0, g);
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    y[i] = __fmul_rn(__fmul_rn(h.Get(i), inv), __fadd_rn(a.weight_offset, g[i]));
  }
}

// Max over the warp (exact, so any order).
__device__ __forceinline__ float StagedWarpMax(float v) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// The codes of the lane's chunks of y (second: of their remainders after the first digit).
template <typename T, bool kSecond>
__device__ __forceinline__ float StagedCodes(const T* row, const NormArgs<T>& a, int lane,
                                             float inv, float qinv, float scale, float rinv,
                                             int8_t* q_row) {
  float rmax = 0.0f;
#pragma unroll 4
  for (int64_t d0 = static_cast<int64_t>(lane) * kVec; d0 < a.d; d0 += kStride) {
    float y[kVec];
    StagedY(row, a, d0, inv, y);
    if constexpr (kSecond) rmax = fmaxf(rmax, ChunkRemainders(y, kVec, qinv, scale));
    int8_t codes[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) codes[i] = QuantCode(y[i], kSecond ? rinv : qinv);
    if (q_row != nullptr) StoreCodes(q_row + d0, kVec, codes);
  }
  return rmax;
}

// Rows blockIdx.x * kStagedWarps + warp; every chunk whole and 16-byte aligned (FullChunks),
// no residual, no fused post-norm (the launcher checks).
template <typename T>
__global__ void __launch_bounds__(kStagedWarps * kWarpSize)
    NormWarpStagedKernel(NormArgs<T> a, int64_t m) {
  extern __shared__ float4 staged_smem[];
  const int warp = static_cast<int>(threadIdx.x / kWarpSize);
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kStagedWarps + warp;
  if (r >= m) return;  // uniform per warp; no block barrier follows
  T* row = reinterpret_cast<T*>(staged_smem) + warp * a.d;
  const int64_t off = r * a.d, first = static_cast<int64_t>(lane) * kVec;
  constexpr int kCopies = static_cast<int>(kVec * sizeof(T) / 16);
  for (int64_t d0 = first; d0 < a.d; d0 += kStride) {
#pragma unroll
    for (int c = 0; c < kCopies; ++c) {
      const int64_t e = d0 + c * (16 / static_cast<int64_t>(sizeof(T)));
      StagedCopy16(row + e, a.x + off + e);
    }
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");  // the lane's own copies
  float acc = 0.0f;  // the lane's canonical partial: its elements in increasing d
#pragma unroll 4
  for (int64_t d0 = first; d0 < a.d; d0 += kStride) {
    RegChunk<T> h;
    h.LoadFull(row + d0);
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc = __fadd_rn(acc, __fmul_rn(h.Get(i), h.Get(i)));
  }
  const float inv = InverseRms(WarpButterflySum(acc), a.d, a.eps);
  float amax = 0.0f;
#pragma unroll 4
  for (int64_t d0 = first; d0 < a.d; d0 += kStride) {
    float y[kVec];
    StagedY(row, a, d0, inv, y);
#pragma unroll
    for (int i = 0; i < kVec; ++i) amax = fmaxf(amax, fabsf(y[i]));
    if (a.y != nullptr) StoreVec(a.y + off + d0, y);
  }
  if (a.q == nullptr) return;
  amax = StagedWarpMax(amax);
  const float qinv = QuantInverse(amax), scale = QuantScale(amax);
  StagedCodes<T, false>(row, a, lane, inv, qinv, scale, 0.0f, a.q + off);
  if (lane == 0) a.s[r] = scale;
  if (a.q2 == nullptr) return;
  const float rmax = StagedWarpMax(
      StagedCodes<T, true>(row, a, lane, inv, qinv, scale, 0.0f, nullptr));
  StagedCodes<T, true>(row, a, lane, inv, qinv, scale, QuantInverse(rmax), a.q2 + off);
  if (lane == 0) a.s2[r] = QuantScale(rmax);
}

// Whether NormWarpStagedKernel takes a's rows.
template <typename T>
bool WarpStagedFits(const NormArgs<T>& a) {
  return FullChunks(a) && a.residual == nullptr && a.x_gamma == nullptr && a.h == nullptr &&
         a.d * static_cast<int64_t>(sizeof(T)) * kStagedWarps <= (200 << 10);
}

template <typename T>
ffi::Error LaunchWarpStaged(cudaStream_t stream, int64_t m, const NormArgs<T>& a) {
  const size_t smem = static_cast<size_t>(kStagedWarps) * a.d * sizeof(T);
  if (smem > 48 * 1024) {  // above the default cap: opt in (not a stream operation)
    const cudaError_t e = cudaFuncSetAttribute(
        NormWarpStagedKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
        static_cast<int>(smem));
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear it: nothing was launched
      return ffi::Error::Internal(std::string("RMSNorm staged rows: shared memory: ") +
                                  cudaGetErrorString(e));
    }
  }
  // The largest carveout: shared memory, not the driver's choice, bounds the rows per SM.
  cudaFuncSetAttribute(NormWarpStagedKernel<T>, cudaFuncAttributePreferredSharedMemoryCarveout,
                       cudaSharedmemCarveoutMaxShared);
  const unsigned grid = static_cast<unsigned>(CeilDiv(m, kStagedWarps));
  NormWarpStagedKernel<T><<<grid, kStagedWarps * kWarpSize, smem, stream>>>(a, m);
  return ffi::Error::Success();
}

}  // namespace prism
