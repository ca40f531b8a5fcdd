// Tree attention, the split kernel's in-order merge (tree_attention_split.cuh): one (token,
// query head) pair's tile partials, merged in increasing tile order into its running
// (m, l, acc) exactly as TileStep does, and out[t, n] = Normalised(acc, l). Two callers run
// this one piece of code, so they cannot disagree on a bit:
//   MergeKernel (pass 2, one warp per pair), for every step that has it;
//   pass 1 itself (FusedMerge) in steps of more than 64 tokens: the block that finishes the
//     last tile of a (query tile, kv head) merges that query tile's pairs when their span is
//     short (ShortSpan: at most kFusedMaxSlots tiles, all in round 0). A one-question or forest step then skips pass 2's
//     work (its launch still runs: it writes the pairs no block merged). Completion is counted
//     per (query tile, kv head) with an atomic after a fence; the merging block reads the
//     records through L2 (ld.global.cg), never a stale L1 line another pair's merge left there.
// Included by tree_attention_split.cuh only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/tree_attention.h"

namespace prism {
namespace split {

constexpr int kTail = 4;  // record floats after acc: m, l, seen, padding (16-byte records)
constexpr int kMergeWarps = 4;
constexpr int kMergeBatch = 8;  // partial records a merge warp loads before merging them
// Longest span (tiles of one query tile in one round) pass 1 merges itself. A merging block
// has 8 warps for 32 pairs, so it reads a span's records with a quarter of the parallelism of
// pass 2's warp per pair; up to one batch a pair that costs less than pass 2's own work.
constexpr int64_t kFusedMaxSlots = kMergeBatch;
constexpr int64_t kMaxMergeCounters = 4096;  // (query tile, kv head) cells; more: pass 2 merges

// Whether pass 1 merges a query tile (span [lo, hi] of tiles, `over`: the fallback's) itself:
// the whole span in round 0 (R = slots tiles a round) and at most kFusedMaxSlots tiles.
__host__ __device__ __forceinline__ bool ShortSpan(int64_t lo, int64_t hi, bool over,
                                                   int64_t slots) {
  const int64_t len = hi - lo + 1;
  return !over && len > 0 && len <= slots && len <= kFusedMaxSlots;
}

template <int kH>
constexpr int Record() {
  return kH + kTail;
}

// A pair's running state: m and l (equal on every lane) and the lane's dimensions of acc.
template <int kH>
struct State {
  float m, l, acc[kH / kWarpSize];
};

// kN floats through L2 (records another block wrote during this kernel).
template <int kN>
__device__ __forceinline__ void LoadDimsCg(const float* p, float (&v)[kN]) {
  if constexpr (kN % 4 == 0) {
#pragma unroll
    for (int j = 0; j < kN / 4; ++j) {
      const float4 a = __ldcg(reinterpret_cast<const float4*>(p) + j);
      v[4 * j] = a.x, v[4 * j + 1] = a.y, v[4 * j + 2] = a.z, v[4 * j + 3] = a.w;
    }
  } else {
    static_assert(kN % 2 == 0, "lane slices are pairs of floats at least");
#pragma unroll
    for (int j = 0; j < kN / 2; ++j) {
      const float2 a = __ldcg(reinterpret_cast<const float2*>(p) + j);
      v[2 * j] = a.x, v[2 * j + 1] = a.y;
    }
  }
}

// Merges one tile's partial (tail = mt, lt, seen; acct the lane's dimensions) into st:
// TileStep's merge, the same operations in the same order.
template <int kH>
__device__ __forceinline__ void MergeTile(const float4& tail, const float (&acct)[kH / kWarpSize],
                                          State<kH>* st) {
  constexpr int kDims = kH / kWarpSize;
  if (tail.z == 0.0f) return;  // uniform: no visible key in the tile
  const bool first = st->l == 0.0f;
  const MergeWeights mw = first ? MergeWeights{tail.x, 0.0f, 1.0f} : MergeFactors(st->m, tail.x);
  st->m = mw.m;
  st->l = first ? tail.y : Merged(st->l, mw.a, tail.y, mw.b);
#pragma unroll
  for (int d = 0; d < kDims; ++d) {
    st->acc[d] = first ? acct[d] : Merged(st->acc[d], mw.a, acct[d], mw.b);
  }
}

// Pair w's records of slots [0, slots) (slot i at part + i * slot_floats) merged into st in
// slot order, kMergeBatch records in flight at a time.
template <int kH>
__device__ __forceinline__ void MergeSlots(const float* part, int64_t slot_floats, int64_t w,
                                           int64_t slots, int lane, State<kH>* st) {
  constexpr int kDims = kH / kWarpSize;
  for (int64_t i0 = 0; i0 < slots; i0 += kMergeBatch) {
    float4 tail[kMergeBatch];
    float acct[kMergeBatch][kDims];
#pragma unroll
    for (int u = 0; u < kMergeBatch; ++u) {
      tail[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // past the span: seen = 0
      if (i0 + u >= slots) continue;
      const float* rec = part + (i0 + u) * slot_floats + w * Record<kH>();
      tail[u] = __ldcg(reinterpret_cast<const float4*>(rec + kH));
      LoadDimsCg<kDims>(rec + lane * kDims, acct[u]);  // unused (unset) when seen = 0
    }
#pragma unroll
    for (int u = 0; u < kMergeBatch; ++u) MergeTile<kH>(tail[u], acct[u], st);
  }
}

// out[w] = Normalised(acc, l), the lane's dimensions (a pair that saw no key: exact zeros).
template <typename Q, int kH>
__device__ __forceinline__ void WriteOut(const State<kH>& st, int64_t w, int lane, Q* out) {
  constexpr int kDims = kH / kWarpSize;
#pragma unroll
  for (int d = 0; d < kDims; ++d) {
    FromF32(Normalised(st.acc[d], st.l), out + w * kH + lane * kDims + d);
  }
}

// Block-wide, after the block has written its records of the current item: counts the item
// done for (query tile b, kv head kvh), which has `items` items this round, and returns (to
// every thread) whether this block finished the last of them and so merges them. Every
// thread fences its own record stores before the count; the counter starts at 0 (the
// launcher clears it before pass 1).
__device__ __forceinline__ bool CountItemDone(int32_t* counters, int64_t cell, int64_t items,
                                              int* flag) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int old = atomicAdd(counters + cell, 1);
    *flag = old + 1 == items ? 1 : 0;
  }
  __syncthreads();
  const bool last = *flag != 0;
  if (last) __threadfence();  // the other blocks' records, counted, before any is read
  return last;
}

// The merging block: warp w merges its kPW pairs of query tile t0.. and kv head kvh over
// slots [0, slots) and writes their out rows. Not inlined: pass 1 already fills its register
// budget, and inlined the merge's batch of records made ptxas spill in the tile loop too.
template <typename Q, int kH, int kPW>
__device__ __noinline__ void FusedMerge(const Dims& dm, int64_t t0, int64_t kvh, int g_count,
                                           const float* part, int64_t slots, Q* out) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int64_t slot_floats = dm.t * dm.n * Record<kH>();
#pragma unroll 1
  for (int i = 0; i < kPW; ++i) {
    const int p = warp * kPW + i;
    const int64_t t = t0 + p / g_count, n = kvh * g_count + p % g_count;
    if (t >= dm.t) continue;  // uniform
    State<kH> st = {};
    MergeSlots<kH>(part, slot_floats, t * dm.n + n, slots, lane, &st);
    WriteOut<Q, kH>(st, t * dm.n + n, lane, out);
  }
}

}  // namespace split
}  // namespace prism
