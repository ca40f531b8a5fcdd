// The row-quantisation kernel on CUDA, shared by prism_glu_quant, prism_glu_quant2,
// prism_glu_quant2_sum and prism_quantize_rows (one block per row; thread t holds the
// kVec-element chunks first + k * stride of the row). A row source gives the values a to
// quantise: the gated activations compute a = Activate(gate) * up with GatedChunk, so
// glu_quant's codes and glu_quant2's first digit have the same bits; PlainRows reads a as it
// is. They differ only in that source and in whether a second digit follows.
//
// Passes, each over the thread's own chunks: 1. a and the row's amax (exact in any order, so
// the block width never matters); 2. the codes (two digits: the first digit, then the
// remainder a - q1 * s1 and its max); 3. (two digits) the remainder's codes. When F floats fit
// in shared memory (GluRowsLaunch), pass 1 keeps a there and pass 2 overwrites it with the
// remainders, so every input is read once; longer rows recompute a from the inputs in each
// pass (the same operations on the same inputs: the same bits).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cc/common.h"
#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/glu_quant.h"

namespace prism {

constexpr int kGluMaxThreads = 1024;
constexpr int64_t kGluMaxCachedBytes = 200 << 10;  // under the H200's 227 KB per block
// Each row source below names kBlocksPerSm, the blocks an SM must hold, and kMaxThreads, the
// widest block (GluRowsKernel's __launch_bounds__). The pair and plain rows: two blocks of
// 1024, at most 32 registers a thread. Without the bound the kernel took 41, so one 1024-thread
// block filled an SM's registers and the 27B's F = 21504 rows (86 KB of shared memory each,
// two fit) ran one row per SM (Nsight Compute, results/ops_h200_session15/). SumRows spills
// ~0.5 KB a thread at 32 registers (three loads a chunk; at 768 threads and 40 registers, 0.2
// KB, and it ran slower than one block of 1024), so it takes two blocks of 512 threads (64
// registers, no spill) when the rows outnumber the SMs, and WideSumRows (one block of 1024)
// when every row gets an SM of its own. H200, F = 21504, kernel µs, one 1024-thread block ->
// two of 512 (results/e2e_h200_session17/): M = 256 59.4 -> 56.9, 448 101.6 -> 98.7, 4096
// 738.9 -> 687.5; but the 4K follow-up's M = 32 rows went 1.22 -> 1.46 ms a step (62 calls).

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

// Row source of glu_quant(2): gate_up [M, 2F] of T, row r is gate then up.
template <typename T>
struct PairRows {
  static constexpr int kBlocksPerSm = 2, kMaxThreads = kGluMaxThreads;
  const T* __restrict__ gate_up;
  int64_t m, f;
  __device__ __forceinline__ void Gated(int64_t r, Activation act, int64_t i0, int cnt,
                                        float (&v)[kVec]) const {
    const T* gate = gate_up + r * 2 * f;
    GatedChunk(gate, gate + f, act, i0, cnt, v);
  }
};

// Row source of glu_quant2_sum: gate_up = y2[r] + (y2[M + r] + yw2[r]), the two-digit
// projection's partial products (x1 W1, x2 W1, x1 W2) added in Int8Linear's order, each add
// rounded; f32 only (the int8 GEMM's outputs).
struct SumRows {
  static constexpr int kBlocksPerSm = 2, kMaxThreads = 512;
  const float* __restrict__ y2;   // [2M, 2F]
  const float* __restrict__ yw2;  // [M, 2F]
  int64_t m, f;

  __device__ __forceinline__ static void Sum(const float* a, const float* b, const float* c,
                                             int64_t i0, int cnt, float (&v)[kVec]) {
    float u[kVec], w[kVec];
    LoadChunk(a + i0, cnt, v);
    LoadChunk(b + i0, cnt, u);
    LoadChunk(c + i0, cnt, w);
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = __fadd_rn(v[i], __fadd_rn(u[i], w[i]));
  }
  __device__ __forceinline__ void Gated(int64_t r, Activation act, int64_t i0, int cnt,
                                        float (&v)[kVec]) const {
    const float* x1 = y2 + r * 2 * f;
    const float* x2 = y2 + (m + r) * 2 * f;
    const float* w2 = yw2 + r * 2 * f;
    float u[kVec];
    Sum(x1, x2, w2, i0, cnt, v);              // gate
    Sum(x1 + f, x2 + f, w2 + f, i0, cnt, u);  // up
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = __fmul_rn(Activate(act, v[i]), u[i]);
  }
};

// SumRows for at most one row an SM: one wide block a row (half the chunks a thread).
struct WideSumRows : SumRows {
  static constexpr int kBlocksPerSm = 1, kMaxThreads = kGluMaxThreads;
};

// Row source of quantize_rows: the rows themselves, f32 [M, D] (f == D; act unused).
struct PlainRows {
  static constexpr int kBlocksPerSm = 2, kMaxThreads = kGluMaxThreads;
  const float* __restrict__ y;
  int64_t m, f;
  __device__ __forceinline__ void Gated(int64_t r, Activation, int64_t i0, int cnt,
                                        float (&v)[kVec]) const {
    LoadChunk(y + r * f + i0, cnt, v);
  }
};

// Outputs: codes and scales of the first digit; of the second when q2 is not null.
struct GluOut {
  int8_t* __restrict__ q1;
  float* __restrict__ s1;
  int8_t* __restrict__ q2;
  float* __restrict__ s2;
};

// The chunk's first-digit codes, and v overwritten by the remainders.
__device__ __forceinline__ void FirstDigit(float (&v)[kVec], float inv, float scale,
                                           int8_t (&codes)[kVec]) {
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    codes[i] = QuantCode(v[i], inv);
    v[i] = QuantRemainder(v[i], codes[i], scale);
  }
}

// A thread's chunk of the cached row: two float4s when whole (i0 % kVec == 0 and the dynamic
// shared memory is 16-byte aligned), which halves the bank conflicts of scalar accesses.
static_assert(kVec == 8, "LoadCached / StoreCached move a chunk as two float4s");
__device__ __forceinline__ void LoadCached(const float* row, int64_t i0, int cnt,
                                           float (&v)[kVec]) {
  if (cnt == kVec) {
    const float4 a = reinterpret_cast<const float4*>(row + i0)[0];
    const float4 b = reinterpret_cast<const float4*>(row + i0)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    return;
  }
#pragma unroll
  for (int i = 0; i < kVec; ++i) v[i] = i < cnt ? row[i0 + i] : 0.0f;
}

__device__ __forceinline__ void StoreCached(float* row, int64_t i0, int cnt,
                                            const float (&v)[kVec]) {
  if (cnt == kVec) {
    reinterpret_cast<float4*>(row + i0)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(row + i0)[1] = make_float4(v[4], v[5], v[6], v[7]);
    return;
  }
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    if (i < cnt) row[i0 + i] = v[i];
  }
}

__device__ __forceinline__ float ChunkMax(float m, const float (&v)[kVec], int cnt) {
#pragma unroll
  for (int i = 0; i < kVec; ++i) {  // unrolled: keeps v in registers
    if (i < cnt) m = fmaxf(m, fabsf(v[i]));
  }
  return m;
}

// The passes at the top of this file for row blockIdx.x; each thread only ever touches its
// own chunks of the cache.
template <typename Src, bool kTwo>
__global__ void __launch_bounds__(Src::kMaxThreads, Src::kBlocksPerSm)
    GluRowsKernel(Src src, GluOut out, Activation act, bool cached) {
  extern __shared__ float4 cache4[];  // [F] floats when cached (float4: 16-byte aligned)
  float* cache = reinterpret_cast<float*>(cache4);
  __shared__ float scratch1[kGluMaxThreads / kWarpSize], scratch2[kGluMaxThreads / kWarpSize];
  const int64_t r = blockIdx.x, stride = static_cast<int64_t>(blockDim.x) * kVec;
  const int64_t o = r * src.f, first = static_cast<int64_t>(threadIdx.x) * kVec, end = src.f;
  float v[kVec];
  int8_t codes[kVec];
  float amax = 0.0f;
#pragma unroll 2  // two chunks' loads in flight before either's activation
  for (int64_t i0 = first; i0 < end; i0 += stride) {
    const int cnt = ChunkCount(i0, end);
    src.Gated(r, act, i0, cnt, v);
    if (cached) StoreCached(cache, i0, cnt, v);
    amax = ChunkMax(amax, v, cnt);
  }
  amax = BlockMax(amax, scratch1);
  const float inv = QuantInverse(amax), scale = QuantScale(amax);
  float rmax = 0.0f;
  for (int64_t i0 = first; i0 < end; i0 += stride) {
    const int cnt = ChunkCount(i0, end);
    if (cached) {
      LoadCached(cache, i0, cnt, v);
    } else {
      src.Gated(r, act, i0, cnt, v);
    }
    if constexpr (kTwo) {
      FirstDigit(v, inv, scale, codes);
      if (cached) StoreCached(cache, i0, cnt, v);
      rmax = ChunkMax(rmax, v, cnt);
    } else {
#pragma unroll
      for (int i = 0; i < kVec; ++i) codes[i] = QuantCode(v[i], inv);
    }
    StoreCodes(out.q1 + o + i0, cnt, codes);
  }
  if (threadIdx.x == 0) out.s1[r] = scale;
  if constexpr (kTwo) {
    rmax = BlockMax(rmax, scratch2);
    const float rinv = QuantInverse(rmax);
    for (int64_t i0 = first; i0 < end; i0 += stride) {
      const int cnt = ChunkCount(i0, end);
      if (cached) {
        LoadCached(cache, i0, cnt, v);  // the remainders pass 2 left
      } else {
        src.Gated(r, act, i0, cnt, v);
        FirstDigit(v, inv, scale, codes);
      }
#pragma unroll
      for (int i = 0; i < kVec; ++i) codes[i] = QuantCode(v[i], rinv);
      StoreCodes(out.q2 + o + i0, cnt, codes);
    }
    if (threadIdx.x == 0) out.s2[r] = QuantScale(rmax);
  }
}

// Threads of a cached row's block. Few rows (latency-bound): one chunk per thread. Many rows:
// as many threads as leave the SM's 2048 to the blocks its shared memory holds (227 KB over
// F floats per row), at least 256, so the 27B's F = 21504 (two blocks per SM) keeps 1024
// threads while its D = 5376 rows (quantize_digits) take 256 and eight rows fit on an SM, not
// three (672 threads each: 0.7 TB/s at M = 4096 on the H200, results/ops_h200_session8/).
inline int CachedRowThreads(int64_t m, int64_t f) {
  constexpr int64_t kManyRows = 512, kSmemPerSm = 227 << 10, kThreadsPerSm = 2048;
  const int wide = RowBlockThreads(1, f);
  if (m < kManyRows) return wide;
  const int64_t per_sm = std::max<int64_t>(1, kSmemPerSm / std::max<int64_t>(f * 4, 1));
  const int64_t fill = kThreadsPerSm / per_sm / kWarpSize * kWarpSize;
  return static_cast<int>(std::min<int64_t>(wide, std::max<int64_t>(256, fill)));
}

// Launches GluRowsKernel over src.m rows. A cached row takes F floats of dynamic shared memory
// (CachedRowThreads sets the block's width); uncached rows take RowBlockThreads' width.
template <typename Src, bool kTwo>
ffi::Error GluRowsLaunch(cudaStream_t stream, const Src& src, const GluOut& out, Activation act,
                         const std::string& op) {
  if (src.m == 0) return ffi::Error::Success();
  PRISM_REQUIRE(src.m <= 0x7fffffff, op + ": too many rows for one grid");
  // PRISM_GLU_CACHE=off makes every row recompute a (tests compare both paths bitwise on
  // short rows; benchmarks time them); unset or "on" caches rows that fit.
  bool allowed = true;
  PRISM_RETURN_IF_ERROR(EnvSwitch("PRISM_GLU_CACHE", true, op, &allowed));
  const int64_t bytes = src.f * static_cast<int64_t>(sizeof(float));
  const bool cached = allowed && bytes <= kGluMaxCachedBytes;
  const size_t smem = cached ? static_cast<size_t>(bytes) : 0;
  if (smem > 48 * 1024) {  // above the default cap: opt in (not a stream operation)
    const cudaError_t e = cudaFuncSetAttribute(GluRowsKernel<Src, kTwo>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem));
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear it: nothing was launched
      return ffi::Error::Internal(op + ": shared memory for F = " + std::to_string(src.f) +
                                  ": " + cudaGetErrorString(e));
    }
  }
  if constexpr (Src::kBlocksPerSm > 1) {  // the largest carveout: two 86 KB rows share an SM
    static const cudaError_t carved = cudaFuncSetAttribute(  // a hint, once per kernel
        GluRowsKernel<Src, kTwo>, cudaFuncAttributePreferredSharedMemoryCarveout,
        cudaSharedmemCarveoutMaxShared);
    (void)carved;
  }
  static_assert(Src::kMaxThreads <= kGluMaxThreads && Src::kMaxThreads % kWarpSize == 0,
                "a row source's widest block is whole warps within the scratch arrays");
  const int threads = std::min(
      Src::kMaxThreads, cached ? CachedRowThreads(src.m, src.f) : RowBlockThreads(src.m, src.f));
  GluRowsKernel<Src, kTwo>
      <<<static_cast<unsigned>(src.m), threads, smem, stream>>>(src, out, act, cached);
  return LaunchStatus(op.c_str());
}

}  // namespace prism
