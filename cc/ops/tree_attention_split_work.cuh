// The split kernel's work bookkeeping (tree_attention_split.cuh): a round's tiles, each query
// tile's span of key tiles and the span table pass 1's block 0 writes for the later kernels, the
// round's work list every pass-1 block builds, and the partial records pass 1 writes.
// Record layout: acc [H], then kTail floats (m or mt, l or lt, seen, padding).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cc/cuda_common.cuh"
#include "cc/ops/tree_attention.h"
#include "cc/ops/tree_attention_block.cuh"
#include "cc/ops/tree_attention_lanes.cuh"

namespace prism {
namespace split {

constexpr int kTail = 4;  // record floats after acc: m, l, seen, padding (16-byte records)
template <int kH>
constexpr int Record() {
  return kH + kTail;
}

// One round: tiles [base, base + slots) of each block's span; blocks spanning more than
// `covered` tiles (all rounds together) are the fallback's.
struct Round {
  int64_t base, slots, covered;
};

// Tiles seen by the valid tokens of [t0, t0 + qt) (ListChains's j_lo, j_hi; hi < lo: none),
// and how many runs of one chain those tokens form.
struct Span {
  int64_t lo, hi, runs;
};
// Tokens are read kSpanLoads at a time, every load in flight before any is used: each block of
// pass 1 runs this for every query tile before its first item (~3-5 us of a 40-55 us call at
// one load pair per token, clock64 probe on the H200, results/e2e_h200_session27/).
constexpr int kSpanLoads = 8;
__device__ __forceinline__ Span BlockSpan(const Dims& dm, const Tables& tb, int32_t window,
                                          int64_t t0, int qt) {
  Span sp{0, -1, 0};
  int64_t last_chain = -1;
  for (int i0 = 0; i0 < qt; i0 += kSpanLoads) {
    int32_t pos[kSpanLoads], chain[kSpanLoads];
#pragma unroll
    for (int u = 0; u < kSpanLoads; ++u) {  // past the tile or the step: padding
      const int64_t t = t0 + i0 + u;
      const bool in = i0 + u < qt && t < dm.t;
      pos[u] = in ? tb.positions[t] : -1;
      chain[u] = in ? tb.chain_of[t] : -1;
    }
#pragma unroll
    for (int u = 0; u < kSpanLoads; ++u) {
      if (pos[u] < 0 || chain[u] < 0 || chain[u] >= dm.c) continue;
      const int64_t a = FirstTile(pos[u], window), b = LastTile(pos[u]);
      sp.lo = sp.hi < sp.lo ? a : (a < sp.lo ? a : sp.lo);
      sp.hi = b > sp.hi ? b : sp.hi;
      sp.runs += chain[u] != last_chain;
      last_chain = chain[u];
    }
  }
  return sp;
}

// A block stages each tile once per chain run and then works on that run's pairs only, so a
// block of one-token chains (decode rows) pays a tile load per pair: measured on the H200 (64
// sequences x 2K keys) 3.1x slower than the lanes kernel, which such blocks take instead. One
// chain (a follow-up question on a long state) is where the split pays (53 -> 26 ms per 27B
// step). Blocks in between were not measured; the threshold keeps small forests on the split.
constexpr int64_t kMaxSplitRuns = 4;

// Whether the block's queries are the fallback's (lanes warp): too many chains for a shared
// tile, or tiles beyond what the rounds cover.
__device__ __forceinline__ bool Overflows(const Span& sp, const Round& rd) {
  return sp.runs > kMaxSplitRuns || sp.hi - sp.lo + 1 > rd.covered;
}

// kN floats to global memory (vector stores: records and lane slices are 8-byte aligned, and
// 16-byte aligned when kN is a multiple of 4).
template <int kN>
__device__ __forceinline__ void StoreDims(float* p, const float (&v)[kN]) {
  if constexpr (kN % 4 == 0) {
#pragma unroll
    for (int j = 0; j < kN / 4; ++j) {
      reinterpret_cast<float4*>(p)[j] = make_float4(v[4 * j], v[4 * j + 1], v[4 * j + 2],
                                                    v[4 * j + 3]);
    }
  } else {
    static_assert(kN % 2 == 0, "lane slices are pairs of floats at least");
#pragma unroll
    for (int j = 0; j < kN / 2; ++j) {
      reinterpret_cast<float2*>(p)[j] = make_float2(v[2 * j], v[2 * j + 1]);
    }
  }
}

// Writes the warp's pairs' partials of one chain (those with a visible key) to slot's records.
template <int kH, int kPW>
__device__ __forceinline__ void WritePartials(const block::Partials<kH, kPW>& pt,
                                              const Dims& dm, int64_t t0, int64_t kvh,
                                              int g_count, float* slot_part, unsigned* done) {
  constexpr int kDims = block::Shape<kH, kPW>::kDims;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
#pragma unroll
  for (int i = 0; i < kPW; ++i) {
    const int p = warp * kPW + i;
    const int64_t t = t0 + p / g_count, n = kvh * g_count + p % g_count;
    if (pt.mask[i] == 0 || t >= dm.t) continue;  // uniform
    float* rec = slot_part + (t * dm.n + n) * Record<kH>();
    StoreDims<kDims>(rec + lane * kDims, pt.acct[i]);
    if (lane == 0) {
      *reinterpret_cast<float4*>(rec + kH) = make_float4(pt.mt[i], pt.lt[i], 1.0f, 0.0f);
    }
    *done |= 1u << i;
  }
}

// Marks the warp's pairs that no chain gave a partial as "no visible key" in the slot.
template <int kH, int kPW>
__device__ __forceinline__ void WriteEmpty(const Dims& dm, int64_t t0, int64_t kvh, int g_count,
                                           float* slot_part, unsigned done) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  if (lane >= kPW || ((done >> lane) & 1u)) return;
  const int p = warp * kPW + lane;
  const int64_t t = t0 + p / g_count, n = kvh * g_count + p % g_count;
  if (t < dm.t) slot_part[(t * dm.n + n) * Record<kH>() + kH + 2] = 0.0f;
}

// The span table: per query tile b, its span's first and last tile and whether it is the
// fallback's (kSpanFields int32 each, after the workspace's records). Pass 1's block 0 writes it
// (every round writes the same values); the merge and fallback kernels read it instead of
// walking the tile's tokens again in every warp.
constexpr int kSpanFields = 3;
__device__ __forceinline__ void StoreSpan(int32_t* table, int b, const Span& sp, bool over) {
  table[kSpanFields * b] = static_cast<int32_t>(sp.lo);
  table[kSpanFields * b + 1] = static_cast<int32_t>(sp.hi);
  table[kSpanFields * b + 2] = over ? 1 : 0;
}
struct TileSpan {
  int64_t lo, hi;
  bool over;
};
__device__ __forceinline__ TileSpan LoadSpan(const int32_t* table, int64_t b) {
  return {table[kSpanFields * b], table[kSpanFields * b + 1], table[kSpanFields * b + 2] != 0};
}

// The round's work list, built by every block of pass 1 from the tables: query tile b has
// ends[b] - ends[b - 1] tiles in this round (its span's tiles from rd.base on, at most rd.slots;
// none when the tile is the fallback's), the first of them first[b]. Items (tile, kv head) are
// numbered tile-major, so the grid only ever sees tiles that exist: no empty blocks over the
// pool's capacity (decode steps and short prefixes paid for those).
constexpr int kMaxQueryTiles = 256;  // ceil(T / Qt) of a split step (the handler checks)
struct WorkList {
  int32_t ends[kMaxQueryTiles];   // inclusive prefix sums of the tiles per query tile
  int32_t first[kMaxQueryTiles];  // absolute index of the query tile's first tile this round
};

// Block-wide; ends with a barrier. The prefix sum is warp 0's: kMaxQueryTiles / 32 entries
// per lane summed serially, then an inclusive shuffle scan over the lanes.
__device__ __forceinline__ void BuildWorkList(const Dims& dm, const Tables& tb, int32_t window,
                                              int qt, int nb, const Round& rd, WorkList* wl,
                                              int32_t* table) {
  for (int b = static_cast<int>(threadIdx.x); b < nb; b += static_cast<int>(blockDim.x)) {
    const Span sp = BlockSpan(dm, tb, window, static_cast<int64_t>(b) * qt, qt);
    const bool over = Overflows(sp, rd);
    if (table != nullptr) StoreSpan(table, b, sp, over);
    const int64_t left = sp.hi - (sp.lo + rd.base) + 1;
    const int64_t n = over || left < 0 ? 0 : (left < rd.slots ? left : rd.slots);
    wl->ends[b] = static_cast<int32_t>(n);
    wl->first[b] = static_cast<int32_t>(sp.lo + rd.base);
  }
  __syncthreads();
  constexpr int kPerLane = kMaxQueryTiles / kWarpSize;
  if (threadIdx.x < kWarpSize) {
    const int lane = static_cast<int>(threadIdx.x), b0 = lane * kPerLane;
    int32_t sum = 0;
    for (int b = b0; b < b0 + kPerLane && b < nb; ++b) sum += wl->ends[b];
    int32_t before = sum;  // inclusive scan of the lanes' sums
#pragma unroll
    for (int off = 1; off < kWarpSize; off *= 2) {
      const int32_t v = __shfl_up_sync(kFullMask, before, off);
      if (lane >= off) before += v;
    }
    int32_t run = before - sum;  // exclusive: the tiles of the lanes below
    for (int b = b0; b < b0 + kPerLane && b < nb; ++b) {
      run += wl->ends[b];
      wl->ends[b] = run;
    }
  }
  __syncthreads();
}

// The query tile holding work position pos (< ends[nb - 1]): the first b with ends[b] > pos.
__device__ __forceinline__ int QueryTileOf(const WorkList& wl, int nb, int64_t pos) {
  int lo = 0, hi = nb - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (wl.ends[mid] > pos) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

}  // namespace split
}  // namespace prism
