// NormRegRowsKernel: one warp per row, the whole row in registers (rows of D <= kMaxRegChunks *
// kStride, Gemma-3 27B's 5376 included). Lane l holds all its canonical chunks, so the sum of
// squares is each lane's chunks in increasing d and then the butterfly: exactly
// WarpCanonicalSum, hence the CPU's bits and NormRowsKernel's. Every input element is read once
// and every output written once, with no shared memory and no barrier (the block kernel's
// dependent passes over global or shared memory, each behind __syncthreads, left a 5376-long
// row latency-bound at ~17 us). Phases: x (and residual) -> h; store h; sum; y and amax (gamma
// loads); store. Long rows hold up to 168 values per lane, which serialises their loads; the split
// kernel (norm_split_rows.cuh) spreads such rows over several warps.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/norm_args.cuh"
#include "cc/ops/norm_reg_slice.cuh"

namespace prism {

constexpr int kMaxRegChunks = 21;  // 168 f32 of y per lane (255 registers; kFull spills a few)
constexpr int kRegWarps = 4;       // rows per block when the grid has rows to spare

// The lane's codes of y (present chunks only) at q_row + at[c].
template <int kChunks>
__device__ __forceinline__ void StoreRowCodes(int8_t* q_row, const float (&y)[kChunks][kVec],
                                              const int (&cnt)[kChunks],
                                              const int64_t (&at)[kChunks], float qinv) {
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    int8_t codes[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) codes[i] = QuantCode(y[c][i], qinv);
    if (cnt[c] > 0) StoreCodes(q_row + at[c], cnt[c], codes);
  }
}

// Lane l's chunks of a row: cnt[c] elements of chunk c present (0 past the row's end), read
// at at[c] (kFull: 0 for an absent chunk, which loads the row's first chunk, never used).
template <int kChunks, bool kFull>
__device__ __forceinline__ void LaneChunks(int lane, int64_t d, int (&cnt)[kChunks],
                                           int64_t (&at)[kChunks]) {
  const int64_t first = static_cast<int64_t>(lane) * kVec;  // chunk c at first + c * kStride
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t d0 = first + static_cast<int64_t>(c) * kStride;
    cnt[c] = d0 < d ? ChunkCount(d0, d) : 0;
    at[c] = kFull && cnt[c] == 0 ? 0 : d0;
  }
}

// One chunk of src: cnt elements at src + at (kFull: the whole chunk; an absent chunk, cnt = 0,
// is left as it is otherwise).
template <typename T, bool kFull>
__device__ __forceinline__ void LoadLaneChunk(const T* src, int cnt, int64_t at,
                                              RegChunk<T>& v) {
  if constexpr (kFull) {
    v.LoadFull(src + at);
  } else if (cnt > 0) {
    v.Load(src + at, cnt);
  }
}

// The lane's chunks of src into v.
template <typename T, int kChunks, bool kFull>
__device__ __forceinline__ void LoadLaneChunks(const T* src, const int (&cnt)[kChunks],
                                               const int64_t (&at)[kChunks],
                                               RegChunk<T> (&v)[kChunks]) {
#pragma unroll
  for (int c = 0; c < kChunks; ++c) LoadLaneChunk<T, kFull>(src, cnt[c], at[c], v[c]);
}

// The lane's present chunks stored at dst + at[c]: element i of chunk c is get(c, i).
template <typename T, int kChunks, bool kFull, typename Get>
__device__ __forceinline__ void StoreLaneChunks(T* dst, const int (&cnt)[kChunks],
                                                const int64_t (&at)[kChunks], Get get) {
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    float v[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = get(c, i);
    if (cnt[c] == 0) continue;
    if constexpr (kFull) {
      StoreVec(dst + at[c], v);
    } else {
      StoreChunk(dst + at[c], cnt[c], v);
    }
  }
}

// h = x + residual rounded to T (as LoadH), stored to a.h; h holds x on entry.
template <typename T, int kChunks, bool kFull>
__device__ __forceinline__ void AddResidual(const NormArgs<T>& a, int64_t off,
                                            const int (&cnt)[kChunks],
                                            const int64_t (&at)[kChunks],
                                            RegChunk<T> (&h)[kChunks]) {
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    RegChunk<T> rv = {};
    LoadLaneChunk<T, kFull>(a.residual + off, cnt[c], at[c], rv);
#pragma unroll
    for (int i = 0; i < kVec; ++i) h[c].SetRounded(i, __fadd_rn(h[c].Get(i), rv.Get(i)));
  }
  StoreLaneChunks<T, kChunks, kFull>(a.h + off, cnt, at,
                                     [&](int c, int i) { return h[c].Get(i); });
}

// The lane's canonical partial of the sum of squares: its elements in increasing d.
template <typename T, int kChunks>
__device__ __forceinline__ float LaneSumSquares(const RegChunk<T> (&h)[kChunks],
                                                const int (&cnt)[kChunks]) {
  float acc = 0.0f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      if (i < cnt[c]) acc = __fadd_rn(acc, __fmul_rn(h[c].Get(i), h[c].Get(i)));
    }
  }
  return acc;
}

// y = (h * inv) * (weight_offset + gamma), as NormChunk; returns the lane's amax over the
// row's elements (exact, so any order).
template <typename T, int kChunks, bool kFull>
__device__ __forceinline__ float ScaleLaneChunks(const NormArgs<T>& a, const int (&cnt)[kChunks],
                                                 const int64_t (&at)[kChunks],
                                                 const RegChunk<T> (&h)[kChunks], float inv,
                                                 float (&y)[kChunks][kVec]) {
  float amax = 0.0f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    float g[kVec] = {};
    if constexpr (kFull) {
      LoadVec(a.gamma + at[c], g);
    } else if (cnt[c] > 0) {
      LoadChunk(a.gamma + at[c], cnt[c], g);
    }
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      y[c][i] = __fmul_rn(__fmul_rn(h[c].Get(i), inv), __fadd_rn(a.weight_offset, g[i]));
      if (i < cnt[c]) amax = fmaxf(amax, fabsf(y[c][i]));
    }
  }
  return amax;
}

// The row's codes and scale (a.q, a.s), then with a.q2 the remainders' (y is overwritten).
template <typename T, int kChunks>
__device__ __forceinline__ void QuantiseLaneChunks(const NormArgs<T>& a, int64_t r, int64_t off,
                                                   int lane, const int (&cnt)[kChunks],
                                                   const int64_t (&at)[kChunks],
                                                   float (&y)[kChunks][kVec], float amax) {
  amax = WarpMax(amax);
  const float qinv = QuantInverse(amax);
  StoreRowCodes(a.q + off, y, cnt, at, qinv);
  if (lane == 0) a.s[r] = QuantScale(amax);
  if (a.q2 == nullptr) return;
  float rmax = 0.0f;  // the second digit: y becomes the remainders
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    rmax = fmaxf(rmax, ChunkRemainders(y[c], cnt[c], qinv, QuantScale(amax)));
  }
  rmax = WarpMax(rmax);
  StoreRowCodes(a.q2 + off, y, cnt, at, QuantInverse(rmax));
  if (lane == 0) a.s2[r] = QuantScale(rmax);
}

// Phases (the top of this file): x loads; each chunk's residual added as it arrives (h); the
// sum; y with gamma loaded chunk by chunk; the codes. kFull: as RegSlice's (an absent chunk
// loads the row's first chunk, never used). This is the pre-split kernel's order, kept:
// routing it through RegSlice (all residual loads first, gamma as a separate pass) made ptxas
// spill up to 10 KB at 21 chunks.
template <typename T, int kChunks, bool kFull>
__global__ void __launch_bounds__(kRegWarps * kWarpSize)
    NormRegRowsKernel(NormArgs<T> a, int64_t m) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) +
                    threadIdx.x / kWarpSize;
  if (r >= m) return;  // uniform per warp; no block barrier follows
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const int64_t off = r * a.d;
  int cnt[kChunks];
  int64_t at[kChunks];
  LaneChunks<kChunks, kFull>(lane, a.d, cnt, at);
  RegChunk<T> h[kChunks] = {};
  LoadLaneChunks<T, kChunks, kFull>(a.x + off, cnt, at, h);
  if (a.residual != nullptr) AddResidual<T, kChunks, kFull>(a, off, cnt, at, h);
  const float inv = InverseRms(WarpButterflySum(LaneSumSquares(h, cnt)), a.d, a.eps);
  float y[kChunks][kVec];
  const float amax = ScaleLaneChunks<T, kChunks, kFull>(a, cnt, at, h, inv, y);
  if (a.y != nullptr) {
    StoreLaneChunks<T, kChunks, kFull>(a.y + off, cnt, at, [&](int c, int i) { return y[c][i]; });
  }
  if (a.q != nullptr) QuantiseLaneChunks<T, kChunks>(a, r, off, lane, cnt, at, y, amax);
}

template <typename T, int kChunks>
void LaunchRegRows(cudaStream_t stream, int64_t m, const NormArgs<T>& a) {
  // Up to ~2 rows per SM (132 on an H200) one warp per block, so the rows spread over every SM
  // (M = 256 in 64 blocks of 4 would leave half of them idle); more rows, kRegWarps per block.
  constexpr int64_t kFewRows = 512;
  const int warps = m <= kFewRows ? 1 : kRegWarps;
  const unsigned grid = static_cast<unsigned>(CeilDiv(m, warps));
  if (FullChunks(a)) {
    NormRegRowsKernel<T, kChunks, true><<<grid, warps * kWarpSize, 0, stream>>>(a, m);
  } else {
    NormRegRowsKernel<T, kChunks, false><<<grid, warps * kWarpSize, 0, stream>>>(a, m);
  }
}

// Register chunks per lane for a row of d (<= kMaxRegChunks * kStride): the smallest
// instantiated count that holds it. Absent chunks cost registers, never memory traffic.
template <typename T>
void LaunchRegRowsFor(cudaStream_t stream, int64_t m, const NormArgs<T>& a) {
  const int64_t chunks = CeilDiv(a.d, kStride);
  if (chunks <= 1) return LaunchRegRows<T, 1>(stream, m, a);
  if (chunks <= 2) return LaunchRegRows<T, 2>(stream, m, a);
  if (chunks <= 3) return LaunchRegRows<T, 3>(stream, m, a);
  if (chunks <= 4) return LaunchRegRows<T, 4>(stream, m, a);
  if (chunks <= 6) return LaunchRegRows<T, 6>(stream, m, a);
  if (chunks <= 8) return LaunchRegRows<T, 8>(stream, m, a);
  if (chunks <= 12) return LaunchRegRows<T, 12>(stream, m, a);
  if (chunks <= 16) return LaunchRegRows<T, 16>(stream, m, a);
  return LaunchRegRows<T, kMaxRegChunks>(stream, m, a);
}

}  // namespace prism
