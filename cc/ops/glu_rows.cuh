// The gated activation's row passes on CUDA, shared by prism_glu_quant and prism_glu_quant2
// (one block per row; thread t holds the kVec-element chunks first + k * stride of the row).
// Both ops' first digit must have the same bits, so both compute a from this one definition.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cc/cuda_common.cuh"
#include "cc/numerics.h"

namespace prism {

// v = Activate(gate) * up for the chunk at i0 (cnt valid elements).
template <typename T>
__device__ __forceinline__ void GatedChunk(const T* gate, const T* up, Activation act,
                                           int64_t i0, int cnt, float (&v)[kVec]) {
  float u[kVec];
  LoadChunk(gate + i0, cnt, v);
  LoadChunk(up + i0, cnt, u);
#pragma unroll
  for (int i = 0; i < kVec; ++i) v[i] = __fmul_rn(Activate(act, v[i]), u[i]);
}

// A row of prism_glu_quant2's input given as partial sums (glu_quant.h, GluParts): p0 is the
// row, p1 and p2 the optional partials (nullptr: absent) added as p0 + (p1 + p2).
struct PartRow {
  const float *p0, *p1, *p2;
};

// The chunk at i0 of a PartRow, summed in GluParts' order.
__device__ __forceinline__ void SumChunk(const PartRow& r, int64_t i0, int cnt,
                                         float (&v)[kVec]) {
  LoadChunk(r.p0 + i0, cnt, v);
  if (r.p1 == nullptr && r.p2 == nullptr) return;  // uniform
  float s[kVec];
  LoadChunk((r.p1 != nullptr ? r.p1 : r.p2) + i0, cnt, s);
  if (r.p1 != nullptr && r.p2 != nullptr) {
    float t[kVec];
    LoadChunk(r.p2 + i0, cnt, t);
#pragma unroll
    for (int i = 0; i < kVec; ++i) s[i] = __fadd_rn(s[i], t[i]);
  }
#pragma unroll
  for (int i = 0; i < kVec; ++i) v[i] = __fadd_rn(v[i], s[i]);
}

// v = Activate(gate) * up for the chunk at i0, gate and up given as partial sums.
__device__ __forceinline__ void GatedPartsChunk(const PartRow& gate, const PartRow& up,
                                                Activation act, int64_t i0, int cnt,
                                                float (&v)[kVec]) {
  float u[kVec];
  SumChunk(gate, i0, cnt, v);
  SumChunk(up, i0, cnt, u);
#pragma unroll
  for (int i = 0; i < kVec; ++i) v[i] = __fmul_rn(Activate(act, v[i]), u[i]);
}

// This thread's max |a| over its chunks of [first, end); a max is exact in any order, so the
// block's max does not depend on the block width.
template <typename T>
__device__ __forceinline__ float GatedAmax(const T* gate, const T* up, Activation act,
                                           int64_t first, int64_t end, int64_t stride) {
  float v[kVec];
  float amax = 0.0f;
  for (int64_t i0 = first; i0 < end; i0 += stride) {
    const int cnt = ChunkCount(i0, end);
    GatedChunk(gate, up, act, i0, cnt, v);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {  // unrolled: keeps v in registers
      if (i < cnt) amax = fmaxf(amax, fabsf(v[i]));
    }
  }
  return amax;
}

}  // namespace prism
