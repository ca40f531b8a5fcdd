// NormSplitRowsKernel: one block per row, W warps per row (W in 2, 4, 8), the row in registers.
// Warp w holds chunks [c_w, c_{w+1}) of every lane (c_w = w * C / W of the row's C canonical
// chunks per lane), so a lane holds ~C/W chunks instead of C: fewer registers, all of x's,
// residual's and gamma's loads in flight together, and W times more warps in the grid than
// NormRegRowsKernel (norm_reg_rows.cuh), which held 168 values per lane at D = 5376 and ran at
// 0.7-1 TB/s on an H200 for M = 256.
//
// Same bits as the one-warp kernel: the canonical partial of lane l is the sequential sum of
// its squares in increasing d, so warp 0 starts it over its chunks and hands it (shared memory)
// to warp 1, which continues adding its own chunks' squares in order, and so on; the last warp
// takes the butterfly and shares inv. Only those adds are serial; loads, gamma and the squares'
// inputs are all in registers before the chain starts. amax is exact in any order, so warps
// combine theirs freely. Everything else is elementwise with RegSlice's (the same) operations.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/norm_args.cuh"
#include "cc/ops/norm_reg_slice.cuh"

namespace prism {

constexpr int kMaxSplit = 8;         // warps per row (block)
constexpr int kMaxSplitChunks = 11;  // chunks per lane per warp: 21 chunks (D = 5376) over 2

// The row's inverse RMS from the warps' slices: the canonical partials chained warp by warp in
// increasing d (one barrier per warp; the last also publishes inv). All threads must call it.
template <typename T, int kChunks, bool kFull>
__device__ __forceinline__ float ChainedInverseRms(const RegSlice<T, kChunks, kFull>& s,
                                                   const NormArgs<T>& a, int warp, int warps,
                                                   int lane) {
  __shared__ float carry[kWarpSize];  // lane l's partial over the chunks of warps < turn
  __shared__ float inv;
  for (int turn = 0; turn < warps; ++turn) {
    if (warp == turn) {  // reads and writes carry[lane] from the same thread: no race
      const float acc = s.AddSquares(turn == 0 ? 0.0f : carry[lane]);
      if (turn + 1 < warps) {
        carry[lane] = acc;
      } else {
        const float ss = WarpButterflySum(acc);
        if (lane == 0) inv = InverseRms(ss, a.d, a.eps);
      }
    }
    __syncthreads();  // hands carry to warp turn + 1 (the last: publishes inv)
  }
  return inv;
}

// Max over the block of each warp's amax (exact). All threads must call it.
__device__ __forceinline__ float SplitRowMax(float amax, int warp, int warps) {
  __shared__ float warp_max[kMaxSplit];
  amax = WarpMax(amax);
  if (threadIdx.x % kWarpSize == 0) warp_max[warp] = amax;
  __syncthreads();
  for (int v = 0; v < warps; ++v) amax = fmaxf(amax, warp_max[v]);
  return amax;
}

// The lean form for many rows: gamma is read after the reduction instead of held in
// registers through it, and the compiler is held to kLeanBlocks blocks of kMaxSplit warps' worth
// of registers per SM. With gamma preloaded, 4 warps per row took 190 registers a thread at
// D = 5376 f32: two rows per SM, so at M = 4096 the kernel waited on one row's latency after
// another at ~1.3 TB/s (results/ops_h200_session8/). Few rows keep the preload: there a row's
// latency, not the rows in flight, sets the time.
constexpr int kLeanBlocks = 3;
constexpr int64_t kLeanRows = 1024;  // rows from which the launcher takes the lean form

// One block per row (blockIdx.x), blockDim.x / kWarpSize warps. kChunks >= each warp's share.
// kPre: Gemma's post-norm fused in front (a.x_gamma, a.residual set): x's own inverse RMS is
// chained first over the same slices, then h = rmsnorm(x) + residual (AddNormedResidual).
// kSum: x is a two-digit projection's partial products (a.x_hi, a.x_w2 set; RegSlice::LoadX).
template <typename T, int kChunks, bool kFull, bool kLean, bool kPre, bool kSum>
__global__ void __launch_bounds__(kMaxSplit * kWarpSize, kLean ? kLeanBlocks : 1)
    NormSplitRowsKernel(NormArgs<T> a) {
  const int warps = static_cast<int>(blockDim.x / kWarpSize);
  const int warp = static_cast<int>(threadIdx.x / kWarpSize);
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const int64_t off = static_cast<int64_t>(blockIdx.x) * a.d;
  const int chunks = static_cast<int>((a.d + kStride - 1) / kStride);  // per lane, whole row
  RegSlice<T, kChunks, kFull> s;
  s.Locate(a.d, lane, warp * chunks / warps, (warp + 1) * chunks / warps);
  if constexpr (kPre) {
    RegChunk<T> rv[kChunks];
    s.template LoadPreNorm<kSum>(a, off, rv);
    const float inv_x = ChainedInverseRms(s, a, warp, warps, lane);
    s.AddNormedResidual(a, off, rv, inv_x);
  }
  if constexpr (kLean) {
    if constexpr (!kPre) s.template LoadRowLean<kSum>(a, off);
    const float inv = ChainedInverseRms(s, a, warp, warps, lane);
    const float amax = s.YAmax(a, inv, a.y != nullptr ? a.y + off : nullptr);
    if (a.q == nullptr) return;  // uniform over the block: every warp skips the barrier below
    const float row_max = SplitRowMax(amax, warp, warps);
    const float qinv = QuantInverse(row_max), scale = QuantScale(row_max);
    s.CodesFromH(a, inv, a.q + off, qinv);
    if (threadIdx.x == 0) a.s[blockIdx.x] = scale;
    if (a.q2 == nullptr) return;  // uniform over the block
    __syncthreads();  // every warp has read the warp maxima SplitRowMax reuses below
    const float rmax = SplitRowMax(s.RemainderMax(a, inv, qinv, scale), warp, warps);
    s.RemainderCodes(a, inv, qinv, scale, a.q2 + off, QuantInverse(rmax));
    if (threadIdx.x == 0) a.s2[blockIdx.x] = QuantScale(rmax);
    return;
  }
  float w[kChunks][kVec];  // gamma's, loaded with x: not a round trip after the reduction
  if constexpr (kPre) {
    s.LoadWeights(a, w);
  } else {
    s.template LoadRow<kSum>(a, off, w);
  }
  const float inv = ChainedInverseRms(s, a, warp, warps, lane);
  float y[kChunks][kVec];
  const float amax = s.Normalize(inv, w, y);
  if (a.y != nullptr) s.StoreY(a.y + off, y);
  if (a.q == nullptr) return;  // uniform over the block: every warp skips the barrier below
  const float row_max = SplitRowMax(amax, warp, warps);
  const float qinv = QuantInverse(row_max), scale = QuantScale(row_max);
  s.StoreCodes(a.q + off, y, qinv);
  if (threadIdx.x == 0) a.s[blockIdx.x] = scale;
  if (a.q2 == nullptr) return;  // uniform over the block
  __syncthreads();  // every warp has read the warp maxima SplitRowMax reuses below
  const float rmax = SplitRowMax(s.Remainders(y, qinv, scale), warp, warps);
  s.StoreCodes(a.q2 + off, y, QuantInverse(rmax));
  if (threadIdx.x == 0) a.s2[blockIdx.x] = QuantScale(rmax);
}

// Warps per row when the launch does not force them: 1 (NormRegRowsKernel) for rows of <= 3
// chunks per lane (D <= 768: 24 values, no register pressure, no barrier worth adding);
// otherwise the fewest warps giving each lane <= 6 chunks (48 f32 of h and 48 of gamma fit with
// room to spare), or <= 3 when there is at most about one row per SM (132 on an H200): then
// the row's latency is the kernel's, and more warps share its loads and stores. The lean form
// takes <= 3 as well: at M = 4096 (D = 5376, f32, H200) 8 warps ran rmsnorm_quant in 63 us and
// add_rmsnorm_quant in 115 us, 4 warps in 68 and 140 (results/ops_h200_session8/).
inline int SplitWarps(int64_t m, int64_t d, bool lean) {
  constexpr int64_t kFewRows = 132;
  const int64_t chunks = CeilDiv(d, kStride);
  if (chunks <= 3) return 1;
  const int64_t target = m <= kFewRows || lean ? 3 : 6;
  int warps = 2;
  while (warps < kMaxSplit && CeilDiv(chunks, warps) > target) warps *= 2;
  return warps;
}

template <typename T, int kChunks, bool kLean, bool kPre, bool kSum>
void LaunchSplitRowsAs(cudaStream_t stream, int64_t m, int warps, const NormArgs<T>& a) {
  const unsigned grid = static_cast<unsigned>(m), threads = warps * kWarpSize;
  const bool aligned_x_gamma = (reinterpret_cast<uintptr_t>(a.x_gamma) & 15u) == 0;
  if (FullChunks(a) && (!kPre || aligned_x_gamma)) {
    NormSplitRowsKernel<T, kChunks, true, kLean, kPre, kSum><<<grid, threads, 0, stream>>>(a);
  } else {
    NormSplitRowsKernel<T, kChunks, false, kLean, kPre, kSum><<<grid, threads, 0, stream>>>(a);
  }
}

// The partial-product form (a.x_hi set) exists for f32 rows only: two digits are f32.
template <typename T, int kChunks, bool kLean, bool kPre>
void LaunchSplitRows(cudaStream_t stream, int64_t m, int warps, const NormArgs<T>& a) {
  if constexpr (std::is_same_v<T, float>) {
    if (a.x_hi != nullptr) {
      return LaunchSplitRowsAs<T, kChunks, kLean, kPre, true>(stream, m, warps, a);
    }
  }
  LaunchSplitRowsAs<T, kChunks, kLean, kPre, false>(stream, m, warps, a);
}

template <typename T, int kChunks, bool kPre>
void LaunchSplitRows(cudaStream_t stream, int64_t m, int warps, bool lean,
                     const NormArgs<T>& a) {
  if (lean) return LaunchSplitRows<T, kChunks, true, kPre>(stream, m, warps, a);
  LaunchSplitRows<T, kChunks, false, kPre>(stream, m, warps, a);
}

// The smallest instantiated chunk count holding each warp's share of a row of d; the caller
// guarantees CeilDiv(CeilDiv(d, kStride), warps) <= kMaxSplitChunks. kPre: a.x_gamma's fused
// post-norm (the caller sets x_gamma and residual).
template <typename T, bool kPre = false>
void LaunchSplitRowsFor(cudaStream_t stream, int64_t m, int warps, bool lean,
                        const NormArgs<T>& a) {
  const int64_t per_warp = CeilDiv(CeilDiv(a.d, kStride), warps);
  if (per_warp <= 3) return LaunchSplitRows<T, 3, kPre>(stream, m, warps, lean, a);
  if (per_warp <= 6) return LaunchSplitRows<T, 6, kPre>(stream, m, warps, lean, a);
  return LaunchSplitRows<T, kMaxSplitChunks, kPre>(stream, m, warps, lean, a);
}

}  // namespace prism
