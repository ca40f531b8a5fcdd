// Tree attention, the K/V-sharing machinery of tree_attention_block.cuh (the fused block kernel)
// and tree_attention_split.cuh (its split-over-tiles pass 1): one tile's partials for every
// (token, query head) pair of a block, in AttendKernel's bits. Both kernels call these
// functions, so their per-tile arithmetic is one piece of code.
//
// A block serves kPairs = Qt * G (token, query head) pairs: the G query heads of one kv head
// (GQA) for Qt consecutive tokens. For absolute key tile j and one distinct chain of the
// block's tokens, StageTile resolves the tile's 64 positions to pool rows (KeyRow; rows that no
// token of the chain sees, and absent keys, are neither loaded nor used) and stages the K and V
// rows in shared memory as f32; then TilePartials has warp w work alone on its kPW pairs:
//   scores: lane x computes the dots of keys x and x + 32 with each of its pairs' q, serially in
//     one thread but in the canonical order (numerics.h): lane partials of kVec elements from +0
//     with separate mul and add, the butterfly levels whose offset is >= H / kVec as `+ 0`, then
//     the remaining levels as a tree (leaves visited in bit-reversed order, so each level adds
//     partial[i] and partial[i + off] exactly as the xor shuffle does); s = dot * scale.
//   max: TileStep's serial max as an exact (value, position) butterfly over the warp.
//   e_i = expf(s_i - mt), then lane l owns H / 32 dimensions of each pair and adds lt and
//     e_i * v_i over the visible keys in increasing position.
// Visibility is per pair (its token's position, window and chain): a 64-bit mask per pair,
// uniform across the warp, so invisible keys are skipped exactly as AttendKernel skips them;
// a pair whose mask is 0 has no partial for the tile (the caller skips its merge).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/tree_attention.h"

namespace prism {
namespace block {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kLoadBatch = 4;  // 16-byte K and V chunks per thread in flight together

constexpr int Log2(int v) { return v <= 1 ? 0 : 1 + Log2(v / 2); }
constexpr int BitReverse(int v, int bits) {
  return bits == 0 ? 0 : ((v & 1) << (bits - 1)) | BitReverse(v >> 1, bits - 1);
}

template <int kH, int kPW>
struct Shape {
  static_assert(kH == 64 || kH == 128 || kH == 256, "block kernel: H in {64, 128, 256}");
  static constexpr int kParts = kH / kVec;          // canonical lanes holding elements
  static constexpr int kLog = Log2(kParts);         // butterfly levels that add two partials
  static constexpr int kZeroLevels = 5 - kLog;      // levels with off >= kParts: `+ 0`
  static constexpr int kDims = kH / kWarpSize;      // output dimensions per lane
  static constexpr int kPairs = kWarps * kPW;       // (token, q head) pairs per block
  static constexpr int kRow = kH + 4;               // smem K/V row stride in floats: the 8
                                                    // lanes of a 16-byte phase hit 8 bank groups
  // Dynamic shared memory: K, V tiles [64][kRow], q [kPairs][kH], scores [kPairs][64] (f32),
  // then the tile's rows [64] (int64) and the token table (Token) per block token.
  static constexpr size_t kFloats = 2 * kAttnTile * kRow + kPairs * kH + kPairs * kAttnTile;
};

// One block token: position, chain index into the block's chain list (-1: padding or past T).
struct Token {
  int32_t pos, ci;
};
// One distinct chain of the block: id and the range of tiles its tokens see.
struct ChainRange {
  int32_t chain;
  int64_t lo, hi;
};

template <typename KV>
struct Raw;  // 16 bytes of pool elements
template <>
struct Raw<float> {
  static constexpr int kEl = 4;
};
template <>
struct Raw<uint16_t> {
  static constexpr int kEl = 8;
};

__device__ __forceinline__ void StoreF32(float* dst, const uint4& u, const float*) {
  *reinterpret_cast<float4*>(dst) =
      make_float4(__uint_as_float(u.x), __uint_as_float(u.y), __uint_as_float(u.z),
                  __uint_as_float(u.w));
}
__device__ __forceinline__ void StoreF32(float* dst, const uint4& u, const uint16_t*) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
  float f[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // little-endian: element 2i is the low half
    f[2 * i] = Bf16ToF32(static_cast<uint16_t>(w[i] & 0xffffu));
    f[2 * i + 1] = Bf16ToF32(static_cast<uint16_t>(w[i] >> 16));
  }
  reinterpret_cast<float4*>(dst)[0] = make_float4(f[0], f[1], f[2], f[3]);
  reinterpret_cast<float4*>(dst)[1] = make_float4(f[4], f[5], f[6], f[7]);
}

// The tile's K and V rows (rows[x] >= 0) into smem as f32; 16-byte coalesced global loads,
// kLoadBatch chunks of each in flight per thread.
template <typename KV, int kH, int kPW>
__device__ __forceinline__ void LoadTile(const KV* k_pool, const KV* v_pool, int64_t stride,
                                         int64_t kvh, const int64_t* rows, float* kt, float* vt) {
  using S = Shape<kH, kPW>;
  constexpr int kEl = Raw<KV>::kEl, kPerRow = kH / kEl;
  constexpr int kIters = kAttnTile * kPerRow / kThreads;
  static_assert(kIters % kLoadBatch == 0 || kIters < kLoadBatch, "load batches tile the tile");
  constexpr int kBatch = kIters < kLoadBatch ? kIters : kLoadBatch;
#pragma unroll 1
  for (int b0 = 0; b0 < kIters; b0 += kBatch) {
    uint4 kr[kBatch], vr[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int idx = static_cast<int>(threadIdx.x) + (b0 + u) * kThreads;
      const int64_t r = rows[idx / kPerRow];
      if (r >= 0) {
        const int64_t off = r * stride + kvh * kH + (idx % kPerRow) * kEl;
        kr[u] = *reinterpret_cast<const uint4*>(k_pool + off);
        vr[u] = *reinterpret_cast<const uint4*>(v_pool + off);
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int idx = static_cast<int>(threadIdx.x) + (b0 + u) * kThreads;
      const int x = idx / kPerRow, d = (idx % kPerRow) * kEl;
      if (rows[x] >= 0) {
        StoreF32(kt + x * S::kRow + d, kr[u], k_pool);
        StoreF32(vt + x * S::kRow + d, vr[u], v_pool);
      }
    }
  }
}

// Adds one leaf (a lane partial, after the `+ 0` levels) to the butterfly tree: leaves arrive
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


// Dynamic shared memory bytes of one block.
template <int kH, int kPW>
constexpr size_t SmemBytes() {
  using S = Shape<kH, kPW>;
  return S::kFloats * sizeof(float) + kAttnTile * sizeof(int64_t) +
         S::kPairs * (sizeof(Token) + sizeof(ChainRange));
}

// The block's views of its dynamic shared memory (layout: Shape::kFloats, then rows, tokens,
// chains), plus what thread 0 computes from the token table.
struct Smem {
  float *kt, *vt, *qs, *sc;  // K, V tiles [64][kRow]; q [kPairs][kH]; scores [kPairs][64]
  int64_t* rows;             // [64] pool row of each tile position (-1: not loaded)
  Token* toks;               // [Qt]
  ChainRange* chains;        // [Qt] distinct chains, in order of first appearance
};
struct BlockInfo {
  int n_chains;
  int64_t j_lo, j_hi;  // tiles any of the block's tokens sees (j_hi < j_lo: none)
};

template <int kH, int kPW>
__device__ __forceinline__ Smem CarveSmem(float* smem) {
  using S = Shape<kH, kPW>;
  Smem sm;
  sm.kt = smem;
  sm.vt = sm.kt + kAttnTile * S::kRow;
  sm.qs = sm.vt + kAttnTile * S::kRow;
  sm.sc = sm.qs + S::kPairs * kH;
  sm.rows = reinterpret_cast<int64_t*>(sm.sc + S::kPairs * kAttnTile);
  sm.toks = reinterpret_cast<Token*>(sm.rows + kAttnTile);
  sm.chains = reinterpret_cast<ChainRange*>(sm.toks + S::kPairs);
  return sm;
}

// Thread 0: the block's distinct chains in order of first appearance, each with the range of
// tiles its tokens see, and the block's whole range; toks[i].ci becomes the chain's index.
__device__ __forceinline__ void ListChains(const Smem& sm, int qt, int32_t window,
                                           BlockInfo* info) {
  int nc = 0;
  int64_t lo = 0, hi = -1;
  for (int i = 0; i < qt; ++i) {
    const int32_t chain = sm.toks[i].ci;
    if (chain < 0) continue;
    const int64_t pos = sm.toks[i].pos, a = FirstTile(pos, window), b = LastTile(pos);
    int c = 0;
    while (c < nc && sm.chains[c].chain != chain) ++c;
    if (c == nc) {
      sm.chains[nc++] = {chain, a, b};
    } else {
      sm.chains[c].lo = a < sm.chains[c].lo ? a : sm.chains[c].lo;
      sm.chains[c].hi = b > sm.chains[c].hi ? b : sm.chains[c].hi;
    }
    sm.toks[i].ci = c;
    lo = hi < lo ? a : (a < lo ? a : lo);
    hi = b > hi ? b : hi;
  }
  info->n_chains = nc;
  info->j_lo = lo;
  info->j_hi = hi;
}

// Block-wide (every thread calls it): the token table, q of every pair as f32 (pair p = token
// p / G, head kvh * G + p % G: G * H contiguous) and the chain list. Ends with a barrier.
template <typename Q, int kH, int kPW>
__device__ __forceinline__ void SetupBlock(const Q* q, const Dims& dm, const Tables& tb,
                                           int32_t window, int64_t t0, int64_t kvh,
                                           const Smem& sm, BlockInfo* info) {
  using S = Shape<kH, kPW>;
  const int g_count = static_cast<int>(dm.n / dm.k), qt = S::kPairs / g_count;
  const int tid = static_cast<int>(threadIdx.x);
  if (tid < qt) {
    const int64_t t = t0 + tid;
    const int32_t pos = t < dm.t ? tb.positions[t] : -1;
    const int32_t chain = t < dm.t ? tb.chain_of[t] : -1;
    sm.toks[tid] = {pos, pos >= 0 && chain >= 0 && chain < dm.c ? chain : -1};
  }
  for (int i = tid; i < S::kPairs * kH; i += kThreads) {
    const int p = i / kH;
    const int64_t t = t0 + p / g_count, n = kvh * g_count + p % g_count;
    sm.qs[i] = t < dm.t ? ToF32(q[(t * dm.n + n) * kH + i % kH]) : 0.0f;
  }
  __syncthreads();
  if (tid == 0) ListChains(sm, qt, window, info);
  __syncthreads();
}

// Block-wide: tile j's rows for chain ci (positions a token of that chain sees), and the K, V
// rows staged in smem. Starts with a barrier (every warp is done with the previous tile) and
// ends with one (the tile is ready).
template <typename KV, int kH, int kPW>
__device__ __forceinline__ void StageTile(const KV* k_pool, const KV* v_pool, const Dims& dm,
                                          const Tables& tb, int32_t window, int64_t kvh,
                                          int64_t j, int ci, int qt, const Smem& sm) {
  const int tid = static_cast<int>(threadIdx.x);
  __syncthreads();
  if (tid < kAttnTile) {
    const int64_t p = j * kAttnTile + tid;
    const int32_t* seg = tb.segs + static_cast<int64_t>(sm.chains[ci].chain) * dm.s * kSegFields;
    int64_t r = KeyRow(seg, dm.s, tb.pages_flat, dm.pt, dm.p, dm.l, p);
    bool seen = false;
    for (int i = 0; i < qt && r >= 0 && !seen; ++i) {
      seen = sm.toks[i].ci == ci && KeyVisible(p, sm.toks[i].pos, window);
    }
    sm.rows[tid] = seen ? r : -1;
  }
  __syncthreads();
  LoadTile<KV, kH, kPW>(k_pool, v_pool, dm.k * kH, kvh, sm.rows, sm.kt, sm.vt);
  __syncthreads();
}

// One tile's partials of a warp's kPW pairs: mask (bit x: position j * 64 + x visible, uniform
// per warp; 0: no partial), mt, lt (equal on every lane) and acct (the lane's dimensions).
template <int kH, int kPW>
struct Partials {
  uint64_t mask[kPW];
  float mt[kPW], lt[kPW], acct[kPW][Shape<kH, kPW>::kDims];
};

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

// Scores of keys lane and lane + 32 with each pair: the canonical dot, serially, times scale.
template <int kH, int kPW>
__device__ __forceinline__ void TileScores(const Smem& sm, float scale, int warp, int lane,
                                           float (&s)[kPW][2]) {
  using S = Shape<kH, kPW>;
  float stack[kPW][2][S::kLog + 1];
#pragma unroll
  for (int seq = 0; seq < S::kParts; ++seq) {
    const int part = BitReverse(seq, S::kLog);
    float kc[2][kVec];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const float4* kp =
          reinterpret_cast<const float4*>(sm.kt + (lane + u * kWarpSize) * S::kRow + part * kVec);
      const float4 a = kp[0], b = kp[1];
      kc[u][0] = a.x, kc[u][1] = a.y, kc[u][2] = a.z, kc[u][3] = a.w;
      kc[u][4] = b.x, kc[u][5] = b.y, kc[u][6] = b.z, kc[u][7] = b.w;
    }
#pragma unroll
    for (int i = 0; i < kPW; ++i) {
      const float4* qp =
          reinterpret_cast<const float4*>(sm.qs + (warp * kPW + i) * kH + part * kVec);
      const float4 a = qp[0], b = qp[1];
      const float qc[kVec] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        float acc = 0.0f;
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc = __fadd_rn(acc, __fmul_rn(qc[e], kc[u][e]));
#pragma unroll
        for (int z = 0; z < S::kZeroLevels; ++z) acc = __fadd_rn(acc, 0.0f);
        PushLeaf<S::kLog>(stack[i][u], acc, seq);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kPW; ++i) {
#pragma unroll
    for (int u = 0; u < 2; ++u) s[i][u] = __fmul_rn(stack[i][u][S::kLog], scale);
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

// lt and e_i * v_i over the visible keys in increasing position, the lane's dimensions; scw
// holds the warp's e_i [kPW][64].
template <int kH, int kPW>
__device__ __forceinline__ void TileSums(const Smem& sm, const float* scw, int lane,
                                         Partials<kH, kPW>* pt) {
  using S = Shape<kH, kPW>;
  uint64_t any = 0;
#pragma unroll
  for (int i = 0; i < kPW; ++i) {
    pt->lt[i] = 0.0f;
#pragma unroll
    for (int d = 0; d < S::kDims; ++d) pt->acct[i][d] = 0.0f;
    any |= pt->mask[i];
  }
  while (any != 0) {  // uniform
    const int x = __ffsll(static_cast<long long>(any)) - 1;
    any &= any - 1;
    float vv[S::kDims];
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
#pragma unroll
    for (int i = 0; i < kPW; ++i) {
      if (((pt->mask[i] >> x) & 1u) == 0) continue;  // uniform
      const float w = scw[i * kAttnTile + x];
      pt->lt[i] = __fadd_rn(pt->lt[i], w);
#pragma unroll
      for (int d = 0; d < S::kDims; ++d) {
        pt->acct[i][d] = __fadd_rn(pt->acct[i][d], __fmul_rn(w, vv[d]));
      }
    }
  }
}

// The warp's partials of staged tile j (chain ci): see the top of this file.
template <int kH, int kPW>
__device__ __forceinline__ void TilePartials(const Smem& sm, int64_t j, int ci, int32_t window,
                                             float scale, int g_count, Partials<kH, kPW>* pt) {
  const int tid = static_cast<int>(threadIdx.x), lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  TileMasks<kH, kPW>(sm, j, ci, window, g_count, warp, lane, pt->mask);
  float s[kPW][2];
  TileScores<kH, kPW>(sm, scale, warp, lane, s);
  float* scw = sm.sc + warp * kPW * kAttnTile;  // the warp's [kPW][64]
#pragma unroll
  for (int i = 0; i < kPW; ++i) {
    pt->mt[i] = TileMax(pt->mask[i], s[i], lane);
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int x = lane + u * kWarpSize;
      if ((pt->mask[i] >> x) & 1u) scw[i * kAttnTile + x] = expf(__fsub_rn(s[i][u], pt->mt[i]));
    }
  }
  __syncwarp();
  TileSums<kH, kPW>(sm, scw, lane, pt);
}

}  // namespace block
}  // namespace prism
