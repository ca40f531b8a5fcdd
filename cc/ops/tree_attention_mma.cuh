// Tree attention's tile arithmetic on tensor cores ("tf32x3" dots, PRISM_TREE_ATTENTION_DOTS):
// the block machinery's scores and value sums (tree_attention_block_tile.cuh) as warp MMAs
// (mma.sync m16n8k8, TF32 in, f32 accumulate) with each f32 operand split into a TF32 head and
// a TF32 tail, x = hi + lo, and every product taken as lo * hi + hi * lo + hi * hi (the lo * lo
// term, ~2^-22 of the product, is dropped): f32-class accuracy at a few MMAs a tile.
//
// Why the bits are still those of the query alone: an MMA's output element (row i, column j)
// is a fixed function of row i of A, column j of B and the accumulator's (i, j), so a pair's
// scores and sums never see another pair's row; keys sit in the MMA's k slots at their
// ABSOLUTE tile position (x = position - 64 j), the k steps run in increasing order, and an
// invisible or absent key enters as an exact zero weight against a zeroed V row. So a pair's
// tile partial depends only on its q, its visible keys' k/v and their positions, as with the
// canonical dots; the bits differ from the canonical (FMA) kernels', so a step takes every tile
// from this code or none (tree_attention_launch.cuh routes every kernel choice accordingly).
// Warps: 8, pairs 32 (two m16 tiles). Scores: warp w takes pairs 16 (w / 4) .. + 15 and keys
// 16 (w % 4) .. + 15 (two n8 tiles), over H / 8 k steps. Sums: warp w takes the same pairs and
// dimensions (w % 4) H / 4 .. + H / 4 - 1, over the tile's 8 k steps of 8 keys. lt: per pair,
// 8 lanes each add 8 keys' weights in increasing position, then a butterfly over the 8 lanes.
// K and V pass through one shared-memory buffer (V staged after the scores), so three blocks
// fit an SM at H <= 128, where the canonical kernels fit two.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cc/cuda_common.cuh"
#include "cc/ops/tree_attention.h"
#include "cc/ops/tree_attention_block_stage.cuh"
#include "cc/ops/tree_attention_block_tile.cuh"

namespace prism {
namespace block {

// x = hi + lo, both TF32 (f32 bit patterns with the low 13 mantissa bits zero), hi = x rounded
// to nearest (ties away), lo = the remainder rounded again.
struct Tf32Pair {
  uint32_t hi, lo;
};
__device__ __forceinline__ uint32_t ToTf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ Tf32Pair SplitTf32(float x) {
  const uint32_t hi = ToTf32(x);
  return {hi, ToTf32(__fsub_rn(x, __uint_as_float(hi)))};
}

// d += a * b, one m16n8k8 TF32 MMA (a: 4 registers of the 16x8 row-major tile, b: 2 of the
// 8x8 column-major tile, d: 4 of the 16x8 f32 tile; PTX ISA "mma.m16n8k8" fragment layouts).
__device__ __forceinline__ void MmaTf32(float (&d)[4], const uint32_t (&a)[4],
                                        uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d += a * b in three MMAs, small terms first: lo * hi, hi * lo, hi * hi.
__device__ __forceinline__ void Mma3xTf32(float (&d)[4], const Tf32Pair (&a)[4],
                                          const Tf32Pair& b0, const Tf32Pair& b1) {
  const uint32_t ahi[4] = {a[0].hi, a[1].hi, a[2].hi, a[3].hi};
  const uint32_t alo[4] = {a[0].lo, a[1].lo, a[2].lo, a[3].lo};
  MmaTf32(d, alo, b0.hi, b1.hi);
  MmaTf32(d, ahi, b0.lo, b1.lo);
  MmaTf32(d, ahi, b0.hi, b1.hi);
}

// The A fragment at column k0 of a row-major f32 tile in shared memory (rows r0 .. r0 + 15,
// row stride `stride` floats): a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4).
__device__ __forceinline__ void LoadA(const float* tile, int stride, int r0, int k0, int lane,
                                      Tf32Pair (&a)[4]) {
  const int g = lane / 4, t = lane % 4;
  const float* p = tile + (r0 + g) * stride + k0 + t;
  a[0] = SplitTf32(p[0]);
  a[1] = SplitTf32(p[8 * stride]);
  a[2] = SplitTf32(p[4]);
  a[3] = SplitTf32(p[8 * stride + 4]);
}

// Scores of the staged tile, every pair with every key, times scale, into sm.sc [pair][key]
// (the layout TileScores writes). Block-wide: every warp calls it.
template <int kH, int kPW>
__device__ __forceinline__ void MmaScores(const Smem& sm, float scale, int warp, int lane) {
  using S = Shape<kH, kPW>;
  static_assert(S::kPairs == 32 && kWarps == 8, "tf32x3 dots: 8 warps over 32 pairs x 64 keys");
  const int g = lane / 4, t = lane % 4;
  const int m0 = (warp / 4) * 16, n0 = (warp % 4) * 16;
  float d[2][4] = {};
#pragma unroll 4
  for (int k0 = 0; k0 < kH; k0 += 8) {
    Tf32Pair a[4];
    LoadA(sm.qs, S::kQRow, m0, k0, lane, a);
#pragma unroll
    for (int u = 0; u < 2; ++u) {  // B[k][n] = K[key n0 + 8u + n][k0 + k]
      const float* kp = sm.kt + (n0 + 8 * u + g) * S::kRow + k0 + t;
      Mma3xTf32(d[u], a, SplitTf32(kp[0]), SplitTf32(kp[4]));
    }
  }
#pragma unroll
  for (int u = 0; u < 2; ++u) {  // d: (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)
    const int key = n0 + 8 * u + 2 * t;
    float* r0 = sm.sc + (m0 + g) * S::kScRow + key;
    float* r1 = r0 + 8 * S::kScRow;
    r0[0] = __fmul_rn(d[u][0], scale), r0[1] = __fmul_rn(d[u][1], scale);
    r1[0] = __fmul_rn(d[u][2], scale), r1[1] = __fmul_rn(d[u][3], scale);
  }
}

// acct [pair][d] = sum over the tile's 64 keys of e [pair][key] * V [key][d], e in sm.sc (0
// for keys the pair does not see; V rows of keys no pair sees are zero), written to `out`
// ([32][kRow] floats: V's own buffer, so a barrier separates the last read from the stores).
// Block-wide.
template <int kH, int kPW>
__device__ __forceinline__ void MmaValues(const Smem& sm, int warp, int lane, float* out) {
  using S = Shape<kH, kPW>;
  constexpr int kTiles = kH / 4 / 8;  // n8 tiles of the warp's H / 4 dimensions
  const int g = lane / 4, t = lane % 4;
  const int m0 = (warp / 4) * 16, c0 = (warp % 4) * (kH / 4);
  float d[kTiles][4] = {};
#pragma unroll 2
  for (int k0 = 0; k0 < kAttnTile; k0 += 8) {
    Tf32Pair a[4];
    LoadA(sm.sc, S::kScRow, m0, k0, lane, a);
#pragma unroll
    for (int u = 0; u < kTiles; ++u) {  // B[k][n] = V[key k0 + k][c0 + 8u + n]
      const float* vp = sm.vt + (k0 + t) * S::kRow + c0 + 8 * u + g;
      Mma3xTf32(d[u], a, SplitTf32(vp[0]), SplitTf32(vp[4 * S::kRow]));
    }
  }
  __syncthreads();  // every warp is done reading V
#pragma unroll
  for (int u = 0; u < kTiles; ++u) {
    const int c = c0 + 8 * u + 2 * t;
    *reinterpret_cast<float2*>(out + (m0 + g) * S::kRow + c) = make_float2(d[u][0], d[u][1]);
    *reinterpret_cast<float2*>(out + (m0 + g + 8) * S::kRow + c) =
        make_float2(d[u][2], d[u][3]);
  }
}

// The warp's pairs' lt from their weights in scw (0 for keys a pair does not see): lane l adds
// pair l / 8's keys 8 (l % 8) .. + 7 in increasing position, then lanes 8 apart combine by a
// butterfly (offsets 4, 2, 1); every lane then gets each pair's sum.
template <int kH, int kPW>
__device__ __forceinline__ void MmaWeightSums(const float* scw, int lane, Partials<kH, kPW>* pt) {
  using S = Shape<kH, kPW>;
  static_assert(kPW * 8 == kWarpSize, "lt: 8 lanes a pair");
  const float4* w = reinterpret_cast<const float4*>(scw + (lane / 8) * S::kScRow + (lane % 8) * 8);
  const float4 a = w[0], b = w[1];
  const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < 8; ++k) sum = __fadd_rn(sum, x[k]);
#pragma unroll
  for (int off = 4; off > 0; off /= 2) sum = __fadd_rn(sum, __shfl_xor_sync(kFullMask, sum, off));
#pragma unroll
  for (int i = 0; i < kPW; ++i) pt->lt[i] = __shfl_sync(kFullMask, sum, i * 8);
}

// The tensor-core counterpart of TilePartials (tree_attention_block_tile.cuh): the warp's
// partials of tile j (chain ci), whose K rows StageTile<..., kOneKv = true> staged; V goes
// through the same buffer here. Block-wide: every warp calls it.
template <typename KV, int kH, int kPW>
__device__ __forceinline__ void MmaTilePartials(const Smem& sm, const KV* v_pool, int64_t stride,
                                                int64_t kvh, int64_t j, int ci, int32_t window,
                                                float scale, int g_count,
                                                Partials<kH, kPW>* pt) {
  using S = Shape<kH, kPW>;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  TileMasks<kH, kPW>(sm, j, ci, window, g_count, warp, lane, pt->mask);
  MmaScores<kH, kPW>(sm, scale, warp, lane);
  __syncthreads();  // every warp's scores; every warp is done with K
  LoadRows<KV, kH, kPW, false>(v_pool, stride, kvh, sm.rows, sm.vt);  // lands during the softmax
  float* scw = sm.sc + warp * kPW * S::kScRow;  // the warp's [kPW][kScRow]
#pragma unroll
  for (int i = 0; i < kPW; ++i) {
    const float s[2] = {scw[i * S::kScRow + lane], scw[i * S::kScRow + lane + kWarpSize]};
    pt->mt[i] = TileMax(pt->mask[i], s, lane);
#pragma unroll
    for (int u = 0; u < 2; ++u) {  // every key gets a weight: the MMA sums all 64
      const int x = lane + u * kWarpSize;
      const bool seen = (pt->mask[i] >> x) & 1u;
      scw[i * S::kScRow + x] = seen ? expf(__fsub_rn(s[u], pt->mt[i])) : 0.0f;
    }
  }
  __syncwarp();  // publishes the warp's weights to its lanes
  MmaWeightSums<kH, kPW>(scw, lane, pt);
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  __syncthreads();  // every warp's weights and the V rows
  MmaValues<kH, kPW>(sm, warp, lane, sm.vt);
  __syncthreads();  // acct of every pair in V's buffer
  const float* acc = sm.vt + warp * kPW * S::kRow + lane * S::kDims;
#pragma unroll
  for (int i = 0; i < kPW; ++i) {
#pragma unroll
    for (int d = 0; d < S::kDims; ++d) pt->acct[i][d] = acc[i * S::kRow + d];
  }
}

}  // namespace block
}  // namespace prism
