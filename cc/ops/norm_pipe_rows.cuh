// NormPipeRowsKernel: RMSNorm rows streamed through shared memory, for many rows (a long
// prefill) of whole, 16-byte-aligned chunks. The register kernels (norm_reg_rows.cuh,
// norm_split_rows.cuh) hold one row per warp or block: while its reduction chain, amax and
// stores run, that row's memory traffic is done and the next row's has not started, so at M =
// 4096 the SM's few resident rows leave DRAM idle between them. Here each warp of a persistent
// grid owns rows r = gw, gw + W, ... and copies row i + 1 (x, and residual when there is one)
// into its own shared-memory stage with cp.async while it computes row i, so DRAM reads of later
// rows overlap the arithmetic of the current one.
//
// Same bits as RegSlice: lane l's canonical chunks d0 = l * kVec + c * kStride in increasing c
// (the canonical partial's order), h = x or RoundToStorage(x + residual) (written to h, and
// back into the stage so later passes read it), the butterfly, InverseRms, y = (h * inv) *
// (weight_offset + gamma), the exact amax, QuantCode. y is recomputed for the codes pass rather
// than kept (a 5376-long row is 168 values per lane): the same operations on the same values.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/norm_args.cuh"
#include "cc/ops/norm_reg_slice.cuh"

namespace prism {

constexpr int kPipeStages = 2;             // rows per warp in shared memory: one computed, one
                                           // in flight
constexpr int kPipeMaxWarps = 4;           // warps per block
constexpr int64_t kPipeSmem = 220 << 10;   // dynamic shared memory per block at most (H200:
                                           // 227 KB)
// Rows from which the launcher takes this kernel unforced. Its first version (w read from
// global memory in each pass) was slower than the register kernels at M = 4096 on the H200
// (results/ops_h200_session8/), so until a measurement says otherwise it runs only when forced.
constexpr int64_t kPipeMinRows = int64_t{1} << 40;

// 16 bytes global -> shared, asynchronous (L2 only: a row is read once).
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// The warp copies n elements of src (n * sizeof(T) a multiple of 16, both 16-byte aligned).
template <typename T>
__device__ __forceinline__ void CopyRowAsync(T* dst, const T* src, int64_t n, int lane) {
  const int64_t bytes = n * static_cast<int64_t>(sizeof(T));
  const char* s = reinterpret_cast<const char*>(src);
  char* d = reinterpret_cast<char*>(dst);
  for (int64_t b = static_cast<int64_t>(lane) * 16; b < bytes; b += kWarpSize * 16) {
    CpAsync16(d + b, s + b);
  }
}

// A staged chunk as f32 (T's storage format in shared memory).
__device__ __forceinline__ void LoadStaged(const float* p, float (&v)[kVec]) { LoadVec(p, v); }
__device__ __forceinline__ void LoadStaged(const uint16_t* p, float (&v)[kVec]) {
  RegChunk<uint16_t> c;
  c.LoadFull(p);
#pragma unroll
  for (int i = 0; i < kVec; ++i) v[i] = c.Get(i);
}

// y = (h * inv) * w for the chunk at d0: h from the stage, w = weight_offset + gamma from the
// block's copy (read from global memory in every pass, gamma's loads were the kernel's stalls:
// L1 is what the stages leave of shared memory).
template <typename T>
__device__ __forceinline__ void PipeY(const T* hs, const float* ws, int64_t d0, float inv,
                                      float (&y)[kVec]) {
  float w[kVec];
  LoadStaged(hs + d0, y);
  LoadVec(ws + d0, w);
#pragma unroll
  for (int i = 0; i < kVec; ++i) y[i] = __fmul_rn(__fmul_rn(y[i], inv), w[i]);
}

// One staged row r (xs: x, then rs: residual when there is one), by one warp.
template <typename T>
__device__ __forceinline__ void PipeRow(const NormArgs<T>& a, int64_t r, T* xs, const T* rs,
                                        const float* ws, int lane) {
  const int64_t off = r * a.d;
  float acc = 0.0f;  // the lane's canonical partial
#pragma unroll 3
  for (int64_t d0 = static_cast<int64_t>(lane) * kVec; d0 < a.d; d0 += kStride) {
    float h[kVec];
    LoadStaged(xs + d0, h);
    if (rs != nullptr) {
      float rv[kVec];
      LoadStaged(rs + d0, rv);
#pragma unroll
      for (int i = 0; i < kVec; ++i) h[i] = RoundToStorage<T>(__fadd_rn(h[i], rv[i]));
      StoreVec(a.h + off + d0, h);
      StoreVec(xs + d0, h);  // exact: h is representable in T; later passes read it here
    }
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc = __fadd_rn(acc, __fmul_rn(h[i], h[i]));
  }
  const float inv = InverseRms(WarpButterflySum(acc), a.d, a.eps);
  float amax = 0.0f;
#pragma unroll 3
  for (int64_t d0 = static_cast<int64_t>(lane) * kVec; d0 < a.d; d0 += kStride) {
    float y[kVec];
    PipeY(xs, ws, d0, inv, y);
#pragma unroll
    for (int i = 0; i < kVec; ++i) amax = fmaxf(amax, fabsf(y[i]));
    if (a.y != nullptr) StoreVec(a.y + off + d0, y);
  }
  if (a.q == nullptr) return;
  amax = WarpMax(amax);
  const float qinv = QuantInverse(amax);
#pragma unroll 3
  for (int64_t d0 = static_cast<int64_t>(lane) * kVec; d0 < a.d; d0 += kStride) {
    float y[kVec];
    PipeY(xs, ws, d0, inv, y);
    int8_t codes[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) codes[i] = QuantCode(y[i], qinv);
    StoreCodes(a.q + off + d0, kVec, codes);
  }
  if (lane == 0) a.s[r] = QuantScale(amax);
}

// Elements of one stage: the row's x, then its residual when there is one.
template <typename T>
__host__ __device__ __forceinline__ int64_t PipeStageElems(const NormArgs<T>& a) {
  return a.d * (a.residual != nullptr ? 2 : 1);
}

template <typename T>
__global__ void __launch_bounds__(kPipeMaxWarps * kWarpSize)
    NormPipeRowsKernel(NormArgs<T> a, int64_t m) {
  extern __shared__ float4 stage4[];  // w [D] f32, then [warps][kPipeStages][stage elems] of T
  const int warps = static_cast<int>(blockDim.x / kWarpSize);
  const int warp = static_cast<int>(threadIdx.x / kWarpSize);
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const int64_t stage = PipeStageElems(a);
  float* ws = reinterpret_cast<float*>(stage4);
  for (int64_t d = threadIdx.x; d < a.d; d += blockDim.x) {
    ws[d] = __fadd_rn(a.weight_offset, a.gamma[d]);  // NormChunk's second factor
  }
  __syncthreads();  // the only block barrier: warps are independent after it
  T* mine = reinterpret_cast<T*>(ws + a.d) + static_cast<int64_t>(warp) * kPipeStages * stage;
  const int64_t step = static_cast<int64_t>(gridDim.x) * warps;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * warps + warp;
  auto issue = [&](int64_t r, int64_t i) {  // row r into stage i % kPipeStages, one group
    if (r < m) {
      T* s = mine + (i % kPipeStages) * stage;
      CopyRowAsync(s, a.x + r * a.d, a.d, lane);
      if (a.residual != nullptr) CopyRowAsync(s + a.d, a.residual + r * a.d, a.d, lane);
    }
    CpAsyncCommit();  // every call commits a group (maybe empty): wait_group counts them
  };
#pragma unroll
  for (int i = 0; i < kPipeStages - 1; ++i) issue(r0 + i * step, i);
  int64_t i = 0;
  for (int64_t r = r0; r < m; r += step, ++i) {
    issue(r + (kPipeStages - 1) * step, i + kPipeStages - 1);
    CpAsyncWait<kPipeStages - 1>();  // row i's group has landed (this lane's copies)
    __syncwarp();                    // ... and every lane's
    T* s = mine + (i % kPipeStages) * stage;
    PipeRow(a, r, s, a.residual != nullptr ? s + a.d : nullptr, ws, lane);
    __syncwarp();  // the stage is read out before an issue refills it
  }
  CpAsyncWait<0>();  // no copy outlives the kernel
}

// Whether the pipe kernel takes these rows: whole aligned chunks (cp.async moves 16 bytes) and
// one warp's stages within the block budget.
template <typename T>
bool PipeFits(const NormArgs<T>& a) {
  const int64_t warp_bytes = kPipeStages * PipeStageElems(a) * static_cast<int64_t>(sizeof(T));
  return FullChunks(a) && a.d * 4 + warp_bytes <= kPipeSmem;
}

// Persistent grid: as many blocks as fit on the device at once, none beyond the rows' need.
template <typename T>
ffi::Error LaunchPipeRows(cudaStream_t stream, int64_t m, const NormArgs<T>& a, const char* op) {
  const int64_t warp_bytes = kPipeStages * PipeStageElems(a) * static_cast<int64_t>(sizeof(T));
  const int64_t w_bytes = a.d * static_cast<int64_t>(sizeof(float));
  const int warps =
      static_cast<int>(std::min<int64_t>(kPipeMaxWarps, (kPipeSmem - w_bytes) / warp_bytes));
  const size_t smem = static_cast<size_t>(w_bytes + warps * warp_bytes);
  const auto kernel = NormPipeRowsKernel<T>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem));
  int device = 0, sms = 0, per_sm = 0;
  if (e == cudaSuccess) e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess) {
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, warps * kWarpSize, smem);
  }
  if (e != cudaSuccess || per_sm < 1) {
    cudaGetLastError();  // clear it: nothing was launched
    return ffi::Error::Internal(std::string(op) + ": no launch for the pipelined kernel (" +
                                std::to_string(smem) + " bytes of shared memory): " +
                                cudaGetErrorString(e));
  }
  const int64_t grid = std::min<int64_t>(CeilDiv(m, warps), static_cast<int64_t>(sms) * per_sm);
  kernel<<<static_cast<unsigned>(grid), warps * kWarpSize, smem, stream>>>(a, m);
  return LaunchStatus(op);
}

}  // namespace prism
