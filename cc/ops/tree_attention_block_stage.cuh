// Tree attention, the staging half of the block machinery (tree_attention_block_tile.cuh has
// the per-tile arithmetic): the block's shape, shared-memory layout, token and chain tables, q
// of every pair, and one key tile's K/V rows staged in shared memory as f32. Shared by the
// block kernel (tree_attention_block.cuh) and the split kernel's pass 1.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/tree_attention.h"

namespace prism {
namespace block {

// A block serves 32 (token, query head) pairs: kWarps warps of kPairsPerWarp pairs each. Eight
// pairs a warp (4 warps) reuse each staged K/V chunk for more dots, but ran attention 15-20 %
// slower on the H200: the kernel is latency-bound and needs warps
// (results/e2e_h200_session14/pairs_per_warp/).
constexpr int kPairsPerWarp = 4;
constexpr int kWarps = 32 / kPairsPerWarp;
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
  static constexpr int kDims = kH / kWarpSize;      // output dimensions per lane
  static constexpr int kPairs = kWarps * kPW;       // (token, q head) pairs per block
  static constexpr int kRow = kH + 4;               // smem K/V row stride in floats: the 8
                                                    // lanes of a 16-byte phase hit 8 bank groups
  static constexpr int kQRow = kH + 4;  // q row stride: a warp's two half-warps read pairs
                                        // kPW apart in one load, in different bank groups
  static constexpr int kScRow = kAttnTile + 4;  // scores row stride, for the same reason
  // Dynamic shared memory: K, V tiles [64][kRow], q [kPairs][kQRow], scores [kPairs][kScRow]
  // (f32), then the tile's rows [64] (int64) and the token table (Token) per block token.
  static constexpr size_t kFloats = 2 * kAttnTile * kRow + kPairs * kQRow + kPairs * kScRow;
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

// 16 bytes global -> shared without a register round trip (sm_80+ cp.async; L2 only).
__device__ __forceinline__ void CopyAsync16(float* dst, const float* src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}

// One pool's rows of the tile (rows[x] >= 0) into dst by cp.async, committed as one group.
template <int kH, int kPW>
__device__ __forceinline__ void CopyTileAsync(const float* pool, int64_t stride, int64_t kvh,
                                              const int64_t* rows, float* dst) {
  using S = Shape<kH, kPW>;
  constexpr int kPerRow = kH / 4, kIters = kAttnTile * kPerRow / kThreads;
#pragma unroll
  for (int u = 0; u < kIters; ++u) {
    const int idx = static_cast<int>(threadIdx.x) + u * kThreads;
    const int x = idx / kPerRow, d = (idx % kPerRow) * 4;
    const int64_t r = rows[x];
    if (r >= 0) CopyAsync16(dst + x * S::kRow + d, pool + r * stride + kvh * kH + d);
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// f32 pools: every chunk of the tile in flight at once, K and V as two groups; waits for K
// only. V lands while the scores are computed (WaitTileV before the sums).
template <int kH, int kPW>
__device__ __forceinline__ void LoadTileAsync(const float* k_pool, const float* v_pool,
                                              int64_t stride, int64_t kvh, const int64_t* rows,
                                              float* kt, float* vt) {
  CopyTileAsync<kH, kPW>(k_pool, stride, kvh, rows, kt);
  CopyTileAsync<kH, kPW>(v_pool, stride, kvh, rows, vt);
  asm volatile("cp.async.wait_group 1;\n" ::: "memory");
}

// Block-wide, between a staged tile's scores and its sums: the tile's V rows are in shared
// memory for every warp (f32 pools' second cp.async group; a no-op wait for bf16 pools, whose
// rows StageTile already stored).
__device__ __forceinline__ void WaitTileV() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  __syncthreads();
}

// The tile's K and V rows (rows[x] >= 0) into smem as f32: f32 pools by LoadTileAsync, bf16
// pools (converted on the way) by 16-byte coalesced loads, kLoadBatch chunks of each in flight
// per thread. The caller's barrier publishes the tile.
template <typename KV, int kH, int kPW>
__device__ __forceinline__ void LoadTile(const KV* k_pool, const KV* v_pool, int64_t stride,
                                         int64_t kvh, const int64_t* rows, float* kt, float* vt) {
  if constexpr (std::is_same_v<KV, float>) {
    LoadTileAsync<kH, kPW>(k_pool, v_pool, stride, kvh, rows, kt, vt);
    return;
  }
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
  float *kt, *vt, *qs, *sc;  // K, V [64][kRow]; q [kPairs][kQRow]; scores [kPairs][kScRow]
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
  sm.sc = sm.qs + S::kPairs * S::kQRow;
  sm.rows = reinterpret_cast<int64_t*>(sm.sc + S::kPairs * S::kScRow);
  sm.toks = reinterpret_cast<Token*>(sm.rows + kAttnTile);
  sm.chains = reinterpret_cast<ChainRange*>(sm.toks + S::kPairs);
  return sm;
}

// Warp 0 (all 32 lanes; Qt <= 32): the block's distinct chains in order of first appearance,
// each with the range of tiles its tokens see, and the block's whole range; toks[i].ci becomes
// the chain's index. Lane i takes token i: lanes holding one chain find each other
// (__match_any_sync), the lowest of them is the chain's first appearance, and the chain's index
// is how many first appearances come before it. The same lists as a serial walk over the
// tokens, which thread 0 did before, at ~2 us of dependent shared-memory steps per setup
// (clock64 probe on the H200, results/e2e_h200_session27/).
__device__ __forceinline__ void ListChains(const Smem& sm, int qt, int32_t window,
                                           BlockInfo* info) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const bool mine = lane < qt;
  const int32_t chain = mine ? sm.toks[lane].ci : -1;
  const bool valid = chain >= 0;
  const int32_t pos = mine ? sm.toks[lane].pos : 0;
  // Tiles fit int32: positions are int32.
  const int32_t a = valid ? static_cast<int32_t>(FirstTile(pos, window)) : INT32_MAX;
  const int32_t b = valid ? static_cast<int32_t>(LastTile(pos)) : -1;
  const unsigned valid_mask = __ballot_sync(kFullMask, valid);
  const unsigned same = __match_any_sync(kFullMask, chain) & valid_mask;
  const int first = valid ? __ffs(static_cast<int>(same)) - 1 : kWarpSize;
  const unsigned firsts = __ballot_sync(kFullMask, valid && lane == first);
  int32_t lo = a, hi = b;  // the chain's range over its tokens (lanes in `same`)
#pragma unroll 8
  for (int src = 0; src < kWarpSize; ++src) {
    const int32_t oa = __shfl_sync(kFullMask, a, src), ob = __shfl_sync(kFullMask, b, src);
    if ((same >> src) & 1u) lo = oa < lo ? oa : lo, hi = ob > hi ? ob : hi;
  }
  if (valid) {
    const int c = __popc(firsts & ((1u << first) - 1u));
    if (lane == first) sm.chains[c] = {chain, lo, hi};
    sm.toks[lane].ci = c;
  }
  const int32_t all_lo = __reduce_min_sync(kFullMask, a), all_hi = __reduce_max_sync(kFullMask, b);
  if (lane == 0) {
    info->n_chains = __popc(firsts);
    info->j_lo = valid_mask != 0 ? all_lo : 0;  // no valid token: lo 0, hi -1 (none)
    info->j_hi = all_hi;
  }
}

// Four consecutive q elements as f32 (16-byte aligned for f32, 8-byte for bf16: q rows are
// H >= 64 elements).
__device__ __forceinline__ float4 LoadQuad(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ float4 LoadQuad(const uint16_t* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  return make_float4(Bf16ToF32(static_cast<uint16_t>(u.x & 0xffffu)),
                     Bf16ToF32(static_cast<uint16_t>(u.x >> 16)),
                     Bf16ToF32(static_cast<uint16_t>(u.y & 0xffffu)),
                     Bf16ToF32(static_cast<uint16_t>(u.y >> 16)));
}

// Block-wide (every thread calls it): the token table, q of every pair as f32 (pair p = token
// p / G, head kvh * G + p % G: G * H contiguous) and the chain list. Ends with a barrier.
template <typename Q, int kH, int kPW>
__device__ __forceinline__ void SetupBlock(const Q* q, const Dims& dm, const Tables& tb,
                                           int32_t window, int64_t t0, int64_t kvh,
                                           const Smem& sm, BlockInfo* info) {
  using S = Shape<kH, kPW>;
  static_assert(S::kPairs <= kWarpSize, "ListChains gives each of a tile's Qt tokens a lane");
  const int g_count = static_cast<int>(dm.n / dm.k), qt = S::kPairs / g_count;
  const int tid = static_cast<int>(threadIdx.x);
  if (tid < qt) {
    const int64_t t = t0 + tid;
    const int32_t pos = t < dm.t ? tb.positions[t] : -1;
    const int32_t chain = t < dm.t ? tb.chain_of[t] : -1;
    sm.toks[tid] = {pos, pos >= 0 && chain >= 0 && chain < dm.c ? chain : -1};
  }
  // Token t's G heads of kv head kvh are G * H contiguous elements of q, so the block's q is
  // runs of G * H: four elements per load and one division per load (a per-element load with
  // two divisions was 11 % of the split kernel's instructions on a 4K-key follow-up).
  const int run = g_count * kH / 4;  // quads per token
  constexpr int kQuads = kH / 4;     // quads per pair
  for (int i = tid; i < S::kPairs * kQuads; i += kThreads) {
    const int tok = i / run;
    const int64_t t = t0 + tok;
    reinterpret_cast<float4*>(sm.qs + (i / kQuads) * S::kQRow)[i % kQuads] =
        t < dm.t ? LoadQuad(q + (t * dm.n + kvh * g_count) * kH + (i - tok * run) * 4)
                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  __syncthreads();
  if (tid < kWarpSize) ListChains(sm, qt, window, info);
  __syncthreads();
}

// Block-wide: tile j's rows for chain ci (positions a token of that chain sees), and the K, V
// rows staged in smem. Starts with a barrier (every warp is done with the previous tile) and
// ends with one (the tile's K is ready; its V after WaitTileV).
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

}  // namespace block
}  // namespace prism
