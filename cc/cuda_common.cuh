// Device helpers shared by the CUDA handlers: chunked loads and stores, the canonical warp sum of
// numerics.h, a block max, and the launch check. Included only by .cu files.
//
// A "chunk" is the kVec consecutive elements one lane owns in the canonical order: lane l of a
// warp owns chunks d0 = l * kVec + i * kStride. Only the first `cnt` elements of a chunk exist
// (the row's tail); the rest are never summed or stored.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cc/common.h"
#include "cc/numerics.h"

namespace prism {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// The same bits as the CPU's std::numeric_limits<float>::quiet_NaN() and -infinity.
__device__ __forceinline__ float QuietNaN() { return __int_as_float(0x7fc00000); }
__device__ __forceinline__ float NegInf() { return __int_as_float(0xff800000); }

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Reports a failed launch (bad configuration, missing kernel image) as an FFI error. Launches
// are asynchronous, so this never waits on the stream (command-buffer compatible).
inline ffi::Error LaunchStatus(const char* op) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return ffi::Error::Success();
  return ffi::Error::Internal(std::string(op) + ": CUDA launch failed: " + cudaGetErrorString(e));
}

// CopyUnlessAliased (common.h) on the handler's stream.
template <typename In, typename Out>
ffi::Error CopyUnlessAliasedAsync(cudaStream_t stream, const In& in, Out& out, const char* op) {
  if (out->untyped_data() != in.untyped_data() && in.size_bytes() > 0) {
    const cudaError_t e = cudaMemcpyAsync(out->untyped_data(), in.untyped_data(), in.size_bytes(),
                                          cudaMemcpyDeviceToDevice, stream);
    PRISM_REQUIRE(e == cudaSuccess, std::string(op) + ": pool copy failed");
  }
  return ffi::Error::Success();
}

__device__ __forceinline__ bool Aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// Loads p[0, cnt) as f32 into v (v[i] = 0 for i >= cnt). Full, 16-byte-aligned chunks take one
// vector load for bf16 (8 x 2 B) or two for f32; anything else falls back to scalar loads.
__device__ __forceinline__ void LoadChunk(const uint16_t* p, int cnt, float (&v)[kVec]) {
  if (cnt == kVec && Aligned16(p)) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // little-endian: element 2i is the low half
      v[2 * i] = Bf16ToF32(static_cast<uint16_t>(w[i] & 0xffffu));
      v[2 * i + 1] = Bf16ToF32(static_cast<uint16_t>(w[i] >> 16));
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < kVec; ++i) v[i] = i < cnt ? Bf16ToF32(p[i]) : 0.0f;
}

__device__ __forceinline__ void LoadChunk(const float* p, int cnt, float (&v)[kVec]) {
  if (cnt == kVec && Aligned16(p)) {
    const float4 a = reinterpret_cast<const float4*>(p)[0];
    const float4 b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    return;
  }
#pragma unroll
  for (int i = 0; i < kVec; ++i) v[i] = i < cnt ? p[i] : 0.0f;
}

// Stores v[0, cnt) to p in T's storage format (FromF32: the CPU's rounding).
template <typename T>
__device__ __forceinline__ void StoreChunk(T* p, int cnt, const float (&v)[kVec]) {
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    if (i < cnt) FromF32(v[i], p + i);
  }
}

// INT8 codes: one 8-byte store for a full, 8-byte-aligned chunk.
__device__ __forceinline__ void StoreCodes(int8_t* p, int cnt, const int8_t (&q)[kVec]) {
  if (cnt == kVec && (reinterpret_cast<uintptr_t>(p) & 7u) == 0) {
    uint32_t w[2] = {0u, 0u};
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      w[i / 4] |= static_cast<uint32_t>(static_cast<uint8_t>(q[i])) << (8 * (i % 4));
    }
    *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
    return;
  }
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    if (i < cnt) p[i] = q[i];
  }
}

// Elements left in the chunk starting at d0 of a row of n.
__device__ __forceinline__ int ChunkCount(int64_t d0, int64_t n) {
  return n - d0 < kVec ? static_cast<int>(n - d0) : kVec;
}

// The butterfly of the canonical order. Float addition is commutative, so every lane ends with
// the CPU's lane[0]. __fadd_rn keeps the adds exact-IEEE whatever the -fmad setting.
__device__ __forceinline__ float WarpButterflySum(float v) {
#pragma unroll
  for (int off = kWarpSize / 2; off > 0; off /= 2) {
    v = __fadd_rn(v, __shfl_xor_sync(kFullMask, v, off));
  }
  return v;
}

// Canonical sum over [0, n) by one whole warp (all 32 lanes must call it). chunk(d0, cnt, t)
// fills t[0, cnt) with the terms of elements d0 .. d0 + cnt - 1; the lane adds them in
// increasing d, then the butterfly combines lanes. Equals CanonicalSumHost bit for bit.
// kSumUnroll chunks are fetched before any is added, so their loads are in flight together
// (one chunk per round trip made a 5376-long row cost ~20 round trips of latency).
constexpr int kSumUnroll = 4;

template <typename ChunkFn>
__device__ __forceinline__ float WarpCanonicalSum(int64_t n, int lane, ChunkFn chunk) {
  float acc = 0.0f;
  for (int64_t base = static_cast<int64_t>(lane) * kVec; base < n;
       base += kSumUnroll * kStride) {
    float t[kSumUnroll][kVec];
    int cnt[kSumUnroll];
#pragma unroll
    for (int u = 0; u < kSumUnroll; ++u) {
      const int64_t d0 = base + u * kStride;
      cnt[u] = d0 < n ? ChunkCount(d0, n) : 0;
      if (cnt[u] > 0) chunk(d0, cnt[u], t[u]);
    }
#pragma unroll
    for (int u = 0; u < kSumUnroll; ++u) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        if (i < cnt[u]) acc = __fadd_rn(acc, t[u][i]);
      }
    }
  }
  return WarpButterflySum(acc);
}

// Max over the block of non-negative values (amax): exact, so any order gives the same bits.
// scratch holds one float per warp (up to 32); call at most once per scratch array per kernel.
// blockDim.x must be a multiple of 32.
__device__ __forceinline__ float BlockMax(float v, float* scratch) {
#pragma unroll
  for (int off = kWarpSize / 2; off > 0; off /= 2) {
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, off));
  }
  if (threadIdx.x % kWarpSize == 0) scratch[threadIdx.x / kWarpSize] = v;
  __syncthreads();
  float m = scratch[0];
  for (unsigned w = 1; w < blockDim.x / kWarpSize; ++w) m = fmaxf(m, scratch[w]);
  return m;
}

// SMs of the current device, queried once per process (one device kind per process).
inline int64_t DeviceSmCount() {
  static const int64_t count = [] {
    int device = 0, sms = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    return static_cast<int64_t>(sms > 0 ? sms : 1);
  }();
  return count;
}

// Threads for a one-block-per-row kernel over m rows of n. Few rows are latency-bound: spread
// each row as widely as a block allows (one chunk per thread, up to 1024). Many rows: 256, so
// several blocks share an SM and hide each other's serial phases. Results never depend on it.
inline int RowBlockThreads(int64_t m, int64_t n) {
  constexpr int64_t kManyRows = 512;
  if (m >= kManyRows) return 256;
  const int64_t warps = ((n + kVec - 1) / kVec + kWarpSize - 1) / kWarpSize;
  return static_cast<int>(warps < 1 ? kWarpSize : (warps > 32 ? 1024 : warps * kWarpSize));
}

}  // namespace prism
