// NormRingRowsKernel: RMSNorm (+ quantisation) of many rows without a residual, one warp a row,
// each row brought into shared memory by one TMA bulk copy issued a row ahead. The register
// kernels (norm_reg_rows.cuh, norm_split_rows.cuh) hold a row in registers from its loads to
// its last store, so an SM has only its resident rows' loads in flight and waits out every
// row's serial phases (sum, butterfly, amax, codes) with nothing loading: at M = 4096, D = 5376
// (f32, H200) rmsnorm_quant ran at 52 % of copy bandwidth (results/e2e_h200_session17/). Here
// each warp owns kRingSlots row slots: while it computes row k from one slot, the copy of its
// row k + 1 is already in flight into the other, so the memory system always has a row per warp
// to move. The grid is persistent (at most one block an SM, as many warps as the slots fit in
// shared memory); warp w of block b takes rows b * W + w, + G * W, ... (G blocks of W warps).
//
// Same bits as NormRegRowsKernel (one warp per row), operation by operation: lane l's canonical
// partial adds the squares of its chunks l * kVec + c * kStride in increasing c (separate
// multiply and add), the butterfly sums the lanes, y = (h * inv) * (weight_offset + gamma),
// codes and the second digit's remainders from the same y. y is recomputed from the slot for
// each pass instead of being held (the same operations on the same values). Only rows of whole,
// 16-byte-aligned chunks take it (FullChunks), so a chunk is whole or absent.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cc/common.h"
#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/norm_args.cuh"
#include "cc/ops/norm_reg_rows.cuh"
#include "cc/ops/tma_pipeline.cuh"
#include "cc/reg_chunk.cuh"

namespace prism {

constexpr int kRingSlots = 2;      // row slots per warp: one being computed, one loading
constexpr int kRingMaxWarps = 8;   // warps (rows in flight) per block
constexpr int kRingChunks = kMaxRegChunks;  // chunks per lane: rows of D <= 5376
constexpr int64_t kRingRows = 1024;  // rows from which the launcher takes it

// One bulk copy of `bytes` (a multiple of 16, both addresses 16-byte aligned) from global
// memory into shared memory, completing on bar.
__device__ __forceinline__ void BulkLoad(void* dst, const void* src, uint32_t bytes,
                                         uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
      ::"r"(SmemAddr(dst)), "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(SmemAddr(bar))
      : "memory");
}

// Orders this thread's earlier shared-memory accesses before later async-proxy (TMA) ones.
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// The dynamic shared memory of a block of `warps`: w = weight_offset + gamma [D] f32 (gamma
// bulk-copied, then offset in place), the barriers (each warp's slots', then gamma's), then
// each warp's slots.
struct RingLayout {
  int64_t w_bytes, bar_bytes, row_bytes;
  __host__ __device__ RingLayout(int64_t d, int64_t elem) {
    w_bytes = (d * 4 + 127) / 128 * 128;
    bar_bytes = 256;  // kRingMaxWarps * kRingSlots + 1 8-byte barriers
    row_bytes = (d * elem + 127) / 128 * 128;
  }
  __host__ __device__ int64_t Bytes(int warps) const {
    return w_bytes + bar_bytes + warps * kRingSlots * row_bytes;
  }
};
static_assert((kRingMaxWarps * kRingSlots + 1) * 8 <= 256, "RingLayout's barrier bytes");

// The lane's chunk c of the staged row: its h (zeros when the chunk is absent: the lane's
// canonical partial adds +0 for them, which leaves it unchanged, and their y is +0, which no
// maximum takes) and its y, as NormRegRowsKernel computes them. Absent chunks read the row's
// first chunk (staged, never used), so every load is unconditional and no pass branches per
// chunk: the compiler can issue a pass's shared-memory loads ahead of their arithmetic.
template <typename T>
__device__ __forceinline__ void RingH(const T* row, int64_t d0, bool present, float (&h)[kVec]) {
  RegChunk<T> c;
  c.LoadFull(row + (present ? d0 : 0));
#pragma unroll
  for (int i = 0; i < kVec; ++i) h[i] = present ? c.Get(i) : 0.0f;
}

template <typename T>
__device__ __forceinline__ void RingY(const T* row, const float* w, int64_t d0, bool present,
                                      float inv, float (&y)[kVec]) {
  float h[kVec], g[kVec];
  RingH(row, d0, present, h);
  LoadVec(w + (present ? d0 : 0), g);
#pragma unroll
  for (int i = 0; i < kVec; ++i) y[i] = __fmul_rn(__fmul_rn(h[i], inv), g[i]);
}

// Eight codes at p (8-byte aligned: FullChunks), one store.
__device__ __forceinline__ void StoreCodes8(int8_t* p, const float (&v)[kVec], float inv) {
  uint32_t w[2] = {0u, 0u};
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    w[i / 4] |= static_cast<uint32_t>(static_cast<uint8_t>(QuantCode(v[i], inv))) << (8 * (i % 4));
  }
  *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
}

// The staged row r's outputs, by the whole warp.
template <typename T>
__device__ __forceinline__ void RingRow(const NormArgs<T>& a, const T* row, const float* w,
                                        int64_t r, int lane) {
  const int64_t off = r * a.d, first = static_cast<int64_t>(lane) * kVec;
  float acc = 0.0f;  // the lane's canonical partial: its elements in increasing d
#pragma unroll
  for (int c = 0; c < kRingChunks; ++c) {
    const int64_t d0 = first + c * kStride;
    float h[kVec];
    RingH(row, d0, d0 < a.d, h);
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc = __fadd_rn(acc, __fmul_rn(h[i], h[i]));
  }
  const float inv = InverseRms(WarpButterflySum(acc), a.d, a.eps);
  float amax = 0.0f;
#pragma unroll
  for (int c = 0; c < kRingChunks; ++c) {
    const int64_t d0 = first + c * kStride;
    float y[kVec];
    RingY(row, w, d0, d0 < a.d, inv, y);
#pragma unroll
    for (int i = 0; i < kVec; ++i) amax = fmaxf(amax, fabsf(y[i]));
    if (a.y != nullptr && d0 < a.d) StoreVec(a.y + off + d0, y);
  }
  if (a.q == nullptr) return;
  amax = WarpMax(amax);
  const float qinv = QuantInverse(amax), scale = QuantScale(amax);
  float rmax = 0.0f;  // the second digit's, when there is one
#pragma unroll
  for (int c = 0; c < kRingChunks; ++c) {
    const int64_t d0 = first + c * kStride;
    float y[kVec];
    RingY(row, w, d0, d0 < a.d, inv, y);
    if (d0 < a.d) StoreCodes8(a.q + off + d0, y, qinv);
    if (a.q2 != nullptr) rmax = fmaxf(rmax, ChunkRemainders(y, kVec, qinv, scale));
  }
  if (lane == 0) a.s[r] = scale;
  if (a.q2 == nullptr) return;
  rmax = WarpMax(rmax);
  const float rinv = QuantInverse(rmax);
#pragma unroll
  for (int c = 0; c < kRingChunks; ++c) {
    const int64_t d0 = first + c * kStride;
    if (d0 >= a.d) break;  // the second digit is the rare path: branches kept simple
    float y[kVec];
    RingY(row, w, d0, true, inv, y);
    ChunkRemainders(y, kVec, qinv, scale);
    StoreCodes8(a.q2 + off + d0, y, rinv);
  }
  if (lane == 0) a.s2[r] = QuantScale(rmax);
}

// Lane 0 of the warp: row r into slot s (when r is a row), completing on bars[s].
template <typename T>
__device__ __forceinline__ void RingFetch(const NormArgs<T>& a, int64_t m, int64_t r,
                                          unsigned char* slot, uint64_t* bar) {
  if (r >= m) return;
  const uint32_t bytes = static_cast<uint32_t>(a.d * static_cast<int64_t>(sizeof(T)));
  MbarExpectTx(bar, bytes);
  BulkLoad(slot, a.x + r * a.d, bytes, bar);
}

template <typename T>
__global__ void __launch_bounds__(kRingMaxWarps * kWarpSize, 1)
    NormRingRowsKernel(NormArgs<T> a, int64_t m) {
  extern __shared__ __align__(128) unsigned char ring_smem[];
  const RingLayout lay(a.d, sizeof(T));
  const int warps = static_cast<int>(blockDim.x / kWarpSize);
  const int warp = static_cast<int>(threadIdx.x / kWarpSize);
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  float* w = reinterpret_cast<float*>(ring_smem);
  uint64_t* bars = reinterpret_cast<uint64_t*>(ring_smem + lay.w_bytes) + warp * kRingSlots;
  unsigned char* slots = ring_smem + lay.w_bytes + lay.bar_bytes +
                         static_cast<int64_t>(warp) * kRingSlots * lay.row_bytes;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * warps;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * warps + warp;
  uint64_t* w_bar = reinterpret_cast<uint64_t*>(ring_smem + lay.w_bytes) +
                    kRingMaxWarps * kRingSlots;  // gamma's copy
  if (lane == 0) {
    for (int s = 0; s < kRingSlots; ++s) MbarInit(&bars[s], 1);
    if (warp == 0) MbarInit(w_bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");  // visible to the TMA
    if (warp == 0) {
      const uint32_t bytes = static_cast<uint32_t>(a.d * 4);
      MbarExpectTx(w_bar, bytes);
      BulkLoad(w, a.gamma, bytes, w_bar);
    }
    for (int s = 0; s < kRingSlots; ++s) {
      RingFetch(a, m, r0 + s * stride, slots + s * lay.row_bytes, &bars[s]);
    }
  }
  __syncthreads();  // every barrier initialised
  MbarWait(w_bar, 0);
  for (int64_t i = threadIdx.x * 4; i < a.d; i += blockDim.x * 4) {  // d % 8 == 0
    float4 g = *reinterpret_cast<float4*>(w + i);
    g.x = __fadd_rn(a.weight_offset, g.x), g.y = __fadd_rn(a.weight_offset, g.y);
    g.z = __fadd_rn(a.weight_offset, g.z), g.w = __fadd_rn(a.weight_offset, g.w);
    *reinterpret_cast<float4*>(w + i) = g;
  }
  __syncthreads();  // w = weight_offset + gamma
  int s = 0;
  uint32_t phase = 0;
  for (int64_t r = r0; r < m; r += stride) {
    MbarWait(&bars[s], phase);
    unsigned char* slot = slots + s * lay.row_bytes;
    RingRow(a, reinterpret_cast<const T*>(slot), w, r, lane);
    __syncwarp();  // every lane's reads of the slot are done (their values were used)
    if (lane == 0) {
      FenceProxyAsync();
      RingFetch(a, m, r + kRingSlots * stride, slot, &bars[s]);
    }
    if (++s == kRingSlots) s = 0, phase ^= 1u;
  }
}

// Whether the ring kernel can take a's rows: no residual or fused post-norm, whole 16-byte
// aligned chunks (so the row's bytes are a multiple of 16 and every row starts aligned), at most
// kRingChunks chunks a lane.
template <typename T>
bool RingRowsFit(const NormArgs<T>& a) {
  return a.residual == nullptr && a.x_gamma == nullptr && a.h == nullptr && FullChunks(a) &&
         a.d <= static_cast<int64_t>(kRingChunks) * kStride;
}

// Launches the ring kernel over m rows (the caller checked RingRowsFit): as many warps a block
// as the opt-in shared memory holds (up to kRingMaxWarps), one block an SM at most.
template <typename T>
cudaError_t LaunchRingRows(cudaStream_t stream, int64_t m, const NormArgs<T>& a) {
  static const int optin = [] {
    int device = 0, bytes = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    return bytes;
  }();
  const RingLayout lay(a.d, sizeof(T));
  int warps = kRingMaxWarps;
  while (warps > 1 && lay.Bytes(warps) > optin) --warps;
  if (lay.Bytes(warps) > optin) return cudaErrorInvalidConfiguration;
  const size_t smem = static_cast<size_t>(lay.Bytes(warps));
  const cudaError_t attr = cudaFuncSetAttribute(
      NormRingRowsKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (attr != cudaSuccess) return attr;
  const int64_t blocks = std::min<int64_t>(DeviceSmCount(), CeilDiv(m, warps));
  NormRingRowsKernel<T><<<static_cast<unsigned>(blocks), warps * kWarpSize, smem, stream>>>(a, m);
  return cudaSuccess;
}

}  // namespace prism
