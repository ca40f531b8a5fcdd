// The digits attention split over key tiles, for steps with too few (token, head) rows to fill
// the GPU (a follow-up question: T = 64 on a 4K state is 16 blocks walking 64 tiles each; a
// 256-token question is 128 blocks): the same bits as the fused DigitAttendKernel, because a
// tile's partial (mt, lt, acct: attention_digits.h step 3) does not depend on the running state.
//   pass 1, DigitAttendKernel<kPartial>: grid z = `splits`; block (x, y, z) takes every
//     splits-th key tile of each of its passes and writes each row's tile partial as a record
//     to the workspace (no merge);
//   pass 2, DigitMergeKernel: a warp per (token, head) row merges the records in increasing
//     tile order exactly as TileUpdate does (first non-empty tile copied, then
//     DigitMergeFactors / DigitMerged) and writes out = Normalised(acc, l).
// A row's record slot is its tile index minus its own first tile (FirstTile(pos, window)), so a
// record is written by exactly one block. Rounds of `slots` tiles bound the workspace; the
// handler cannot see the tables, so it runs enough rounds for every tile the pool can hold
// (a chain's positions each have their own pool row). Rows that see more (a hand-written
// table that repeats pages) are recomputed afterwards by DigitAttendKernel<kFallback>, the
// fused kernel for just the blocks holding such rows: results never depend on the bound.
//
// Workspace (an f32 result of the call, sized by prism_jax/ops/tree_attention_digits.py):
// the running state [T * N][kRecord] kept between rounds, then one round's records
// [slots][T * N][kRecord], then the step's query rows as packed digit rows [T * N][2H + 16]
// bytes (cut once by DigitWriteKernel; pass 1's blocks copy them, StagePackedQueries). A record is acc [H] (channel d at d), m, l (l = 0: no visible key
// in the tile, skip it), 2 floats of padding. Records are read only where written in the same
// round, so nothing is cleared. Included by tree_attention_digits_cuda.cu only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/attention_digits.h"
#include "cc/ops/tree_attention.h"
#include "cc/ops/tree_attention_digits_stage.cuh"
#include "cc/ops/tree_attention_digits_tile.cuh"

namespace prism {
namespace digits {

constexpr int kRecordTail = 4;  // m, l, padding: 16-byte records
template <int kH>
constexpr int64_t Record() {
  return kH + kRecordTail;
}
constexpr int64_t kSplitMaxTokens = 512;  // tree_attention_digits.py DIGITS_SPLIT_MAX_TOKENS
constexpr int kMergeWarps = 4;
constexpr int kMergeBatch = 8;  // records a merge warp loads before merging them

// One round of the split: row-relative tiles [base, base + slots) of every row; rows seeing
// more than `covered` tiles (all rounds) are the fallback's.
struct Split {
  float* ws;
  int64_t slots, base, covered;
  int splits;
  int8_t* q_packed;  // the step's query rows as packed digit rows [T * N], or null
};

// f32 elements of the packed query rows at the workspace's end (rows of 2H + 16 bytes).
inline int64_t QueryFloats(int64_t rows, int64_t h) { return rows * PackedRowBytes(h) / 4; }

// Tiles row (pos) sees: FirstTile .. LastTile (tree_attention.h), none for pos < 0.
__device__ __forceinline__ int64_t TilesSeen(int64_t pos, int32_t window) {
  return pos < 0 ? 0 : LastTile(pos) - FirstTile(pos, window) + 1;
}

// The records of the warp's two rows for this tile: slot tile - FirstTile(row) - base of this
// round, or null for a row that is inactive or outside the round.
template <int kH>
__device__ __forceinline__ void RecordsOf(const RowPass& rp, const RowPlace (&mine)[2],
                                          int64_t tile, int32_t window, const Dims& dm,
                                          const Split& sp, float* (&rec)[2]) {
  const int64_t rows = dm.t * dm.n;
  for (int h = 0; h < 2; ++h) {
    const int64_t slot = tile - FirstTile(rp.pos[h], window) - sp.base;
    const bool inside = rp.active[h] && tile <= LastTile(rp.pos[h]) && slot >= 0 && slot < sp.slots;
    rec[h] = inside ? sp.ws + ((1 + slot) * rows + mine[h].token * dm.n + mine[h].head) *
                                  Record<kH>()
                    : nullptr;
  }
}

// A record's tail after TileUpdate<kPartial> wrote its acct: m, l (l = 0: no visible key).
template <int kH>
__device__ __forceinline__ void WriteTails(const WarpState<kH>& st, float* const (&rec)[2]) {
  if (threadIdx.x % 4 != 0) return;
  for (int h = 0; h < 2; ++h) {
    if (rec[h] != nullptr) *reinterpret_cast<float2*>(rec[h] + kH) = make_float2(st.m[h], st.l[h]);
  }
}

// Whether any row of the block sees more tiles than the split covers (the fallback's blocks).
__device__ __forceinline__ bool BlockExceeds(const Dims& dm, const Tables& tb, int64_t t0, int kvh,
                                             int32_t window, int64_t covered) {
  bool over = false;
  if (threadIdx.x < kRows) {
    const RowPlace pl = PlaceOf(static_cast<int>(threadIdx.x), t0, dm, kvh);
    if (pl.token >= 0) {
      const int64_t chain = tb.chain_of[pl.token], pos = tb.positions[pl.token];
      over = chain >= 0 && chain < dm.c && TilesSeen(pos, window) > covered;
    }
  }
  return __syncthreads_or(over) != 0;
}

// Lane l's channels of a row: kE consecutive floats from kE l (one vector load per record).
template <int kH>
constexpr int kMergeE = kH / kWarpSize;

template <int kE>
__device__ __forceinline__ void LoadChannels(const float* p, float (&x)[kE]) {
#pragma unroll
  for (int e = 0; e < kE; ++e) x[e] = p[e];
}

// Pass 2: a warp per (token, head) row, the round's records merged in slot order into the
// state (from the workspace unless first_round), then the state kept (or, after the last
// round, out written).
template <typename T, int kH>
__global__ void __launch_bounds__(kMergeWarps * kWarpSize)
    DigitMergeKernel(Dims dm, Tables tb, int32_t window, Split sp, bool first_round,
                     bool last_round, T* __restrict__ out) {
  constexpr int kE = kMergeE<kH>;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t rows = dm.t * dm.n;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kMergeWarps + threadIdx.x / kWarpSize;
  if (row >= rows) return;
  const int64_t token = row / dm.n;
  const int64_t chain = tb.chain_of[token], pos = tb.positions[token];
  const bool valid = chain >= 0 && chain < dm.c && pos >= 0;
  float m = 0.0f, l = 0.0f, acc[kE] = {};
  float* state = sp.ws + row * Record<kH>();
  if (!first_round) {
    LoadChannels(state + kE * lane, acc);
    m = state[kH], l = state[kH + 1];
  }
  const int64_t left = valid ? TilesSeen(pos, window) - sp.base : 0;
  const int64_t count = left < 0 ? 0 : (left < sp.slots ? left : sp.slots);
  for (int64_t s0 = 0; s0 < count; s0 += kMergeBatch) {
    float acct[kMergeBatch][kE], mt[kMergeBatch], lt[kMergeBatch];
#pragma unroll
    for (int b = 0; b < kMergeBatch; ++b) {  // loads first: their latencies overlap
      lt[b] = 0.0f;
      if (s0 + b >= count) continue;
      const float* rec = sp.ws + ((1 + s0 + b) * rows + row) * Record<kH>();
      LoadChannels(rec + kE * lane, acct[b]);
      mt[b] = rec[kH], lt[b] = rec[kH + 1];
    }
#pragma unroll
    for (int b = 0; b < kMergeBatch; ++b) {  // TileUpdate's merge, tile by tile
      if (lt[b] == 0.0f) continue;  // no visible key (or past count)
      const bool first = l == 0.0f;
      const DigitMerge mw = DigitMergeFactors(m, mt[b]);
#pragma unroll
      for (int e = 0; e < kE; ++e) {
        acc[e] = first ? acct[b][e] : DigitMerged(acc[e], mw.a, acct[b][e], mw.b);
      }
      l = first ? lt[b] : DigitMerged(l, mw.a, lt[b], mw.b);
      m = first ? mt[b] : mw.m;
    }
  }
  if (last_round) {
#pragma unroll
    for (int e = 0; e < kE; ++e) FromF32(Normalised(acc[e], l), out + row * kH + kE * lane + e);
    return;
  }
#pragma unroll
  for (int e = 0; e < kE; ++e) state[kE * lane + e] = acc[e];
  if (lane == 0) state[kH] = m, state[kH + 1] = l;
}

}  // namespace digits
}  // namespace prism
