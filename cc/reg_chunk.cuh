// One kVec-element chunk of a row in registers in its storage format, and whole-chunk vector
// loads and stores: shared by the register RMSNorm kernels (norm_reg_slice.cuh) and the
// candidate head's row kernel (candidate_head_cuda.cu), which keep many chunks in flight and
// so hold bf16 chunks packed (two per register) until each value is used.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cc/cuda_common.cuh"
#include "cc/numerics.h"

namespace prism {

// Full, 16-byte-aligned chunks (kFull rows): unconditional vector accesses. No branch or
// select waits on a load, so all of a phase's loads are in flight together (a guarded load
// whose result is merged at a join stalls there: one round trip per chunk).
__device__ __forceinline__ void LoadVec(const float* p, float (&v)[kVec]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0];
  const float4 b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
  v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

__device__ __forceinline__ void StoreVec(float* p, const float (&v)[kVec]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

__device__ __forceinline__ void StoreVec(uint16_t* p, const float (&v)[kVec]) {
  uint32_t w[kVec / 2];
#pragma unroll
  for (int i = 0; i < kVec / 2; ++i) {  // FromF32's rounding; element 2i in the low half
    w[i] = static_cast<uint32_t>(F32ToBf16(v[2 * i])) |
           (static_cast<uint32_t>(F32ToBf16(v[2 * i + 1])) << 16);
  }
  *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
}

// One chunk of h in registers in T's storage format (bf16: two per register, so a row's h takes
// half the registers until y replaces it). Elements past the row's end hold +0.
template <typename T>
struct RegChunk;

template <>
struct RegChunk<float> {
  float v[kVec];
  __device__ __forceinline__ void Load(const float* p, int cnt) { LoadChunk(p, cnt, v); }
  __device__ __forceinline__ void LoadFull(const float* p) { LoadVec(p, v); }
  __device__ __forceinline__ float Get(int i) const { return v[i]; }
  __device__ __forceinline__ void SetRounded(int i, float f) { v[i] = f; }  // f32: exact
};

template <>
struct RegChunk<uint16_t> {
  uint32_t w[kVec / 2];  // little-endian pairs: element 2i is the low half, as in LoadChunk
  __device__ __forceinline__ void Load(const uint16_t* p, int cnt) {
    if (cnt == kVec && Aligned16(p)) return LoadFull(p);
#pragma unroll
    for (int i = 0; i < kVec / 2; ++i) {
      const uint32_t lo = 2 * i < cnt ? p[2 * i] : 0u, hi = 2 * i + 1 < cnt ? p[2 * i + 1] : 0u;
      w[i] = lo | (hi << 16);
    }
  }
  __device__ __forceinline__ void LoadFull(const uint16_t* p) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    w[0] = u.x, w[1] = u.y, w[2] = u.z, w[3] = u.w;
  }
  __device__ __forceinline__ float Get(int i) const {
    return Bf16ToF32(static_cast<uint16_t>(w[i / 2] >> (16 * (i % 2))));
  }
  // Stores f rounded to bf16 (F32ToBf16, so Get returns RoundToStorage<uint16_t>(f)).
  __device__ __forceinline__ void SetRounded(int i, float f) {
    const uint32_t b = F32ToBf16(f), shift = 16 * (i % 2);
    w[i / 2] = (w[i / 2] & ~(0xffffu << shift)) | (b << shift);
  }
};

}  // namespace prism
