// Tree attention, the fast path of tree_attention_cuda.cu for head dims H in {64, 128, 256}
// (H a multiple of 32 and of kVec, at most kStride: every model we serve).
//
// Same grid and the same bits as AttendKernel (one warp per (token, query head), tiles in
// increasing order, tree_attention.h's numerics); what changes is how the work is laid out.
// AttendKernel walks a tile's keys one at a time, each key a chain of dependent loads and
// shuffles, and loads each V row once per round trip. Here (1) the warp splits into groups of
// H / kVec lanes that score several keys at once, kRounds keys per group with their loads in
// flight together, in the canonical dot order (lane partials, then the butterfly's levels);
// (2) the tile's max and its sum of e_i are taken in increasing position from shared memory
// exactly as TileStep does; (3) e_i * v_i is accumulated per dimension in increasing position,
// each lane owning H / 32 dimensions, with a batch of V rows loaded before any is added.
// Every row is read by consecutive lanes (coalesced). Included by tree_attention_cuda.cu only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/tree_attention.h"

namespace prism {
namespace lanes {

constexpr int kWarps = 4;                           // warps (queries x heads) per block
constexpr int kTileParts = kAttnTile / kWarpSize;   // tile positions per lane

template <int kH>
struct Shape {
  static_assert(kH % kVec == 0 && kH % kWarpSize == 0 && kH <= kStride,
                "the lane kernel needs H a multiple of 32 and kVec, at most kStride");
  static constexpr int kParts = kH / kVec;      // lanes of the canonical order holding elements
  static constexpr int kDims = kH / kWarpSize;  // output dimensions per lane
};

// kN consecutive elements as f32 (vector loads when kN is a multiple of 4; p is then aligned:
// rows are H-element multiples and a lane's slice starts at lane * kN).
template <int kN>
__device__ __forceinline__ void LoadDims(const float* p, float (&v)[kN]) {
  if constexpr (kN % 4 == 0) {
#pragma unroll
    for (int j = 0; j < kN / 4; ++j) {
      const float4 a = reinterpret_cast<const float4*>(p)[j];
      v[4 * j] = a.x, v[4 * j + 1] = a.y, v[4 * j + 2] = a.z, v[4 * j + 3] = a.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) v[i] = p[i];
  }
}
template <int kN>
__device__ __forceinline__ void LoadDims(const uint16_t* p, float (&v)[kN]) {
  if constexpr (kN % 4 == 0) {
#pragma unroll
    for (int j = 0; j < kN / 4; ++j) {
      const uint2 u = reinterpret_cast<const uint2*>(p)[j];
      v[4 * j] = Bf16ToF32(static_cast<uint16_t>(u.x & 0xffffu));
      v[4 * j + 1] = Bf16ToF32(static_cast<uint16_t>(u.x >> 16));
      v[4 * j + 2] = Bf16ToF32(static_cast<uint16_t>(u.y & 0xffffu));
      v[4 * j + 3] = Bf16ToF32(static_cast<uint16_t>(u.y >> 16));
    }
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) v[i] = Bf16ToF32(p[i]);
  }
}

// One warp's running softmax state: m and l (equal on every lane) and the lane's dimensions.
template <int kH>
struct State {
  float acc[Shape<kH>::kDims];
  float m, l;
};

// Per-warp shared scratch of one tile: pool rows (-1: invisible), then scores, then e_i.
struct TileScratch {
  int64_t row[kAttnTile];
  float e[kAttnTile];
};

// The tile's scores into ts->e (visible keys only), dot(q, k) * scale in WarpDot's bits. The
// warp splits into kGroups groups of kParts lanes, one key per group per round; lane p of a
// group holds q's chunk p and loads chunk p of the key row, so a row is read by consecutive
// lanes (coalesced). The canonical butterfly's levels with off >= kParts only add the +0 of
// lanes that own no element (done as `acc + 0`); the others are xor shuffles, which stay
// inside the group. kRounds rounds load before any is summed, so their loads overlap.
template <typename KV, int kH>
__device__ __forceinline__ void TileScores(const float (&qc)[kVec], const KV* k_pool,
                                           int64_t stride, int64_t kvh, float scale, int lane,
                                           TileScratch* ts) {
  constexpr int kParts = Shape<kH>::kParts;
  constexpr int kGroups = kWarpSize / kParts;
  constexpr int kRounds = 8;
  constexpr int kBatchKeys = kGroups * kRounds;
  static_assert(kWarpSize % kParts == 0 && kAttnTile % kBatchKeys == 0, "rounds tile the tile");
  const int group = lane / kParts, part = lane % kParts;
#pragma unroll 1
  for (int i0 = 0; i0 < kAttnTile; i0 += kBatchKeys) {
    float kv[kRounds][kVec];
    int64_t rr[kRounds];
#pragma unroll
    for (int u = 0; u < kRounds; ++u) {
      rr[u] = ts->row[i0 + u * kGroups + group];
      if (rr[u] >= 0) {
        LoadDims(k_pool + rr[u] * stride + kvh * kH + part * kVec, kv[u]);
      } else {
#pragma unroll
        for (int i = 0; i < kVec; ++i) kv[u][i] = 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < kRounds; ++u) {
      float acc = 0.0f;
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc = __fmaf_rn(qc[i], kv[u][i], acc);
#pragma unroll
      for (int level = 0; level < 5; ++level) {
        const int off = (kWarpSize / 2) >> level;
        acc = __fadd_rn(acc, off >= kParts ? 0.0f : __shfl_xor_sync(kFullMask, acc, off));
      }
      if (part == 0 && rr[u] >= 0) ts->e[i0 + u * kGroups + group] = __fmul_rn(acc, scale);
    }
  }
}

// Tile partial (mt, lt, acct) of TileStep, merged into st the same way.
template <typename KV, int kH>
__device__ __forceinline__ void TileStep(const float (&qc)[kVec], const KV* k_pool,
                                         const KV* v_pool, const int64_t (&rows)[kTileParts],
                                         int64_t stride, int64_t kvh, float scale, int lane,
                                         TileScratch* ts, State<kH>* st) {
  constexpr int kDims = Shape<kH>::kDims;
#pragma unroll
  for (int part = 0; part < kTileParts; ++part) ts->row[part * kWarpSize + lane] = rows[part];
  __syncwarp();
  TileScores<KV, kH>(qc, k_pool, stride, kvh, scale, lane, ts);
  __syncwarp();
  float mt = 0.0f;
  bool seen = false;
#pragma unroll 16
  for (int i = 0; i < kAttnTile; ++i) {  // TileStep's max: increasing position
    if (ts->row[i] < 0) continue;
    const float s = ts->e[i];
    mt = !seen || mt < s ? s : mt;
    seen = true;
  }
  __syncwarp();  // every lane has read the scores before they become e_i
#pragma unroll
  for (int part = 0; part < kTileParts; ++part) {
    const int i = part * kWarpSize + lane;
    if (rows[part] >= 0) ts->e[i] = expf(__fsub_rn(ts->e[i], mt));
  }
  __syncwarp();
  // Increasing position, as TileStep; kBatch rows' values are loaded before any is added, so
  // their loads are in flight together (one row per round trip made a tile cost 64 L2 trips).
  constexpr int kBatch = 32 / kDims;  // 32 registers of values
  float lt = 0.0f, acct[kDims] = {};
#pragma unroll 1
  for (int i0 = 0; i0 < kAttnTile; i0 += kBatch) {
    float vv[kBatch][kDims];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t r = ts->row[i0 + u];
      if (r >= 0) LoadDims(v_pool + r * stride + kvh * kH + lane * kDims, vv[u]);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (ts->row[i0 + u] < 0) continue;  // absent keys are never added (uniform per warp)
      const float w = ts->e[i0 + u];
      lt = __fadd_rn(lt, w);
#pragma unroll
      for (int d = 0; d < kDims; ++d) acct[d] = __fmaf_rn(w, vv[u][d], acct[d]);
    }
  }
  __syncwarp();  // the next tile overwrites the scratch
  const bool first = st->l == 0.0f;
  const MergeWeights mw = first ? MergeWeights{mt, 0.0f, 1.0f} : MergeFactors(st->m, mt);
  st->m = mw.m;
  st->l = first ? lt : Merged(st->l, mw.a, lt, mw.b);
#pragma unroll
  for (int d = 0; d < kDims; ++d) {
    st->acc[d] = first ? acct[d] : Merged(st->acc[d], mw.a, acct[d], mw.b);
  }
}

// The work of one warp: query w = t * N + n over all its tiles, then out[t, n]. Shared by
// LaneAttendKernel and the split kernel's fallback (tree_attention_split.cuh).
template <typename Q, typename KV, int kH>
__device__ __forceinline__ void AttendWarp(const Q* q, const KV* k_pool, const KV* v_pool,
                                           const Dims& dm, const Tables& tb, float scale,
                                           int32_t window, int64_t w, int lane,
                                           TileScratch* scratch, Q* out) {
  const int64_t t = w / dm.n, n = w % dm.n, kvh = n / (dm.n / dm.k);
  const int64_t pos = tb.positions[t], chain = tb.chain_of[t];
  State<kH> st = {};
  if (pos >= 0 && chain >= 0 && chain < dm.c) {
    float qc[kVec];  // q's chunk of this lane's place in its group (see TileScores)
    LoadChunk(q + w * kH + (lane % Shape<kH>::kParts) * kVec, kVec, qc);
    const int32_t* seg = tb.segs + chain * dm.s * kSegFields;
    for (int64_t j = FirstTile(pos, window); j <= LastTile(pos); ++j) {
      int64_t rows[kTileParts];
      bool any = false;
#pragma unroll
      for (int part = 0; part < kTileParts; ++part) {
        const int64_t p = j * kAttnTile + part * kWarpSize + lane;
        const int64_t r = KeyRow(seg, dm.s, tb.pages_flat, dm.pt, dm.p, dm.l, p);
        rows[part] = r >= 0 && KeyVisible(p, pos, window) ? r : -1;
        any = any || rows[part] >= 0;
      }
      if (!__any_sync(kFullMask, any)) continue;
      TileStep<KV, kH>(qc, k_pool, v_pool, rows, dm.k * kH, kvh, scale, lane, scratch, &st);
    }
  }
  constexpr int kDims = Shape<kH>::kDims;
#pragma unroll
  for (int d = 0; d < kDims; ++d) {
    FromF32(Normalised(st.acc[d], st.l), out + w * kH + lane * kDims + d);
  }
}

// One warp per (token t, query head n), like AttendKernel.
template <typename Q, typename KV, int kH>
__global__ void __launch_bounds__(kWarps * kWarpSize)
    LaneAttendKernel(const Q* __restrict__ q, const KV* __restrict__ k_pool,
                     const KV* __restrict__ v_pool, Dims dm, Tables tb, float scale,
                     int32_t window, Q* __restrict__ out) {
  __shared__ TileScratch scratch[kWarps];
  const int wib = static_cast<int>(threadIdx.x / kWarpSize);
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kWarps + wib;
  if (w >= dm.t * dm.n) return;  // uniform per warp; the kernel has no block barrier
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  AttendWarp<Q, KV, kH>(q, k_pool, v_pool, dm, tb, scale, window, w, lane, &scratch[wib], out);
}

}  // namespace lanes
}  // namespace prism
