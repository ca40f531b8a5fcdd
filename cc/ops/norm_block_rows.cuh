// The one-block-per-row RMSNorm kernels of norm_quant_cuda.cu (rows too long for registers, or
// PRISM_RMSNORM_KERNEL=block). The block stages the row's h in shared memory (f32, D <=
// kMaxStagedD); warp 0 takes the sum of squares in the canonical order (the only
// order-sensitive step); the whole block normalises, takes the (exact) amax and quantises.
// Longer rows skip the staging: warp 0 streams the row from global memory and later passes
// read h back.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/norm_args.cuh"

namespace prism {

constexpr int kRowBlockMaxThreads = 1024;
constexpr int kStreamThreads = 256;  // unstaged rows: fewer, fatter threads leave registers for
                                     // the unrolled sum of warp 0
// Longest row staged in (dynamic) shared memory: f32, within the 48 KiB needing no opt-in.
constexpr int64_t kMaxStagedD = 12032;  // a multiple of kVec

// The value the row normalises, for elements i0 .. i0 + cnt - 1 of the whole [M, D] array: x,
// or x + residual rounded to T, which is also written to h.
template <typename T>
__device__ __forceinline__ void LoadH(const NormArgs<T>& a, int64_t i0, int cnt,
                                      float (&v)[kVec]) {
  LoadChunk(a.x + i0, cnt, v);
  if (a.residual == nullptr) return;
  float rv[kVec];
  LoadChunk(a.residual + i0, cnt, rv);
#pragma unroll
  for (int i = 0; i < kVec; ++i) v[i] = RoundToStorage<T>(__fadd_rn(v[i], rv[i]));
  StoreChunk(a.h + i0, cnt, v);
}

// Whole block: the row's h into shared memory (f32; exact for both dtypes). The row is padded
// to whole chunks and the tail chunk is stored whole (zeros past D): the compiler may widen a
// partial chunk's guarded loads into a vector load, which must stay inside the allocation.
template <typename T>
__device__ void StageRow(const NormArgs<T>& a, int64_t off, float* row) {
  for (int64_t d0 = static_cast<int64_t>(threadIdx.x) * kVec; d0 < a.d;
       d0 += static_cast<int64_t>(blockDim.x) * kVec) {
    float v[kVec];
    LoadH(a, off + d0, ChunkCount(d0, a.d), v);  // v[i] = 0 past the row's end
#pragma unroll
    for (int i = 0; i < kVec; ++i) row[d0 + i] = v[i];
  }
}

// Warp 0: canonical sum of h^2, from the staged row or streamed from global memory.
template <typename T, bool kStaged>
__device__ float SumSquares(const NormArgs<T>& a, const float* row, int64_t off, int lane) {
  return WarpCanonicalSum(a.d, lane, [&](int64_t d0, int cnt, float (&t)[kVec]) {
    if constexpr (kStaged) {
      LoadChunk(row + d0, cnt, t);
    } else {
      LoadH(a, off + d0, cnt, t);
    }
#pragma unroll
    for (int i = 0; i < kVec; ++i) t[i] = __fmul_rn(t[i], t[i]);
  });
}

// y = (h * inv) * (weight_offset + gamma) for one chunk, as NormRow does.
template <typename T, typename S>
__device__ __forceinline__ void NormChunk(const S* src, const NormArgs<T>& a, int64_t d0,
                                          int cnt, float inv, float (&y)[kVec]) {
  float g[kVec];
  LoadChunk(src + d0, cnt, y);
  LoadChunk(a.gamma + d0, cnt, g);
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    y[i] = __fmul_rn(__fmul_rn(y[i], inv), __fadd_rn(a.weight_offset, g[i]));
  }
}

// The second digit (a.q2): the remainders after the first digit, their max, then their codes.
// stage (the shared row, holding y) keeps the remainders between the two passes; without it
// each pass recomputes y. Each thread owns the same chunks as in NormalizeRow's passes.
template <typename T, typename S>
__device__ void SecondDigit(const NormArgs<T>& a, const S* src, int64_t off, float inv,
                            float qinv, float scale, float* stage, float* scratch) {
  const int64_t first = static_cast<int64_t>(threadIdx.x) * kVec;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * kVec;
  float r[kVec];
  float rmax = 0.0f;
  for (int64_t d0 = first; d0 < a.d; d0 += stride) {
    const int cnt = ChunkCount(d0, a.d);
    if (stage != nullptr) {
      LoadChunk(stage + d0, cnt, r);
    } else {
      NormChunk(src, a, d0, cnt, inv, r);
    }
    rmax = fmaxf(rmax, ChunkRemainders(r, cnt, qinv, scale));
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      if (stage != nullptr) stage[d0 + i] = r[i];  // whole chunk, as NormalizeRow's
    }
  }
  __syncthreads();  // every thread has read the first BlockMax's scratch
  rmax = BlockMax(rmax, scratch);
  const float rinv = QuantInverse(rmax);
  for (int64_t d0 = first; d0 < a.d; d0 += stride) {
    const int cnt = ChunkCount(d0, a.d);
    if (stage != nullptr) {
      LoadChunk(stage + d0, cnt, r);
    } else {
      NormChunk(src, a, d0, cnt, inv, r);
      ChunkRemainders(r, cnt, qinv, scale);
    }
    int8_t codes[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) codes[i] = QuantCode(r[i], rinv);
    StoreCodes(a.q2 + off + d0, cnt, codes);
  }
  if (threadIdx.x == 0) a.s2[blockIdx.x] = QuantScale(rmax);
}

// Passes after the sum: write y, or amax then codes. src is the row's h (shared f32 or global
// T); outputs start at element off of the [M, D] arrays. stage (the shared row, or null) keeps
// y between the amax and code passes so gamma is read once; each thread owns the same chunks
// in every pass, so overwriting h there races with nothing.
template <typename T, typename S>
__device__ void NormalizeRow(const NormArgs<T>& a, const S* src, int64_t off, float inv,
                             float* stage, float* scratch) {
  const int64_t first = static_cast<int64_t>(threadIdx.x) * kVec;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * kVec;
  float y[kVec];
  if (a.y != nullptr) {
    for (int64_t d0 = first; d0 < a.d; d0 += stride) {
      const int cnt = ChunkCount(d0, a.d);
      NormChunk(src, a, d0, cnt, inv, y);
      StoreChunk(a.y + off + d0, cnt, y);
    }
  }
  if (a.q == nullptr) return;
  float amax = 0.0f;
  for (int64_t d0 = first; d0 < a.d; d0 += stride) {
    const int cnt = ChunkCount(d0, a.d);
    NormChunk(src, a, d0, cnt, inv, y);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {  // unrolled: keeps y in registers
      if (i < cnt) amax = fmaxf(amax, fabsf(y[i]));
      if (stage != nullptr) stage[d0 + i] = y[i];  // whole chunk: zeros past D
    }
  }
  amax = BlockMax(amax, scratch);
  const float qinv = QuantInverse(amax);
  for (int64_t d0 = first; d0 < a.d; d0 += stride) {
    const int cnt = ChunkCount(d0, a.d);
    if (stage != nullptr) {
      LoadChunk(stage + d0, cnt, y);
    } else {
      NormChunk(src, a, d0, cnt, inv, y);
    }
    int8_t codes[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) codes[i] = QuantCode(y[i], qinv);
    StoreCodes(a.q + off + d0, cnt, codes);
  }
  if (threadIdx.x == 0) a.s[blockIdx.x] = QuantScale(amax);
  if (a.q2 != nullptr) SecondDigit(a, src, off, inv, qinv, QuantScale(amax), stage, scratch);
}

template <typename T, bool kStaged>
__global__ void __launch_bounds__(kStaged ? kRowBlockMaxThreads : kStreamThreads)
    NormRowsKernel(NormArgs<T> a) {
  extern __shared__ __align__(16) float row[];  // kStaged: the row's h, D rounded up to kVec
  __shared__ float inv_shared;
  __shared__ float scratch[kRowBlockMaxThreads / kWarpSize];
  const int64_t off = static_cast<int64_t>(blockIdx.x) * a.d;
  if constexpr (kStaged) {
    StageRow(a, off, row);
    __syncthreads();
  }
  if (threadIdx.x < kWarpSize) {
    const float ss = SumSquares<T, kStaged>(a, row, off, static_cast<int>(threadIdx.x));
    if (threadIdx.x == 0) inv_shared = InverseRms(ss, a.d, a.eps);
  }
  __syncthreads();  // publishes inv and, unstaged add_rmsnorm, warp 0's writes of h
  if constexpr (kStaged) {
    NormalizeRow(a, static_cast<const float*>(row), off, inv_shared, row, scratch);
  } else {  // h holds the rounded sum when there is a residual
    NormalizeRow(a, (a.residual != nullptr ? a.h : a.x) + off, off, inv_shared, nullptr, scratch);
  }
}

}  // namespace prism
