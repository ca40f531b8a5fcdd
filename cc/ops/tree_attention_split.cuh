// Tree attention split over key tiles, for head dims H in {64, 128, 256}: the same bits as
// AttendKernel for steps with few tokens and long contexts (a follow-up question: T = 64, one
// chain, ~4K keys), where the fused kernels walk each query's tiles serially and leave the GPU
// mostly idle. Tile partials do not depend on the running state (tree_attention.h), so:
//   pass 1 (PartialKernel), a persistent grid over work items (b, kvh, i): the block kernel's
//     query tile b and kv head kvh for ONE tile, j = lo_b + base + i (lo_b: the first tile any
//     of b's tokens sees), only for tiles b's tokens see (WorkList); each block takes a
//     contiguous run of items and reuses its q and chain list while (b, kvh) stays the same.
//     It stages that tile per chain and computes every pair's partial with the block kernel's
//     own code (tree_attention_block_tile.cuh), then writes it to the workspace (no merge).
//   pass 2 (MergeKernel), one warp per (t, n): merges the round's partials in increasing tile
//     order into the running (m, l, acc) exactly as TileStep (first non-empty tile copied,
//     then MergeFactors / Merged), keeps it in the workspace between rounds, and after the last
//     round writes out[t, n] = Normalised(acc, l).
// Rounds of R tiles bound the workspace; the handler cannot see the tables, so it runs enough
// rounds to cover `covered` tiles per block (SplitPlan). A block whose tokens' tiles span more
// is left to a fallback with the same bits: FallbackKernel (the lanes kernel's warp) in steps of
// up to 64 tokens, BlockFallbackKernel (the block kernel) in larger ones. Results never depend
// on the bound, only the speed does.
//
// Workspace (an f32 result of the call, sized by the Python wrapper): the state
// [T * N][kRecord], then one round's partials [R][T * N][kRecord], then the span table
// (kTableFloats int32 at the very end). A record is acc [H] (dimension
// d at d), then mt (or m), lt (or l), seen (1: the tile had a visible key, 0: skip), padding.
// Pass 1 writes every (slot, pair) of its block's span (acct only when seen); pass 2 reads only
// slots inside its block's span, so nothing is cleared. Included by tree_attention_cuda.cu only.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/tree_attention.h"
#include "cc/ops/tree_attention_block.cuh"
#include "cc/ops/tree_attention_block_tile.cuh"
#include "cc/ops/tree_attention_lanes.cuh"
#include "cc/ops/tree_attention_split_work.cuh"

namespace prism {
namespace split {

constexpr int kMergeWarps = 4;
// Partial records a merge warp loads before merging them. Long spans (a follow-up question's
// 17-65 tiles, few pairs) want them in flight: 8 (96 registers at H = 128; 16 records, at 168,
// merged a 4K follow-up no faster: 0.484 against 0.463 ms a step). Short spans with many pairs
// (a prompt, a forest: 8,192-14,336 warps) want resident warps: 4 (48 registers, 10 blocks an
// SM). The 8-record kernel at its unbounded 128 registers ran a one-question layer's warps in
// ~4 waves (results/e2e_h200_session25/README.md).
constexpr int kMergeBatchShort = 4;
constexpr int kMergeBatchLong = 8;
template <int kH, int kBatch>
constexpr int MergeMinBlocks() {  // blocks an SM must hold (__launch_bounds__), no spills
  if constexpr (kBatch <= kMergeBatchShort) return kH <= 128 ? 10 : 6;
  return kH <= 128 ? 4 : 1;
}

// Pass 1 (see the top of this file): a persistent grid over the round's work list; item
// (pos, kvh) is query tile b's tile first[b] + i, i = pos - ends[b - 1], into slot i.
template <typename Q, typename KV, int kH, int kPW>
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
  // Runs differ by at most one item, the longer ones on the lowest blocks. The grid is two
  // blocks an SM, and where block i shares its SM with block i + SMs (the usual placement) an
  // SM gets at most ceil(items / SMs) items. Runs of ceil(items / grid) each instead left the
  // high blocks idle and gave the low SMs two full runs: 6 items against 4.1 on average for
  // 544 items (a follow-up question's sliding-window layer) on 132 SMs.
  const int64_t base = items / gridDim.x, extra = items % gridDim.x;
  const int64_t bid = blockIdx.x;
  const int64_t first = bid * base + (bid < extra ? bid : extra);
  const int64_t last = first + base + (bid < extra ? 1 : 0);
  const block::Smem sm = block::CarveSmem<kH, kPW>(smem);
  int64_t set_b = -1, set_kvh = -1;  // the (query tile, kv head) smem holds
  for (int64_t item = first; item < last; ++item) {  // uniform
    const int64_t kvh = item / npos, pos = item % npos;
    const int b = QueryTileOf(wl, nb, pos);
    const int64_t i = pos - (b > 0 ? wl.ends[b - 1] : 0), j = wl.first[b] + i;
    const int64_t t0 = static_cast<int64_t>(b) * qt;
    if (b != set_b || kvh != set_kvh) {
      __syncthreads();  // every warp is done with the previous item's shared memory and info
      block::SetupBlock<Q, kH, kPW>(q, dm, tb, window, t0, kvh, sm, &info);
      set_b = b, set_kvh = kvh;
    }
    float* slot_part = part + i * dm.t * dm.n * Record<kH>();
    unsigned done = 0;  // bit i: the warp's pair i has a partial in this tile
    const int nc = info.n_chains;
    for (int ci = 0; ci < nc; ++ci) {
      if (j < sm.chains[ci].lo || j > sm.chains[ci].hi) continue;  // uniform (shared memory)
      block::StageTile<KV, kH, kPW>(k_pool, v_pool, dm, tb, window, kvh, j, ci, qt, sm);
      block::Partials<kH, kPW> pt;
      block::TilePartials<kH, kPW>(sm, j, ci, window, scale, g_count, &pt);
      WritePartials<kH, kPW>(pt, dm, t0, kvh, g_count, slot_part, &done);
    }
    WriteEmpty<kH, kPW>(dm, t0, kvh, g_count, slot_part, done);
  }
}

// A pair's running state: m and l (equal on every lane) and the lane's dimensions of acc.
template <int kH>
struct State {
  float m, l, acc[kH / kWarpSize];
};

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

// Pass 2 (see the top of this file): one warp per (t, n), kMergeWarps per block.
template <typename Q, int kH, int kBatch>
__global__ void __launch_bounds__(kMergeWarps * kWarpSize, MergeMinBlocks<kH, kBatch>())
    MergeKernel(Dims dm, int qt, Round rd, bool first_round, bool last_round,
                const float* __restrict__ part, const int32_t* __restrict__ table,
                float* __restrict__ state, Q* __restrict__ out) {
  constexpr int kDims = kH / kWarpSize;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kMergeWarps + threadIdx.x / kWarpSize;
  if (w >= dm.t * dm.n) return;  // uniform per warp; no block barrier
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const int64_t t = w / dm.n;
  const TileSpan sp = LoadSpan(table, t / qt);
  if (sp.over) return;  // the fallback writes out[t, n]
  State<kH> st = {};
  float* srec = state + w * Record<kH>();
  if (!first_round) {
    lanes::LoadDims<kDims>(srec + lane * kDims, st.acc);
    st.m = srec[kH], st.l = srec[kH + 1];
  }
  const int64_t left = sp.hi - (sp.lo + rd.base) + 1;  // the span's tiles from this round on
  const int64_t slots = left < 0 ? 0 : (left < rd.slots ? left : rd.slots);
  for (int64_t i0 = 0; i0 < slots; i0 += kBatch) {  // kBatch records in flight
    float4 tail[kBatch];
    float acct[kBatch][kDims];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      tail[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // past the span: seen = 0
      if (i0 + u >= slots) continue;
      const float* rec = part + ((i0 + u) * dm.t * dm.n + w) * Record<kH>();
      tail[u] = *reinterpret_cast<const float4*>(rec + kH);
      lanes::LoadDims<kDims>(rec + lane * kDims, acct[u]);  // unused (unset) when seen = 0
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) MergeTile<kH>(tail[u], acct[u], &st);
  }
  if (last_round) {
#pragma unroll
    for (int d = 0; d < kDims; ++d) {
      FromF32(Normalised(st.acc[d], st.l), out + w * kH + lane * kDims + d);
    }
  } else {
    StoreDims<kDims>(srec + lane * kDims, st.acc);
    if (lane == 0) srec[kH] = st.m, srec[kH + 1] = st.l;
  }
}

// Queries of blocks whose span exceeds the rounds' coverage: the lanes kernel's warp.
template <typename Q, typename KV, int kH>
__global__ void __launch_bounds__(lanes::kWarps * kWarpSize)
    FallbackKernel(const Q* __restrict__ q, const KV* __restrict__ k_pool,
                   const KV* __restrict__ v_pool, Dims dm, Tables tb, float scale,
                   int32_t window, int qt, const int32_t* __restrict__ table,
                   Q* __restrict__ out) {
  __shared__ lanes::TileScratch scratch[lanes::kWarps];
  const int wib = static_cast<int>(threadIdx.x / kWarpSize);
  const int64_t w = static_cast<int64_t>(blockIdx.x) * lanes::kWarps + wib;
  if (w >= dm.t * dm.n) return;  // uniform per warp
  const int64_t t = w / dm.n;
  if (!LoadSpan(table, t / qt).over) return;
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  lanes::AttendWarp<Q, KV, kH>(q, k_pool, v_pool, dm, tb, scale, window, w, lane,
                               &scratch[wib], out);
}

// Query tiles beyond the rounds' coverage in a step of more than kBlockMinTokens tokens (a
// forest or prefix whose keys lie beyond what the workspace covers): the block kernel, which is
// what such steps took before the split existed. grid = (ceil(T / Qt), K).
template <typename Q, typename KV, int kH, int kPW>
__global__ void __launch_bounds__(block::kThreads, kH <= 128 ? 2 : 1)
    BlockFallbackKernel(const Q* __restrict__ q, const KV* __restrict__ k_pool,
                        const KV* __restrict__ v_pool, Dims dm, Tables tb, float scale,
                        int32_t window, const int32_t* __restrict__ table,
                        Q* __restrict__ out) {
  if (!LoadSpan(table, blockIdx.x).over) return;  // uniform: the split's query tile
  extern __shared__ __align__(16) float smem[];
  __shared__ block::BlockInfo info;
  block::AttendBlock<Q, KV, kH, kPW>(q, k_pool, v_pool, dm, tb, scale, window, blockIdx.x,
                                     blockIdx.y, smem, info, out);
}

// Host: the round size and count. The handler cannot read the tables, so the rounds cover a
// bound on a block's span that holds whenever its tokens' positions are < P * L (a chain holds
// at most P * L keys and the engine numbers them from 0): every tile then lies in
// [0, ceil(P * L / 64)). With a window, Qt consecutive positions of one chain span at most
// floor((window + Qt - 2) / 64) + 2 tiles, a tighter bound. Blocks beyond it (tables with larger
// positions, or windowed blocks mixing distant positions) go to FallbackKernel.
// At most kMaxRounds rounds: each costs two launches even when all its blocks exit at once, and
// the round size R (the workspace budget) already covers ~16K positions at T = 64, N = 32.
// PRISM_TREE_ATTENTION_SPLIT_TILES=<R> forces the round size and lifts that cap, so tests run
// many rounds over the whole bound.
constexpr int64_t kMaxSlots = 65535;  // gridDim.z
constexpr int64_t kMaxRounds = 2;     // beyond: the fallback's

struct Plan {
  int64_t slots, rounds;  // slots == 0: the workspace holds no round (no split)
  float* state;           // [T * N][kRecord] running state, at the workspace's start
  float* part;            // [slots][T * N][kRecord] one round's partials, after it
  int32_t* table;         // [kMaxQueryTiles][kSpanFields] span table, at the workspace's end
};
constexpr int64_t kTableFloats = kMaxQueryTiles * kSpanFields;  // SPLIT_TABLE_FLOATS

// The round size is what the workspace holds (the Python wrapper sizes it: the pool's tiles
// within a budget, prism_jax/ops/tree_attention.py split_workspace_floats), at most the bound.
inline Plan SplitPlan(const Dims& dm, int32_t window, int qt, float* ws, int64_t ws_floats) {
  const int64_t record = dm.t * dm.n * (dm.h + kTail);  // floats per slot, and of the state
  int64_t bound = CeilDiv(dm.p * dm.l, kAttnTile);
  if (window > 0) bound = std::min<int64_t>(bound, (window + qt - 2) / kAttnTile + 2);
  bound = std::max<int64_t>(bound, 1);
  const int64_t usable = ws_floats - kTableFloats;  // records; the span table at the end
  const int64_t fit = std::min(record > 0 && usable > 0 ? usable / record - 1 : 0, kMaxSlots);
  if (fit < 1) return {0, 0, nullptr, nullptr, nullptr};
  const char* env = std::getenv("PRISM_TREE_ATTENTION_SPLIT_TILES");
  const int64_t forced = env == nullptr ? 0 : std::atoll(env);
  const int64_t slots = std::min(forced > 0 ? forced : bound, fit);
  const int64_t needed = CeilDiv(bound, slots);
  const int64_t rounds = forced > 0 ? needed : std::min(needed, kMaxRounds);
  return {slots, rounds, ws, ws + record, reinterpret_cast<int32_t*>(ws + usable)};
}

}  // namespace split
}  // namespace prism
