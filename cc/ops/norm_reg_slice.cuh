// A slice of one row held in registers by one warp: the building block of the register RMSNorm
// kernels (norm_reg_rows.cuh: one warp per row; norm_split_rows.cuh: several). Lane l holds
// its canonical chunks d0 = l * kVec + c * kStride for c in [first, end), so the lane's
// elements, in increasing c then i, are in increasing d: the canonical partial's order.
// Phases keep loads and stores apart, so the compiler can issue all of a phase's loads at once
// (h may alias x, so a store would pin every later load behind it).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/norm_args.cuh"
#include "cc/reg_chunk.cuh"

namespace prism {

// Writes v[0, cnt) at p: one vector store for kFull rows, else FromF32 element by element.
template <bool kFull, typename T>
__device__ __forceinline__ void StoreSliceChunk(T* p, int cnt, const float (&v)[kVec]) {
  if constexpr (kFull) {
    StoreVec(p, v);
  } else {
    StoreChunk(p, cnt, v);
  }
}

// kFull: D % kVec == 0 and every pointer 16-byte aligned, so a chunk is whole or absent; an
// absent chunk loads the row's first chunk instead (valid memory, never used: sums, amax and
// stores skip it), which keeps the loads unconditional. Otherwise guarded loads (odd rows).
template <typename T, int kChunks, bool kFull>
struct RegSlice {
  int cnt[kChunks];        // elements of slice chunk j present in the row (0 when absent)
  int64_t at[kChunks];     // where in the row chunk j is read (kFull: 0 when absent)
  RegChunk<T> h[kChunks];  // the row's h

  // Slice chunk j is the lane's canonical chunk first + j, present when first + j < end and
  // it starts inside the row.
  __device__ __forceinline__ void Locate(int64_t d, int lane, int first, int end) {
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int64_t d0 =
          static_cast<int64_t>(lane) * kVec + static_cast<int64_t>(first + j) * kStride;
      cnt[j] = first + j < end && d0 < d ? ChunkCount(d0, d) : 0;
      at[j] = kFull && cnt[j] == 0 ? 0 : d0;
    }
  }

  // h = x, or x + residual rounded to T (as LoadH), which is also written to a.h; and
  // w = weight_offset + gamma. The row starts at element off of the [M, D] arrays. Every load
  // is issued before the first store: gamma may alias h as far as the compiler knows, so a
  // gamma load after the h stores would wait for x and residual, a round trip of its own.
  template <bool kSum = false>
  __device__ __forceinline__ void LoadRow(const NormArgs<T>& a, int64_t off,
                                          float (&w)[kChunks][kVec]) {
    LoadX<kSum>(a, off);
    RegChunk<T> rv[kChunks];
    if (a.residual != nullptr) Load(a.residual + off, rv);
    LoadWeights(a, w);
    if (a.residual != nullptr) AddResidual(a, off, rv);
  }

  // The fused post-norm's loads (NormArgs::x_gamma): h = x, rv = residual, all in flight
  // together; AddNormedResidual completes h once x's inverse RMS (inv_x) is known.
  template <bool kSum = false>
  __device__ __forceinline__ void LoadPreNorm(const NormArgs<T>& a, int64_t off,
                                              RegChunk<T> (&rv)[kChunks]) {
    LoadX<kSum>(a, off);
    Load(a.residual + off, rv);
  }

  // h = ((x * inv_x) * (weight_offset + x_gamma)) rounded to T (prism_rmsnorm's y as stored),
  // then h + rv rounded to T, written to a.h: the unfused post-norm and AddResidual's bits.
  __device__ __forceinline__ void AddNormedResidual(const NormArgs<T>& a, int64_t off,
                                                    const RegChunk<T> (&rv)[kChunks],
                                                    float inv_x) {
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      float w[kVec];
      LoadWeightsOf(a.x_gamma, a.weight_offset, j, w);
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        h[j].SetRounded(i, __fmul_rn(__fmul_rn(h[j].Get(i), inv_x), w[i]));
      }
    }
    AddResidual(a, off, rv);
  }

  // w = weight_offset + gamma for the slice's elements (NormChunk's second factor).
  __device__ __forceinline__ void LoadWeights(const NormArgs<T>& a,
                                              float (&w)[kChunks][kVec]) const {
#pragma unroll
    for (int j = 0; j < kChunks; ++j) LoadWeightsOf(a.gamma, a.weight_offset, j, w[j]);
  }

  // LoadRow without the weights (NormSplitRowsKernel's lean form): only h stays in registers
  // through the reduction, and YAmax / CodesFromH read gamma afterwards.
  template <bool kSum = false>
  __device__ __forceinline__ void LoadRowLean(const NormArgs<T>& a, int64_t off) {
    LoadX<kSum>(a, off);
    if (a.residual == nullptr) return;
    RegChunk<T> rv[kChunks];
    Load(a.residual + off, rv);
    AddResidual(a, off, rv);
  }

  // The lean form's passes after the reduction: y = (h * inv) * w as Normalize, with w =
  // weight_offset + gamma loaded chunk by chunk and y never held for the whole slice (the same
  // operations, recomputed for the codes). YAmax stores y when y_row is not null and returns
  // the slice's amax; CodesFromH writes the codes.
  __device__ __forceinline__ float YAmax(const NormArgs<T>& a, float inv, T* y_row) const {
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      float y[kVec];
      YOf(a, j, inv, y);
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        if (i < cnt[j]) amax = fmaxf(amax, fabsf(y[i]));
      }
      if (y_row != nullptr && cnt[j] > 0) StoreSliceChunk<kFull>(y_row + at[j], cnt[j], y);
    }
    return amax;
  }

  __device__ __forceinline__ void CodesFromH(const NormArgs<T>& a, float inv, int8_t* q_row,
                                             float qinv) const {
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      float y[kVec];
      YOf(a, j, inv, y);
      int8_t codes[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) codes[i] = QuantCode(y[i], qinv);
      if (cnt[j] > 0) prism::StoreCodes(q_row + at[j], cnt[j], codes);
    }
  }

  // acc plus the squares of the slice's elements, one at a time in increasing d: the
  // canonical partial continued over this slice (separate multiply and add, as the CPU).
  __device__ __forceinline__ float AddSquares(float acc) const {
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      if (kFull && cnt[j] == 0) continue;  // kFull: whole or absent, one test per chunk
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        if (kFull || i < cnt[j]) acc = __fadd_rn(acc, __fmul_rn(h[j].Get(i), h[j].Get(i)));
      }
    }
    return acc;
  }

  // y = (h * inv) * weight, as NormChunk; returns the slice's amax (only elements of the row).
  __device__ __forceinline__ float Normalize(float inv, const float (&w)[kChunks][kVec],
                                             float (&y)[kChunks][kVec]) const {
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        y[j][i] = __fmul_rn(__fmul_rn(h[j].Get(i), inv), w[j][i]);
        if (i < cnt[j]) amax = fmaxf(amax, fabsf(y[j][i]));
      }
    }
    return amax;
  }

  __device__ __forceinline__ void StoreY(T* y_row, const float (&y)[kChunks][kVec]) const {
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      if (cnt[j] > 0) StoreSliceChunk<kFull>(y_row + at[j], cnt[j], y[j]);
    }
  }

  __device__ __forceinline__ void StoreCodes(int8_t* q_row, const float (&y)[kChunks][kVec],
                                             float qinv) const {
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      int8_t codes[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) codes[i] = QuantCode(y[j][i], qinv);
      if (cnt[j] > 0) prism::StoreCodes(q_row + at[j], cnt[j], codes);
    }
  }

  // The second digit's remainders of y, in place (ChunkRemainders); the slice's max |r|.
  __device__ __forceinline__ float Remainders(float (&y)[kChunks][kVec], float qinv,
                                              float scale) const {
    float rmax = 0.0f;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) rmax = fmaxf(rmax, ChunkRemainders(y[j], cnt[j], qinv, scale));
    return rmax;
  }

  // The lean form's second digit, y recomputed chunk by chunk (YOf) as for its codes: the
  // remainders' max, then their codes.
  __device__ __forceinline__ float RemainderMax(const NormArgs<T>& a, float inv, float qinv,
                                                float scale) const {
    float rmax = 0.0f;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      float y[kVec];
      YOf(a, j, inv, y);
      rmax = fmaxf(rmax, ChunkRemainders(y, cnt[j], qinv, scale));
    }
    return rmax;
  }

  __device__ __forceinline__ void RemainderCodes(const NormArgs<T>& a, float inv, float qinv,
                                                 float scale, int8_t* q_row, float rinv) const {
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      float y[kVec];
      YOf(a, j, inv, y);
      ChunkRemainders(y, cnt[j], qinv, scale);
      int8_t codes[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) codes[i] = QuantCode(y[i], rinv);
      if (cnt[j] > 0) prism::StoreCodes(q_row + at[j], cnt[j], codes);
    }
  }

 private:
  __device__ __forceinline__ void YOf(const NormArgs<T>& a, int j, float inv,
                                      float (&y)[kVec]) const {
    float w[kVec];
    LoadWeightsOf(a.gamma, a.weight_offset, j, w);
#pragma unroll
    for (int i = 0; i < kVec; ++i) y[i] = __fmul_rn(__fmul_rn(h[j].Get(i), inv), w[i]);
  }

  __device__ __forceinline__ void LoadWeightsOf(const float* gamma, float offset, int j,
                                                float (&w)[kVec]) const {
    float g[kVec] = {};
    if constexpr (kFull) {
      LoadVec(gamma + at[j], g);
    } else if (cnt[j] > 0) {
      LoadChunk(gamma + at[j], cnt[j], g);
    }
#pragma unroll
    for (int i = 0; i < kVec; ++i) w[i] = __fadd_rn(offset, g[i]);
  }

  // h = x; kSum (a.x_hi and a.x_w2 set): x + (x_hi + x_w2) rounded to T, the partial
  // products' sum in Int8Linear's order (XLA's two adds, each rounded).
  template <bool kSum>
  __device__ __forceinline__ void LoadX(const NormArgs<T>& a, int64_t off) {
    Load(a.x + off, h);
    if constexpr (kSum) {
      RegChunk<T> hi[kChunks], w2[kChunks];
      Load(a.x_hi + off, hi);
      Load(a.x_w2 + off, w2);
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          const float small = RoundToStorage<T>(__fadd_rn(hi[j].Get(i), w2[j].Get(i)));
          h[j].SetRounded(i, __fadd_rn(h[j].Get(i), small));
        }
      }
    }
  }

  // h = h + rv rounded to T (as LoadH), written to a.h.
  __device__ __forceinline__ void AddResidual(const NormArgs<T>& a, int64_t off,
                                              const RegChunk<T> (&rv)[kChunks]) {
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) h[j].SetRounded(i, __fadd_rn(h[j].Get(i), rv[j].Get(i)));
    }
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      float v[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) v[i] = h[j].Get(i);
      if (cnt[j] > 0) StoreSliceChunk<kFull>(a.h + off + at[j], cnt[j], v);
    }
  }

  // Every present chunk of src's row into dst; absent ones +0 (kFull: the row's first chunk).
  __device__ __forceinline__ void Load(const T* src, RegChunk<T> (&dst)[kChunks]) const {
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      if constexpr (kFull) {
        dst[j].LoadFull(src + at[j]);
      } else if (cnt[j] > 0) {
        dst[j].Load(src + at[j], cnt[j]);
      } else {
        dst[j] = RegChunk<T>{};
      }
    }
  }
};

// Max over the warp (amax: exact, so any order).
__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

}  // namespace prism
