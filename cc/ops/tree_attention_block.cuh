// Tree attention, the K/V-sharing kernel of tree_attention_cuda.cu for head dims H in
// {64, 128, 256}: the same bits as AttendKernel, with each K/V row read from L2 once per block
// instead of once per (token, query head).
//
// One block per (tile of Qt consecutive tokens, kv head): its kPairs = Qt * G (token, query
// head) pairs are the G query heads of that kv head (GQA) for Qt tokens. For each absolute key
// tile j in increasing order, and each distinct chain of the block's tokens, the block stages
// the tile's visible K/V rows in shared memory and each warp computes its pairs' tile partials
// (tree_attention_block_tile.cuh, shared with the split kernel's pass 1), then merges them into
// registers as TileStep does; a pair whose tile has no visible key skips the merge. Included by
// tree_attention_cuda.cu only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/tree_attention.h"
#include "cc/ops/tree_attention_block_tile.cuh"

namespace prism {
namespace block {

// Merges the warp's tile partials into its running state (TileStep's merge), pairs that saw a
// key in this tile only.
template <int kH, int kPW>
__device__ __forceinline__ void MergePartials(const Partials<kH, kPW>& pt, float (&st_m)[kPW],
                                              float (&st_l)[kPW],
                                              float (&st_acc)[kPW][Shape<kH, kPW>::kDims]) {
#pragma unroll
  for (int i = 0; i < kPW; ++i) {
    if (pt.mask[i] == 0) continue;  // uniform
    const bool first = st_l[i] == 0.0f;
    const MergeWeights mw =
        first ? MergeWeights{pt.mt[i], 0.0f, 1.0f} : MergeFactors(st_m[i], pt.mt[i]);
    st_m[i] = mw.m;
    st_l[i] = first ? pt.lt[i] : Merged(st_l[i], mw.a, pt.lt[i], mw.b);
#pragma unroll
    for (int d = 0; d < Shape<kH, kPW>::kDims; ++d) {
      st_acc[i][d] = first ? pt.acct[i][d] : Merged(st_acc[i][d], mw.a, pt.acct[i][d], mw.b);
    }
  }
}

// Block-wide: out for the pairs of query tile b (tokens [b * Qt, (b + 1) * Qt)) and kv head
// kvh, every tile in order (see the top of this file). smem: SmemBytes() of dynamic memory.
template <typename Q, typename KV, int kH, int kPW>
__device__ __forceinline__ void AttendBlock(const Q* __restrict__ q, const KV* __restrict__ k_pool,
                                            const KV* __restrict__ v_pool, const Dims& dm,
                                            const Tables& tb, float scale, int32_t window,
                                            int64_t b, int64_t kvh, float* smem,
                                            BlockInfo& info, Q* __restrict__ out) {
  using S = Shape<kH, kPW>;
  const Smem sm = CarveSmem<kH, kPW>(smem);
  const int g_count = static_cast<int>(dm.n / dm.k), qt = S::kPairs / g_count;
  const int64_t t0 = b * qt;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  SetupBlock<Q, kH, kPW>(q, dm, tb, window, t0, kvh, sm, &info);

  // Warp state: pairs warp * kPW + i; m and l equal on every lane, acc the lane's dimensions.
  float st_m[kPW], st_l[kPW], st_acc[kPW][S::kDims];
#pragma unroll
  for (int i = 0; i < kPW; ++i) {
    st_m[i] = 0.0f, st_l[i] = 0.0f;
#pragma unroll
    for (int d = 0; d < S::kDims; ++d) st_acc[i][d] = 0.0f;
  }
  const int nc = info.n_chains;
  const int64_t jlo = info.j_lo, jhi = info.j_hi;
  for (int64_t j = jlo; j <= jhi; ++j) {
    for (int ci = 0; ci < nc; ++ci) {
      if (j < sm.chains[ci].lo || j > sm.chains[ci].hi) continue;  // uniform (shared memory)
      StageTile<KV, kH, kPW>(k_pool, v_pool, dm, tb, window, kvh, j, ci, qt, sm);
      Partials<kH, kPW> pt;
      TilePartials<kH, kPW>(sm, j, ci, window, scale, g_count, &pt);
      MergePartials<kH, kPW>(pt, st_m, st_l, st_acc);
    }
  }

  // out[t, n] for the warp's pairs (padding and past-T tokens: Normalised gives exact zeros).
#pragma unroll
  for (int i = 0; i < kPW; ++i) {
    const int p = warp * kPW + i;
    const int64_t t = t0 + p / g_count, n = kvh * g_count + p % g_count;
    if (t >= dm.t) continue;
    Q* o = out + (t * dm.n + n) * kH + lane * S::kDims;
#pragma unroll
    for (int d = 0; d < S::kDims; ++d) FromF32(Normalised(st_acc[i][d], st_l[i]), o + d);
  }
}

// The block kernel (see the top of this file). grid = (ceil(T / Qt), K), Qt = kPairs / G.
template <typename Q, typename KV, int kH, int kPW>
__global__ void __launch_bounds__(kThreads, kH <= 128 ? 2 : 1)
    BlockAttendKernel(const Q* __restrict__ q, const KV* __restrict__ k_pool,
                      const KV* __restrict__ v_pool, Dims dm, Tables tb, float scale,
                      int32_t window, Q* __restrict__ out) {
  extern __shared__ __align__(16) float smem[];
  __shared__ BlockInfo info;
  AttendBlock<Q, KV, kH, kPW>(q, k_pool, v_pool, dm, tb, scale, window, blockIdx.x, blockIdx.y,
                              smem, info, out);
}

}  // namespace block
}  // namespace prism
