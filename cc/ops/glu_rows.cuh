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
