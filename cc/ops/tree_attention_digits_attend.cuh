// The attend kernel of tree attention in INT8 digits (tree_attention_digits_cuda.cu's header
// comment says how it works): pass planning over the chains of a block's rows, the walk over
// their key tiles (all of them, one split block's share, or the fallback's), and
// DigitAttendKernel itself in its three modes. Only tree_attention_digits_cuda.cu includes it
// (the kernel lives in that file's anonymous namespace).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/attention_digits.h"
#include "cc/ops/tree_attention.h"
#include "cc/ops/tree_attention_digits_split.cuh"
#include "cc/ops/tree_attention_digits_stage.cuh"
#include "cc/ops/tree_attention_digits_tile.cuh"

namespace prism {
namespace {

using namespace digits;  // NOLINT: the digit kernels' own building blocks

__device__ __forceinline__ void StoreOut(float v0, float v1, float* p) {
  *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
}
__device__ __forceinline__ void StoreOut(float v0, float v1, uint16_t* p) {
  *reinterpret_cast<uint32_t*>(p) =
      static_cast<uint32_t>(F32ToBf16(v0)) | static_cast<uint32_t>(F32ToBf16(v1)) << 16;
}

// Pass planning: the smallest chain above `after` among the block's rows, that chain's tile
// range and the largest first tile of its rows. Every thread returns the same values.
struct PassRange {
  int64_t chain, first, last, first_max;
};
template <int kH>
__device__ PassRange NextChain(const Dims& dm, const Tables& tb, int64_t t0, int kvh,
                               int64_t after, int32_t window, Smem<kH>& sm) {
  if (threadIdx.x == 0) {
    sm.reduce[0] = INT_MAX, sm.reduce[1] = INT_MAX, sm.reduce[2] = -1, sm.reduce[3] = -1;
  }
  __syncthreads();
  int64_t chain = -1, pos = -1;
  if (threadIdx.x < kRows) {
    const RowPlace pl = PlaceOf(static_cast<int>(threadIdx.x), t0, dm, kvh);
    if (pl.token >= 0) chain = tb.chain_of[pl.token], pos = tb.positions[pl.token];
    if (chain < 0 || chain >= dm.c || pos < 0) chain = -1;
    if (chain > after) atomicMin(&sm.reduce[0], static_cast<int32_t>(chain));
  }
  __syncthreads();
  const int32_t next = sm.reduce[0];
  if (next != INT_MAX && chain == next) {
    atomicMin(&sm.reduce[1], static_cast<int32_t>(FirstTile(pos, window)));
    atomicMax(&sm.reduce[2], static_cast<int32_t>(LastTile(pos)));
    atomicMax(&sm.reduce[3], static_cast<int32_t>(FirstTile(pos, window)));
  }
  __syncthreads();
  const PassRange r{next == INT_MAX ? -1 : next, sm.reduce[1], sm.reduce[2], sm.reduce[3]};
  __syncthreads();  // everyone read reduce[] before the next call resets it
  return r;
}

// kFused: every tile merged in order, out written. kPartial: pass 1 of the split
// (tree_attention_digits_split.cuh), this block's share of the round's tiles as records.
// kFallback: kFused, for only the blocks with a row the split's rounds do not cover.
enum class Mode { kFused, kPartial, kFallback };

// The tiles a block walks in one pass: all of them, or (kPartial) every splits-th, from
// blockIdx.z, of the round's: tiles first + base .. first_max + base + slots - 1 (some row's
// record slot in [base, base + slots)), clipped to the pass.
struct TileWalk {
  int64_t lo, hi, step;
};
template <Mode kMode>
__device__ __forceinline__ TileWalk WalkOf(const PassRange& pr, const Split& sp) {
  if constexpr (kMode != Mode::kPartial) return {pr.first, pr.last, 1};
  const int64_t end = pr.first_max + sp.base + sp.slots - 1;
  return {pr.first + sp.base + blockIdx.z, end < pr.last ? end : pr.last, sp.splits};
}

template <int kH>
__device__ __forceinline__ void ClearState(WarpState<kH>& st) {
#pragma unroll
  for (int nb = 0; nb < kH / 8; ++nb) {
#pragma unroll
    for (int i = 0; i < 4; ++i) st.acc[nb][i] = 0.0f;
  }
  st.m[0] = st.m[1] = 0.0f, st.l[0] = st.l[1] = 0.0f;
}

template <typename T, int kH>
__device__ __forceinline__ void WriteOut(const WarpState<kH>& st, const RowPlace (&mine)[2],
                                         const Dims& dm, T* __restrict__ out) {
  const int t = static_cast<int>(threadIdx.x) % 4;
  for (int h = 0; h < 2; ++h) {
    if (mine[h].token < 0) continue;
    T* o = out + (mine[h].token * dm.n + mine[h].head) * kH;
#pragma unroll
    for (int nb = 0; nb < kH / 8; ++nb) {
      StoreOut(Normalised(st.acc[nb][2 * h], st.l[h]),
               Normalised(st.acc[nb][2 * h + 1], st.l[h]), o + 8 * nb + 2 * t);
    }
  }
}

// Pass 1 keeps no accumulators across tiles: a third block fits an SM's registers.
template <Mode kMode>
constexpr int kBlocksPerSmOf = kMode == Mode::kPartial ? kBlocksPerSm + 1 : kBlocksPerSm;

template <typename T, int kH, Mode kMode>
__global__ void __launch_bounds__(kThreads, kBlocksPerSmOf<kMode>)
    DigitAttendKernel(const T* __restrict__ q, const int8_t* __restrict__ k_pool,
                      const int8_t* __restrict__ v_pool, Dims dm, Tables tb, float scale,
                      int32_t window, Split sp, T* __restrict__ out) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem<kH>& sm = *reinterpret_cast<Smem<kH>*>(smem_raw);
  const int kvh = static_cast<int>(blockIdx.y);
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * (kRows / (dm.n / dm.k));
  if constexpr (kMode == Mode::kFallback) {
    if (!BlockExceeds(dm, tb, t0, kvh, window, sp.covered)) return;  // uniform per block
  }
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int g = static_cast<int>(threadIdx.x) % kWarpSize / 4;
  WarpState<kH> st;
  ClearState(st);
  RowPlace mine[2];
  int64_t my_chain[2], my_pos[2];
  for (int h = 0; h < 2; ++h) {
    mine[h] = PlaceOf(16 * warp + g + 8 * h, t0, dm, kvh);
    my_chain[h] = mine[h].token >= 0 ? tb.chain_of[mine[h].token] : -1;
    my_pos[h] = mine[h].token >= 0 ? tb.positions[mine[h].token] : -1;
    if (my_chain[h] >= dm.c || my_pos[h] < 0) my_chain[h] = -1;
  }
  bool staged = false;  // the queries, staged before the block's first tile (none: never)
  for (PassRange pr = NextChain(dm, tb, t0, kvh, -1, window, sm); pr.chain >= 0;
       pr = NextChain(dm, tb, t0, kvh, pr.chain, window, sm)) {
    RowPass rp;
    for (int h = 0; h < 2; ++h) rp.active[h] = my_chain[h] == pr.chain, rp.pos[h] = my_pos[h];
    const bool warp_active = __any_sync(kFullMask, rp.active[0] || rp.active[1]);
    const TileWalk walk = WalkOf<kMode>(pr, sp);
    for (int64_t tile = walk.lo; tile <= walk.hi; tile += walk.step) {
      if (!staged) {  // block-uniform
        if (sp.q_packed != nullptr) StagePackedQueries<kH>(sp.q_packed, dm, t0, kvh, sm);
        else StageQueries<kH>(q, dm, t0, kvh, sm);
        staged = true;
      }
      StageTile<kH>(k_pool, v_pool, dm, tb, pr.chain, kvh, tile, sm);
      __syncthreads();
      if (warp_active) {
        float s[kAttnTile / 8][4];
        Scores<kH>(sm, warp, scale, s);
        if constexpr (kMode == Mode::kPartial) {  // a tile's own partial, to its records
          st.l[0] = st.l[1] = 0.0f;
          float* rec[2];
          RecordsOf<kH>(rp, mine, tile, window, dm, sp, rec);
          TileUpdate<kH, true>(sm, tile, window, rp, s, st, rec);
          WriteTails(st, rec);
        } else {
          float* const none[2] = {nullptr, nullptr};
          TileUpdate<kH, false>(sm, tile, window, rp, s, st, none);
        }
      }
      __syncthreads();  // the next tile overwrites the codes
    }
  }
  if constexpr (kMode != Mode::kPartial) WriteOut(st, mine, dm, out);
}

}  // namespace
}  // namespace prism
