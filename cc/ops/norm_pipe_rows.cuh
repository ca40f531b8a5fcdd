// NormPipeRowsKernel: the split kernel's lean form (norm_split_rows.cuh) made persistent, with
// the rows it will take next already on their way into shared memory. The lean form holds one
// row per block: at M = 4096 (D = 5376, f32, H200) each block spent most of its life waiting on
// its row's loads or on the chained sum, three rows per SM, and rmsnorm_quant moved 2.2 TB/s
// (51 % of the copy, results/ops_h200_session9/). Here each block loops over rows blockIdx.x,
// + gridDim.x, ...: while it reduces one row, the next kPipeStages - 1 rows are already copied
// by cp.async into its ring of row slots, so the SM keeps loads in flight through the serial
// parts of every row.
//
// Same bits as the lean form: a thread copies exactly the chunks its RegSlice holds, reads them
// back from its own slot into the same registers, and runs the same passes. A thread only ever
// reads shared memory it copied itself (cp.async.wait_group orders its own copies), so the ring
// needs no barrier; the passes' barriers (ChainedInverseRms, SplitRowMax) are block-uniform,
// since every warp of a block takes the same rows.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/norm_args.cuh"
#include "cc/ops/norm_reg_slice.cuh"
#include "cc/ops/norm_split_rows.cuh"

namespace prism {

// 16 bytes global -> shared by cp.async (sm_80+; .cg: through L2 only, the row is read once).
__device__ __forceinline__ void PipeCopy16(void* dst, const void* src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}

// The slice's present chunks of src's row into the same places of dst (kVec elements of T per
// chunk: 32 bytes of f32, 16 of bf16).
template <typename T, int kChunks>
__device__ __forceinline__ void PipeCopySlice(const RegSlice<T, kChunks, true>& s, T* dst,
                                              const T* src) {
  constexpr int kCopies = static_cast<int>(kVec * sizeof(T) / 16);
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    if (s.cnt[j] == 0) continue;
#pragma unroll
    for (int c = 0; c < kCopies; ++c) {
      PipeCopy16(dst + s.at[j] + c * (16 / sizeof(T)), src + s.at[j] + c * (16 / sizeof(T)));
    }
  }
}

// Row r (x, then residual when kRes) into slot; one commit group per call, empty past the last
// row, so wait_group's count always names the same row.
template <typename T, int kChunks, bool kRes>
__device__ __forceinline__ void PipePrefetch(const RegSlice<T, kChunks, true>& s,
                                             const NormArgs<T>& a, int64_t r, int64_t m,
                                             T* slot) {
  if (r < m) {
    PipeCopySlice(s, slot, a.x + r * a.d);
    if constexpr (kRes) PipeCopySlice(s, slot + a.d, a.residual + r * a.d);
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// The slice's chunks from the thread's own copies in src; absent chunks +0 (never used).
template <typename T, int kChunks>
__device__ __forceinline__ void PipeLoadSlice(const RegSlice<T, kChunks, true>& s, const T* src,
                                              RegChunk<T> (&dst)[kChunks]) {
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    if (s.cnt[j] > 0) {
      dst[j].LoadFull(src + s.at[j]);
    } else {
      dst[j] = RegChunk<T>{};
    }
  }
}

// w = weight_offset + gamma for the thread's present chunks into w_staged (its own chunks'
// places), once per block: each row's passes then read w from shared memory instead of gamma
// from L1 or L2 twice a row. Returns the arguments the passes take: gamma pointing at w_staged
// and weight_offset -0, which LoadWeightsOf adds back exactly (-0 + w == w for every w,
// signed zeros and NaN included). Followed by a barrier: absent chunks of a kFull slice read
// the row's first chunk, another thread's.
template <typename T, int kChunks>
__device__ __forceinline__ NormArgs<T> PipeStageWeights(const RegSlice<T, kChunks, true>& s,
                                                        const NormArgs<T>& a, float* w_staged) {
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    if (s.cnt[j] == 0) continue;
    float w[kVec];
    LoadVec(a.gamma + s.at[j], w);
#pragma unroll
    for (int i = 0; i < kVec; ++i) w[i] = __fadd_rn(a.weight_offset, w[i]);
    StoreVec(w_staged + s.at[j], w);
  }
  __syncthreads();
  NormArgs<T> staged = a;
  staged.gamma = w_staged;
  staged.weight_offset = -0.0f;
  return staged;
}

// kRes: add_rmsnorm(_quant)'s residual, staged beside x (each slot holds two rows). Shared
// memory: w (D floats), then kStages slots.
template <typename T, int kChunks, bool kRes, int kStages>
__global__ void __launch_bounds__(kMaxSplit * kWarpSize, kLeanBlocks)
    NormPipeRowsKernel(NormArgs<T> a, int64_t m) {
  extern __shared__ float4 pipe_smem[];
  float* w_staged = reinterpret_cast<float*>(pipe_smem);
  T* ring = reinterpret_cast<T*>(w_staged + a.d);  // D % kVec == 0: 32-byte aligned
  const int64_t slot_elems = (kRes ? 2 : 1) * a.d;
  const int warps = static_cast<int>(blockDim.x / kWarpSize);
  const int warp = static_cast<int>(threadIdx.x / kWarpSize);
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const int chunks = static_cast<int>((a.d + kStride - 1) / kStride);
  RegSlice<T, kChunks, true> s;
  s.Locate(a.d, lane, warp * chunks / warps, (warp + 1) * chunks / warps);
  const int64_t step = gridDim.x;
#pragma unroll
  for (int k = 0; k + 1 < kStages; ++k) {
    PipePrefetch<T, kChunks, kRes>(s, a, blockIdx.x + k * step, m, ring + k * slot_elems);
  }
  const NormArgs<T> aw = PipeStageWeights(s, a, w_staged);
  int slot = 0;
  for (int64_t r = blockIdx.x; r < m; r += step) {
    const int ahead = (slot + kStages - 1) % kStages;  // consumed last iteration
    PipePrefetch<T, kChunks, kRes>(s, a, r + (kStages - 1) * step, m, ring + ahead * slot_elems);
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 1) : "memory");  // row r is in
    const T* staged = ring + slot * slot_elems;
    const int64_t off = r * a.d;
    PipeLoadSlice(s, staged, s.h);
    if constexpr (kRes) {
      RegChunk<T> rv[kChunks];
      PipeLoadSlice(s, staged + a.d, rv);
      s.AddResidual(a, off, rv);
    }
    slot = (slot + 1) % kStages;
    const float inv = ChainedInverseRms(s, a, warp, warps, lane);
    const float amax = s.YAmax(aw, inv, a.y != nullptr ? a.y + off : nullptr);
    if (a.q == nullptr) continue;  // uniform over the grid
    const float row_max = SplitRowMax(amax, warp, warps);
    const float qinv = QuantInverse(row_max), scale = QuantScale(row_max);
    s.CodesFromH(aw, inv, a.q + off, qinv);
    if (threadIdx.x == 0) a.s[r] = scale;
    if (a.q2 == nullptr) continue;  // uniform over the grid
    __syncthreads();  // every warp has read the warp maxima SplitRowMax reuses below
    const float rmax = SplitRowMax(s.RemainderMax(aw, inv, qinv, scale), warp, warps);
    s.RemainderCodes(aw, inv, qinv, scale, a.q2 + off, QuantInverse(rmax));
    if (threadIdx.x == 0) a.s2[r] = QuantScale(rmax);
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");  // the empty groups past the last row
}

// Whether the pipelined kernel takes a's rows: whole aligned chunks (its copies are 16-byte
// cp.async) and no fused post-norm in front.
template <typename T>
bool PipeRowsFit(const NormArgs<T>& a) {
  return FullChunks(a) && a.x_gamma == nullptr;
}

// PRISM_RMSNORM_PIPE_STAGES (benchmarks): the ring's row slots, 2 (default) or 3.
inline int PipeStages() {
  const char* env = std::getenv("PRISM_RMSNORM_PIPE_STAGES");
  return env != nullptr && std::string(env) == "3" ? 3 : 2;
}

template <typename T, int kChunks, bool kRes, int kStages>
ffi::Error LaunchPipeRows(cudaStream_t stream, int64_t m, int warps, const NormArgs<T>& a) {
  auto* kernel = NormPipeRowsKernel<T, kChunks, kRes, kStages>;
  const int threads = warps * kWarpSize;
  const size_t smem = static_cast<size_t>(a.d) * sizeof(float) +
                      static_cast<size_t>(kStages) * (kRes ? 2 : 1) * a.d * sizeof(T);
  if (smem > 48 * 1024) {  // above the default cap: opt in (not a stream operation)
    const cudaError_t e = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear it: nothing was launched
      return ffi::Error::Internal(std::string("RMSNorm pipelined rows: shared memory: ") +
                                  cudaGetErrorString(e));
    }
  }
  int device = 0, sms = 0, per_sm = 0;  // a few microseconds of host time, no stream work
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
  const int64_t resident = static_cast<int64_t>(std::max(sms, 1)) * std::max(per_sm, 1);
  const unsigned grid = static_cast<unsigned>(std::min(m, resident));
  kernel<<<grid, threads, smem, stream>>>(a, m);
  return ffi::Error::Success();
}

template <typename T, int kChunks, bool kRes>
ffi::Error LaunchPipeRows(cudaStream_t stream, int64_t m, int warps, const NormArgs<T>& a) {
  if (PipeStages() == 3) return LaunchPipeRows<T, kChunks, kRes, 3>(stream, m, warps, a);
  return LaunchPipeRows<T, kChunks, kRes, 2>(stream, m, warps, a);
}

// The smallest instantiated chunk count holding each warp's share (as LaunchSplitRowsFor).
template <typename T>
ffi::Error LaunchPipeRowsFor(cudaStream_t stream, int64_t m, int warps, const NormArgs<T>& a) {
  const int64_t per_warp = CeilDiv(CeilDiv(a.d, kStride), warps);
  const bool res = a.residual != nullptr;
  if (per_warp <= 3) {
    return res ? LaunchPipeRows<T, 3, true>(stream, m, warps, a)
               : LaunchPipeRows<T, 3, false>(stream, m, warps, a);
  }
  if (per_warp <= 6) {
    return res ? LaunchPipeRows<T, 6, true>(stream, m, warps, a)
               : LaunchPipeRows<T, 6, false>(stream, m, warps, a);
  }
  return res ? LaunchPipeRows<T, kMaxSplitChunks, true>(stream, m, warps, a)
             : LaunchPipeRows<T, kMaxSplitChunks, false>(stream, m, warps, a);
}

}  // namespace prism
