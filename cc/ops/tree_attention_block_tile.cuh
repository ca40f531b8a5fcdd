// Tree attention, the per-tile arithmetic of tree_attention_block.cuh (the fused block kernel)
// and tree_attention_split.cuh (its split-over-tiles pass 1; staging is in
// tree_attention_block_stage.cuh): one tile's partials for every
// (token, query head) pair of a block, in AttendKernel's bits. Both kernels call these
// functions, so their per-tile arithmetic is one piece of code.
//
// A block serves kPairs = Qt * G (token, query head) pairs: the G query heads of one kv head
// (GQA) for Qt consecutive tokens. For absolute key tile j and one distinct chain of the
// block's tokens, StageTile resolves the tile's 64 positions to pool rows (KeyRow; rows that no
// token of the chain sees, and absent keys, are neither loaded nor used) and stages the K and V
// rows in shared memory as f32; then TilePartials computes:
//   scores (TileScores, warps in pairs): each lane computes the dots of 2 keys with kPW pairs'
//     q, serially in one thread but in the attention dot's order (tree_attention.h): lane
//     partials of kVec fused multiply-adds from +0, the remaining levels as a tree (leaves
//     visited in bit-reversed order, so each level adds partial[i] and partial[i + off]
//     exactly as the xor shuffle does), the levels whose offset is >= H / kVec as one `+ 0` on
//     the sum (TileScores says why that is the same); s = dot * scale, into shared memory.
//     Then warp w works alone on its kPW pairs:
//   max: TileStep's serial max as an exact (value, position) butterfly over the warp.
//   e_i = expf(s_i - mt), then lane l owns H / 32 dimensions of each pair and adds lt and
//     e_i * v_i (fused) over the visible keys in increasing position.
// Visibility is per pair (its token's position, window and chain): a 64-bit mask per pair,
// uniform across the warp, so invisible keys are skipped exactly as AttendKernel skips them;
// a pair whose mask is 0 has no partial for the tile (the caller skips its merge).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/tree_attention.h"
#include "cc/ops/tree_attention_block_stage.cuh"

namespace prism {
namespace block {

// Adds one leaf (a lane partial) to the butterfly tree: leaves arrive
// in bit-reversed lane order, so leaf `seq` closes one subtree per trailing one bit of seq
// (a binary counter); stack[b] holds the pending subtree of 2^b leaves.
template <int kLog>
__device__ __forceinline__ void PushLeaf(float (&stack)[kLog + 1], float v, int seq) {
#pragma unroll
  for (int b = 0; b < kLog; ++b) {
    if (((seq >> b) & 1) == 0) {
      stack[b] = v;
      return;
    }
    v = __fadd_rn(stack[b], v);
  }
  stack[kLog] = v;
}

// Visibility masks of the warp's pairs for tile j of chain ci.
template <int kH, int kPW>
__device__ __forceinline__ void TileMasks(const Smem& sm, int64_t j, int ci, int32_t window,
                                          int g_count, int warp, int lane, uint64_t (&mask)[kPW]) {
  const bool row_lo = sm.rows[lane] >= 0, row_hi = sm.rows[lane + kWarpSize] >= 0;
#pragma unroll
  for (int i = 0; i < kPW; ++i) {
    const Token tk = sm.toks[(warp * kPW + i) / g_count];
    const bool mine = tk.ci == ci;
    const int64_t p = j * kAttnTile + lane;
    const unsigned lo = __ballot_sync(kFullMask, mine && row_lo && KeyVisible(p, tk.pos, window));
    const unsigned hi = __ballot_sync(
        kFullMask, mine && row_hi && KeyVisible(p + kWarpSize, tk.pos, window));
    mask[i] = static_cast<uint64_t>(lo) | (static_cast<uint64_t>(hi) << 32);
  }
}

// The tile's scores, every pair with every key, into sm.sc [kPairs][kScRow]: the canonical
// dot, serially in one thread, times scale. Warps work in pairs: warp w takes keys
// (w % 2) * 32 .. + 31 of pair group w / 2 (2 * kPW pairs); in it, lanes 0-15 take the group's
// first kPW pairs and lanes 16-31 the others, each lane keys x and x + 16 of the warp's 32.
// So each lane keeps kPW pairs x 2 keys of partial sums (as a warp of 64 keys x kPW pairs
// would), but a 16-byte K load serves two lanes and a q load two pairs: 16 shared-memory
// wavefronts per 64 fused multiply-adds instead of 24.
template <int kH, int kPW>
__device__ __forceinline__ void TileScores(const Smem& sm, float scale, int warp, int lane) {
  using S = Shape<kH, kPW>;
  static_assert(kWarps % 2 == 0, "scores: warps work in pairs over the tile's two key halves");
  const int half = lane / (kWarpSize / 2), kl = lane % (kWarpSize / 2);
  const int pair0 = (warp / 2) * 2 * kPW + half * kPW;
  const int key0 = (warp % 2) * kWarpSize + kl;
  float stack[kPW][2][S::kLog + 1];
#pragma unroll
  for (int seq = 0; seq < S::kParts; ++seq) {
    const int part = BitReverse(seq, S::kLog);
    float kc[2][kVec];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const float4* kp = reinterpret_cast<const float4*>(
          sm.kt + (key0 + u * (kWarpSize / 2)) * S::kRow + part * kVec);
      const float4 a = kp[0], b = kp[1];
      kc[u][0] = a.x, kc[u][1] = a.y, kc[u][2] = a.z, kc[u][3] = a.w;
      kc[u][4] = b.x, kc[u][5] = b.y, kc[u][6] = b.z, kc[u][7] = b.w;
    }
#pragma unroll
    for (int i = 0; i < kPW; ++i) {
      const float4* qp =
          reinterpret_cast<const float4*>(sm.qs + (pair0 + i) * S::kQRow + part * kVec);
      const float4 a = qp[0], b = qp[1];
      const float qc[kVec] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        float acc = 0.0f;
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc = __fmaf_rn(qc[e], kc[u][e], acc);
        PushLeaf<S::kLog>(stack[i][u], acc, seq);
      }
    }
  }
  // The butterfly's `+ 0` levels (offsets >= H / kVec; H = 256 has none) add +0 to each leaf
  // first: that only turns a leaf of -0 (a fused sum of negative products below the smallest
  // denormal) into +0, and x + y is -0 only when both are, so the leaves' `+ 0` changes the
  // tree's sum only where it is -0, into +0: exactly what one `+ 0` on the sum does (NaNs from
  // the GPU's own arithmetic are canonical and stay so). One add a dot instead of H / kVec.
#pragma unroll
  for (int i = 0; i < kPW; ++i) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      float dot = stack[i][u][S::kLog];
      if constexpr (S::kLog < 5) dot = __fadd_rn(dot, 0.0f);
      sm.sc[(pair0 + i) * S::kScRow + key0 + u * (kWarpSize / 2)] = __fmul_rn(dot, scale);
    }
  }
}

// TileStep's max: a serial scan `mt = !seen || mt < s ? s : mt` in increasing position yields
// the first visible score if it is NaN, else the first-positioned maximum of the non-NaN scores
// (NaNs after the first are never taken; -0 and +0 tie, the earlier stays). That is an
// associative (value, position) choice, so a butterfly gives the same bits.
__device__ __forceinline__ float TileMax(uint64_t mask, const float (&s)[2], int lane) {
  float best = 0.0f;
  int at = kAttnTile;  // kAttnTile: none yet
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const int x = lane + u * kWarpSize;
    if (((mask >> x) & 1u) && !isnan(s[u]) && (at == kAttnTile || best < s[u])) best = s[u], at = x;
  }
#pragma unroll
  for (int off = kWarpSize / 2; off > 0; off /= 2) {
    const float ob = __shfl_xor_sync(kFullMask, best, off);
    const int oat = __shfl_xor_sync(kFullMask, at, off);
    const bool take =
        oat != kAttnTile && (at == kAttnTile || best < ob || (!(ob < best) && oat < at));
    best = take ? ob : best;
    at = take ? oat : at;
  }
  const int first = mask != 0 ? __ffsll(static_cast<long long>(mask)) - 1 : 0;
  const float sf = __shfl_sync(kFullMask, first < kWarpSize ? s[0] : s[1], first % kWarpSize);
  return isnan(sf) ? sf : best;
}

// The lane's dimensions of V row x (staged in smem).
template <int kH, int kPW>
__device__ __forceinline__ void LoadV(const Smem& sm, int x, int lane,
                                      float (&vv)[Shape<kH, kPW>::kDims]) {
  using S = Shape<kH, kPW>;
  const float* vp = sm.vt + x * S::kRow + lane * S::kDims;
  if constexpr (S::kDims % 4 == 0) {
#pragma unroll
    for (int d = 0; d < S::kDims; d += 4) {
      const float4 a = *reinterpret_cast<const float4*>(vp + d);
      vv[d] = a.x, vv[d + 1] = a.y, vv[d + 2] = a.z, vv[d + 3] = a.w;
    }
  } else {
    const float2 a = *reinterpret_cast<const float2*>(vp);
    vv[0] = a.x, vv[1] = a.y;
  }
}

// Adds key x's weight w and w * v to pair i's sums (the one order every path uses).
template <int kH, int kPW>
__device__ __forceinline__ void AddKey(float w, const float (&vv)[Shape<kH, kPW>::kDims], int i,
                                       Partials<kH, kPW>* pt) {
  pt->lt[i] = __fadd_rn(pt->lt[i], w);
#pragma unroll
  for (int d = 0; d < Shape<kH, kPW>::kDims; ++d) {
    pt->acct[i][d] = __fmaf_rn(w, vv[d], pt->acct[i][d]);
  }
}

// lt and e_i * v_i over the visible keys in increasing position, the lane's dimensions; scw
// holds the warp's e_i [kPW][64]. Keys go in groups of 4: a group every pair sees whole (all
// but the diagonal and window-edge tiles) loads its weights as one float4 per pair and skips
// the per-key mask tests; other groups take key by key. Each sum still adds its keys in
// increasing position, so both paths give the same bits.
template <int kH, int kPW>
__device__ __forceinline__ void TileSums(const Smem& sm, const float* scw, int lane,
                                         Partials<kH, kPW>* pt) {
  using S = Shape<kH, kPW>;
  uint64_t any = 0, all = ~0ull;
#pragma unroll
  for (int i = 0; i < kPW; ++i) {
    pt->lt[i] = 0.0f;
#pragma unroll
    for (int d = 0; d < S::kDims; ++d) pt->acct[i][d] = 0.0f;
    any |= pt->mask[i];
    all &= pt->mask[i];
  }
#pragma unroll 1
  for (int x0 = 0; x0 < kAttnTile; x0 += 4) {
    const unsigned g_any = static_cast<unsigned>(any >> x0) & 0xfu;
    if (g_any == 0) continue;  // uniform
    if ((static_cast<unsigned>(all >> x0) & 0xfu) == 0xfu) {
      float4 w4[kPW];
#pragma unroll
      for (int i = 0; i < kPW; ++i) {
        w4[i] = *reinterpret_cast<const float4*>(scw + i * S::kScRow + x0);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        float vv[S::kDims];
        LoadV<kH, kPW>(sm, x0 + u, lane, vv);
#pragma unroll
        for (int i = 0; i < kPW; ++i) {
          const float w = u == 0 ? w4[i].x : u == 1 ? w4[i].y : u == 2 ? w4[i].z : w4[i].w;
          AddKey<kH, kPW>(w, vv, i, pt);
        }
      }
      continue;
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int x = x0 + u;
      if (((g_any >> u) & 1u) == 0) continue;  // uniform
      float vv[S::kDims];
      LoadV<kH, kPW>(sm, x, lane, vv);
#pragma unroll
      for (int i = 0; i < kPW; ++i) {
        if (((pt->mask[i] >> x) & 1u) == 0) continue;  // uniform
        AddKey<kH, kPW>(scw[i * S::kScRow + x], vv, i, pt);
      }
    }
  }
}

// The warp's partials of staged tile j (chain ci): see the top of this file. Block-wide (the
// scores of a warp's pairs come from two warps, and it waits for the tile's V rows), so every
// warp of the block calls it.
template <int kH, int kPW>
__device__ __forceinline__ void TilePartials(const Smem& sm, int64_t j, int ci, int32_t window,
                                             float scale, int g_count, Partials<kH, kPW>* pt) {
  using S = Shape<kH, kPW>;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  TileMasks<kH, kPW>(sm, j, ci, window, g_count, warp, lane, pt->mask);
  TileScores<kH, kPW>(sm, scale, warp, lane);
  WaitTileV();  // V rows, and every warp's scores, for the whole block
  float* scw = sm.sc + warp * kPW * S::kScRow;  // the warp's [kPW][kScRow]
#pragma unroll
  for (int i = 0; i < kPW; ++i) {
    const float s[2] = {scw[i * S::kScRow + lane], scw[i * S::kScRow + lane + kWarpSize]};
    pt->mt[i] = TileMax(pt->mask[i], s, lane);
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int x = lane + u * kWarpSize;
      if ((pt->mask[i] >> x) & 1u) scw[i * S::kScRow + x] = expf(__fsub_rn(s[u], pt->mt[i]));
    }
  }
  __syncwarp();  // publishes the warp's weights to its lanes
  TileSums<kH, kPW>(sm, scw, lane, pt);
}

}  // namespace block
}  // namespace prism
