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

// kFull: as RegSlice's (an absent chunk loads the row's first chunk, never used). The body is
// the pre-split kernel's, kept as written: routing it through RegSlice (all residual loads
// first, gamma as a separate pass) made ptxas spill up to 10 KB at 21 chunks.
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

template <typename T, int kChunks, bool kFull>
__global__ void __launch_bounds__(kRegWarps * kWarpSize)
    NormRegRowsKernel(NormArgs<T> a, int64_t m) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) +
                    threadIdx.x / kWarpSize;
  if (r >= m) return;  // uniform per warp; no block barrier follows
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const int64_t first = static_cast<int64_t>(lane) * kVec;  // chunk c starts at first + c*kStride
  const int64_t off = r * a.d;
  int cnt[kChunks];     // elements of chunk c present in the row (0 past its end)
  int64_t at[kChunks];  // where chunk c is read (kFull: 0 for an absent chunk)
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t d0 = first + static_cast<int64_t>(c) * kStride;
    cnt[c] = d0 < a.d ? ChunkCount(d0, a.d) : 0;
    at[c] = kFull && cnt[c] == 0 ? 0 : d0;
  }
  // Loads only until every x and residual chunk is in flight.
  RegChunk<T> h[kChunks] = {};
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    if constexpr (kFull) {
      h[c].LoadFull(a.x + off + at[c]);
    } else if (cnt[c] > 0) {
      h[c].Load(a.x + off + at[c], cnt[c]);
    }
  }
  if (a.residual != nullptr) {  // h = x + residual rounded to T, as LoadH
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      RegChunk<T> rv = {};
      if constexpr (kFull) {
        rv.LoadFull(a.residual + off + at[c]);
      } else if (cnt[c] > 0) {
        rv.Load(a.residual + off + at[c], cnt[c]);
      }
#pragma unroll
      for (int i = 0; i < kVec; ++i) h[c].SetRounded(i, __fadd_rn(h[c].Get(i), rv.Get(i)));
    }
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      float v[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) v[i] = h[c].Get(i);
      if (cnt[c] == 0) continue;
      if constexpr (kFull) {
        StoreVec(a.h + off + at[c], v);
      } else {
        StoreChunk(a.h + off + at[c], cnt[c], v);
      }
    }
  }
  float acc = 0.0f;  // the lane's canonical partial: its elements in increasing d
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      if (i < cnt[c]) acc = __fadd_rn(acc, __fmul_rn(h[c].Get(i), h[c].Get(i)));
    }
  }
  const float inv = InverseRms(WarpButterflySum(acc), a.d, a.eps);
  float y[kChunks][kVec];  // y = (h * inv) * (weight_offset + gamma), as NormChunk
  float amax = 0.0f;       // exact, so any order; only elements of the row
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
  if (a.y != nullptr) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      if (cnt[c] == 0) continue;
      if constexpr (kFull) {
        StoreVec(a.y + off + at[c], y[c]);
      } else {
        StoreChunk(a.y + off + at[c], cnt[c], y[c]);
      }
    }
  }
  if (a.q == nullptr) return;
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o /= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, o));
  }
  const float qinv = QuantInverse(amax);
  StoreRowCodes(a.q + off, y, cnt, at, qinv);
  if (lane == 0) a.s[r] = QuantScale(amax);
  if (a.q2 == nullptr) return;
  float rmax = 0.0f;  // the second digit: y becomes the remainders
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    rmax = fmaxf(rmax, ChunkRemainders(y[c], cnt[c], qinv, QuantScale(amax)));
  }
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o /= 2) {
    rmax = fmaxf(rmax, __shfl_xor_sync(kFullMask, rmax, o));
  }
  StoreRowCodes(a.q2 + off, y, cnt, at, QuantInverse(rmax));
  if (lane == 0) a.s2[r] = QuantScale(rmax);
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
