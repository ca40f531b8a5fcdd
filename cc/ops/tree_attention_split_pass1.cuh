// Tree attention split over key tiles, pass 1 (PartialKernel; tree_attention_split.cuh has the
// design, the workspace and pass 2): a persistent grid over the round's work list, each block a
// contiguous run of items (pos, kvh), item = query tile b's tile first[b] + i into slot i.
//
// Staging. Sequentially, a block resolves a unit's pool rows (a unit: one tile of one chain of
// the block's tokens), copies its K and V rows into shared memory, waits, computes, and only
// then starts the next unit, with barriers between. At two blocks an SM (93.7 KB of shared
// memory and 128 registers a block) that left pass 1 latency-bound, 0.9-1.25 eligible warps a
// scheduler (results/e2e_h200_session12/ncu_attention/). With f32 pools the pipelined loop
// stages the next unit of the same (query tile, kv head) while it computes this one:
//   - the next unit's rows are resolved (threads < 64) into the second row table before this
//     unit's scores;
//   - its K is copied once every warp has its scores (the K buffer is free), under this unit's
//     exp and P.V sums;
//   - its V once every warp has its sums, under the next unit's scores.
// Only where and when data lands changes, never the arithmetic: the bits are the sequential
// loop's (tests compare every kernel bit for bit). bf16 pools convert on the way (no cp.async)
// and keep the sequential loop; PRISM_TREE_ATTENTION_PIPELINE=off forces it for f32 pools too,
// for A/B runs. Included by tree_attention_launch.cuh only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cc/cuda_common.cuh"
#include "cc/ops/tree_attention.h"
#include "cc/ops/tree_attention_block_stage.cuh"
#include "cc/ops/tree_attention_block_tile.cuh"
#include "cc/ops/tree_attention_split.cuh"

namespace prism {
namespace split {

// Where work item `item` lies: kv head, query tile b, slot i and absolute tile j.
struct ItemAt {
  int64_t kvh;
  int b;
  int64_t i, j;
};
__device__ __forceinline__ ItemAt Locate(const WorkList& wl, int nb, int64_t npos,
                                         int64_t item) {
  const int64_t kvh = item / npos, pos = item % npos;
  const int b = QueryTileOf(wl, nb, pos);
  const int64_t i = pos - (b > 0 ? wl.ends[b - 1] : 0);
  return {kvh, b, i, wl.first[b] + i};
}

// What every step of a block's run reads: the call's arguments, the work list, and the run's
// end (items [first, last) are the block's).
struct Pass1 {
  Dims dm;
  Tables tb;
  float scale;
  int32_t window;
  const WorkList* wl;
  int nb, qt, g_count;
  int64_t npos, last;
  float* part;
};

// One unit: item's tile for chain ci of the block's chain list (ci < 0: none).
struct Unit {
  int64_t item;
  int ci;
};

// The first chain from ci on whose tokens see tile j (nc: none). Uniform (shared memory).
__device__ __forceinline__ int ChainSeeing(const block::Smem& sm, int nc, int ci, int64_t j) {
  while (ci < nc && (j < sm.chains[ci].lo || j > sm.chains[ci].hi)) ++ci;
  return ci;
}

// The unit the item loop visits after (item, ci), if it keeps the block's setup (same query
// tile and kv head; a new setup rewrites q and the chain list), else none.
__device__ __forceinline__ Unit NextUnit(const Pass1& p1, const block::Smem& sm, int nc,
                                         const ItemAt& at, int64_t item, int ci) {
  const int c = ChainSeeing(sm, nc, ci + 1, at.j);
  if (c < nc) return {item, c};
  if (item + 1 >= p1.last) return {-1, -1};
  const ItemAt nx = Locate(*p1.wl, p1.nb, p1.npos, item + 1);
  if (nx.b != at.b || nx.kvh != at.kvh) return {-1, -1};
  const int c2 = ChainSeeing(sm, nc, 0, nx.j);
  return c2 < nc ? Unit{item + 1, c2} : Unit{-1, -1};
}

// Waits until at most kPending of this thread's cp.async groups are in flight.
template <int kPending>
__device__ __forceinline__ void WaitCopies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// One unit of the pipelined loop (see the top of this file): stages (at, ci) unless it is the
// unit `staged` already in flight, prefetches the next unit, and leaves this unit's partials in
// pt. Returns the unit now in flight (none: the next unit stages itself). Block-wide.
template <int kH, int kPW>
__device__ __forceinline__ Unit PipelinedUnit(const float* k_pool, const float* v_pool,
                                              const Pass1& p1, const block::Smem& sm, int nc,
                                              const ItemAt& at, int64_t item, int ci,
                                              Unit staged, int* rb, block::Partials<kH, kPW>* pt) {
  const int64_t stride = p1.dm.k * kH;
  block::Smem cur = sm, nxt = sm;  // this unit's row table, and the next unit's
  cur.rows = sm.rows + *rb * kAttnTile;
  nxt.rows = sm.rows + (*rb ^ 1) * kAttnTile;
  if (staged.item != item || staged.ci != ci) {  // uniform: nothing in flight
    __syncthreads();  // every warp is done with the previous unit's tiles and rows
    block::ResolveRows(p1.dm, p1.tb, p1.window, at.j, ci, p1.qt, cur);
    __syncthreads();
    block::CopyTileAsync<kH, kPW>(k_pool, stride, at.kvh, cur.rows, sm.kt);
    block::CopyTileAsync<kH, kPW>(v_pool, stride, at.kvh, cur.rows, sm.vt);
  }
  const Unit nx = NextUnit(p1, sm, nc, at, item, ci);
  const bool ahead = nx.ci >= 0;  // uniform
  WaitCopies<1>();  // this unit's K (its V may still be in flight)
  __syncthreads();
  if (ahead) {
    const int64_t j = Locate(*p1.wl, p1.nb, p1.npos, nx.item).j;
    block::ResolveRows(p1.dm, p1.tb, p1.window, j, nx.ci, p1.qt, nxt);
  }
  float* scw = block::WarpWeights<kPW>(sm);
  block::TileWeights<kH, kPW>(cur, at.j, ci, p1.window, p1.scale, p1.g_count, scw, pt);
  if (ahead) {
    __syncthreads();  // K is free and the next unit's rows are published
    block::CopyTileAsync<kH, kPW>(k_pool, stride, at.kvh, nxt.rows, sm.kt);
    WaitCopies<1>();  // this unit's V; the next unit's K stays in flight
  } else {
    WaitCopies<0>();
  }
  __syncthreads();  // this unit's V, and scw, for every warp
  block::TileSums<kH, kPW>(cur, scw, static_cast<int>(threadIdx.x) % kWarpSize, pt);
  if (ahead) {
    __syncthreads();  // V is free
    block::CopyTileAsync<kH, kPW>(v_pool, stride, at.kvh, nxt.rows, sm.vt);
    *rb ^= 1;
  }
  return nx;
}

// Tile j of chain ci, staged and computed in sequence (bf16 pools, or the pipeline off).
template <typename KV, int kH, int kPW>
__device__ __forceinline__ void SequentialUnit(const KV* k_pool, const KV* v_pool,
                                               const Pass1& p1, const block::Smem& sm,
                                               const ItemAt& at, int ci,
                                               block::Partials<kH, kPW>* pt) {
  block::StageTile<KV, kH, kPW>(k_pool, v_pool, p1.dm, p1.tb, p1.window, at.kvh, at.j, ci, p1.qt,
                                sm);
  block::TilePartials<kH, kPW>(sm, at.j, ci, p1.window, p1.scale, p1.g_count, pt);
}

// The block's run of items [first, p1.last): each (query tile, kv head) set up once, every
// unit's partials into the item's slot, "no visible key" for pairs no chain gave one.
template <typename Q, typename KV, int kH, int kPW, bool kPipelined>
__device__ __forceinline__ void RunItems(const Q* q, const KV* k_pool, const KV* v_pool,
                                         const Pass1& p1, const block::Smem& sm,
                                         block::BlockInfo* info, int64_t first) {
  int64_t set_b = -1, set_kvh = -1;  // the (query tile, kv head) smem holds
  Unit staged{-1, -1};               // the unit whose K and V are in flight
  int rb = 0;                        // the row table of the unit staged next
  for (int64_t item = first; item < p1.last; ++item) {  // uniform
    const ItemAt at = Locate(*p1.wl, p1.nb, p1.npos, item);
    const int64_t t0 = static_cast<int64_t>(at.b) * p1.qt;
    if (at.b != set_b || at.kvh != set_kvh) {  // never with a unit in flight (NextUnit)
      __syncthreads();  // every warp is done with the previous item's shared memory and info
      block::SetupBlock<Q, kH, kPW>(q, p1.dm, p1.tb, p1.window, t0, at.kvh, sm, info);
      set_b = at.b, set_kvh = at.kvh;
    }
    float* slot_part = p1.part + at.i * p1.dm.t * p1.dm.n * Record<kH>();
    unsigned done = 0;  // bit i: the warp's pair i has a partial in this tile
    const int nc = info->n_chains;
    for (int ci = ChainSeeing(sm, nc, 0, at.j); ci < nc; ci = ChainSeeing(sm, nc, ci + 1, at.j)) {
      block::Partials<kH, kPW> pt;
      if constexpr (kPipelined && std::is_same_v<KV, float>) {
        staged = PipelinedUnit<kH, kPW>(k_pool, v_pool, p1, sm, nc, at, item, ci, staged, &rb,
                                        &pt);
      } else {
        SequentialUnit<KV, kH, kPW>(k_pool, v_pool, p1, sm, at, ci, &pt);
      }
      WritePartials<kH, kPW>(pt, p1.dm, t0, at.kvh, p1.g_count, slot_part, &done);
    }
    WriteEmpty<kH, kPW>(p1.dm, t0, at.kvh, p1.g_count, slot_part, done);
  }
}

// Pass 1 (see the top of this file and of tree_attention_split.cuh).
template <typename Q, typename KV, int kH, int kPW, bool kPipelined>
__global__ void __launch_bounds__(block::kThreads, kH <= 128 ? 2 : 1)
    PartialKernel(const Q* __restrict__ q, const KV* __restrict__ k_pool,
                  const KV* __restrict__ v_pool, Dims dm, Tables tb, float scale, int32_t window,
                  Round rd, float* __restrict__ part, int32_t* __restrict__ table) {
  using S = block::Shape<kH, kPW>;
  extern __shared__ __align__(16) float smem[];
  __shared__ block::BlockInfo info;
  __shared__ WorkList wl;
  const int g_count = static_cast<int>(dm.n / dm.k), qt = S::kPairs / g_count;
  const int nb = static_cast<int>((dm.t + qt - 1) / qt);
  BuildWorkList(dm, tb, window, qt, nb, rd, &wl, blockIdx.x == 0 ? table : nullptr);
  const int64_t npos = wl.ends[nb - 1], items = npos * dm.k;
  // Each block takes a contiguous run of items, numbered kv-head-major, so consecutive items
  // mostly share (b, kvh) and the block sets up q and the chains once per run, not per tile.
  const int64_t per = (items + gridDim.x - 1) / gridDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * per;
  const int64_t last = first + per < items ? first + per : items;
  const Pass1 p1{dm, tb, scale, window, &wl, nb, qt, g_count, npos, last, part};
  RunItems<Q, KV, kH, kPW, kPipelined>(q, k_pool, v_pool, p1, block::CarveSmem<kH, kPW>(smem),
                                       &info, first);
}

}  // namespace split
}  // namespace prism
