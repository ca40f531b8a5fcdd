// Tree attention, the K/V-sharing kernel of tree_attention_cuda.cu for head dims H in
// {64, 128, 256}: the same bits as AttendKernel, with each K/V row read from L2 once per block
// instead of once per (token, query head).
//
// One block per (tile of Qt consecutive tokens, kv head): its kPairs = Qt * G (token, query
// head) pairs are the G query heads of that kv head (GQA) for Qt tokens. For each absolute key
// tile j in increasing order, and each distinct chain of the block's tokens, the block resolves
// the tile's 64 positions to pool rows (KeyRow; rows that no token of the chain sees, and absent
// keys, are neither loaded nor used), stages the K and V rows in shared memory as f32, and then
// warp w works alone on its kPW pairs (no block barrier until the next tile):
//   scores: lane x computes the dots of keys x and x + 32 with each of its pairs' q, serially in
//     one thread but in the canonical order (numerics.h): lane partials of kVec elements from +0
//     with separate mul and add, the butterfly levels whose offset is >= H / kVec as `+ 0`, then
//     the remaining levels as a tree (leaves visited in bit-reversed order, so each level adds
//     partial[i] and partial[i + off] exactly as the xor shuffle does); s = dot * scale.
//   max: TileStep's serial max as an exact (value, position) butterfly over the warp.
//   e_i = expf(s_i - mt), then lane l owns H / 32 dimensions of each pair and adds lt and
//     e_i * v_i over the visible keys in increasing position; merge as TileStep.
// Visibility is per pair (its token's position, window and chain): a 64-bit mask per pair,
// uniform across the warp, so invisible keys are skipped exactly as AttendKernel skips them and
// a pair whose tile has no visible key skips the merge. Included by tree_attention_cuda.cu only.
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

// The block kernel (see the top of this file). grid = (ceil(T / Qt), K), Qt = kPairs / G.
template <typename Q, typename KV, int kH, int kPW>
__global__ void __launch_bounds__(kThreads, kH <= 128 ? 2 : 1)
    BlockAttendKernel(const Q* __restrict__ q, const KV* __restrict__ k_pool,
                      const KV* __restrict__ v_pool, Dims dm, Tables tb, float scale,
                      int32_t window, Q* __restrict__ out) {
  using S = Shape<kH, kPW>;
  extern __shared__ __align__(16) float smem[];
  float* kt = smem;                                   // [64][kRow]
  float* vt = kt + kAttnTile * S::kRow;               // [64][kRow]
  float* qs = vt + kAttnTile * S::kRow;               // [kPairs][kH]
  float* sc = qs + S::kPairs * kH;                    // [kPairs][64] scores, then e_i
  int64_t* rows = reinterpret_cast<int64_t*>(sc + S::kPairs * kAttnTile);  // [64]
  Token* toks = reinterpret_cast<Token*>(rows + kAttnTile);                // [Qt]
  ChainRange* chains = reinterpret_cast<ChainRange*>(toks + S::kPairs);    // [Qt]
  __shared__ int n_chains;
  __shared__ int64_t j_lo, j_hi;

  const int g_count = static_cast<int>(dm.n / dm.k), qt = S::kPairs / g_count;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * qt, kvh = blockIdx.y;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  const int64_t stride = dm.k * kH;

  // The block's tokens, then (thread 0) its distinct chains in order of first appearance.
  if (tid < qt) {
    const int64_t t = t0 + tid;
    const int32_t pos = t < dm.t ? tb.positions[t] : -1;
    const int32_t chain = t < dm.t ? tb.chain_of[t] : -1;
    toks[tid] = {pos, pos >= 0 && chain >= 0 && chain < dm.c ? chain : -1};
  }
  // q of every pair as f32 (pair p = token p / G, head kvh * G + p % G: G * H contiguous).
  for (int i = tid; i < S::kPairs * kH; i += kThreads) {
    const int p = i / kH;
    const int64_t t = t0 + p / g_count, n = kvh * g_count + p % g_count;
    qs[i] = t < dm.t ? ToF32(q[(t * dm.n + n) * kH + i % kH]) : 0.0f;
  }
  __syncthreads();
  if (tid == 0) {
    int nc = 0;
    int64_t lo = 0, hi = -1;
    for (int i = 0; i < qt; ++i) {
      const int32_t chain = toks[i].ci;
      if (chain < 0) continue;
      const int64_t pos = toks[i].pos, a = FirstTile(pos, window), b = LastTile(pos);
      int c = 0;
      while (c < nc && chains[c].chain != chain) ++c;
      if (c == nc) {
        chains[nc++] = {chain, a, b};
      } else {
        chains[c].lo = a < chains[c].lo ? a : chains[c].lo;
        chains[c].hi = b > chains[c].hi ? b : chains[c].hi;
      }
      toks[i].ci = c;
      lo = hi < lo ? a : (a < lo ? a : lo);
      hi = b > hi ? b : hi;
    }
    n_chains = nc;
    j_lo = lo;
    j_hi = hi;
  }
  __syncthreads();

  // Warp state: pairs warp * kPW + i; m and l equal on every lane, acc the lane's dimensions.
  float st_m[kPW], st_l[kPW], st_acc[kPW][S::kDims];
#pragma unroll
  for (int i = 0; i < kPW; ++i) {
    st_m[i] = 0.0f, st_l[i] = 0.0f;
#pragma unroll
    for (int d = 0; d < S::kDims; ++d) st_acc[i][d] = 0.0f;
  }
  const int nc = n_chains;
  const int64_t jlo = j_lo, jhi = j_hi;

  for (int64_t j = jlo; j <= jhi; ++j) {
    for (int ci = 0; ci < nc; ++ci) {
      if (j < chains[ci].lo || j > chains[ci].hi) continue;  // uniform (shared memory)
      __syncthreads();  // every warp is done with the previous rows, K, V
      if (tid < kAttnTile) {  // pool row of position p if a token of this chain sees it
        const int64_t p = j * kAttnTile + tid;
        const int32_t* seg = tb.segs + static_cast<int64_t>(chains[ci].chain) * dm.s * kSegFields;
        int64_t r = KeyRow(seg, dm.s, tb.pages_flat, dm.pt, dm.p, dm.l, p);
        bool seen = false;
        for (int i = 0; i < qt && r >= 0 && !seen; ++i) {
          seen = toks[i].ci == ci && KeyVisible(p, toks[i].pos, window);
        }
        rows[tid] = seen ? r : -1;
      }
      __syncthreads();
      LoadTile<KV, kH, kPW>(k_pool, v_pool, stride, kvh, rows, kt, vt);
      __syncthreads();

      // Visibility masks of the warp's pairs (bit x: position j * 64 + x), uniform per warp.
      uint64_t mask[kPW];
      const bool row_lo = rows[lane] >= 0, row_hi = rows[lane + kWarpSize] >= 0;
#pragma unroll
      for (int i = 0; i < kPW; ++i) {
        const Token tk = toks[(warp * kPW + i) / g_count];
        const bool mine = tk.ci == ci;
        const int64_t p = j * kAttnTile + lane;
        const unsigned lo =
            __ballot_sync(kFullMask, mine && row_lo && KeyVisible(p, tk.pos, window));
        const unsigned hi = __ballot_sync(
            kFullMask, mine && row_hi && KeyVisible(p + kWarpSize, tk.pos, window));
        mask[i] = static_cast<uint64_t>(lo) | (static_cast<uint64_t>(hi) << 32);
      }

      // Scores of keys lane and lane + 32 with each pair: the canonical dot, serially.
      float stack[kPW][2][S::kLog + 1];
#pragma unroll
      for (int seq = 0; seq < S::kParts; ++seq) {
        const int part = BitReverse(seq, S::kLog);
        float kc[2][kVec];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const float4* kp =
              reinterpret_cast<const float4*>(kt + (lane + u * kWarpSize) * S::kRow + part * kVec);
          const float4 a = kp[0], b = kp[1];
          kc[u][0] = a.x, kc[u][1] = a.y, kc[u][2] = a.z, kc[u][3] = a.w;
          kc[u][4] = b.x, kc[u][5] = b.y, kc[u][6] = b.z, kc[u][7] = b.w;
        }
#pragma unroll
        for (int i = 0; i < kPW; ++i) {
          const float4* qp =
              reinterpret_cast<const float4*>(qs + (warp * kPW + i) * kH + part * kVec);
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
      float s[kPW][2];
      float* scw = sc + warp * kPW * kAttnTile;  // the warp's [kPW][64]
#pragma unroll
      for (int i = 0; i < kPW; ++i) {
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          s[i][u] = __fmul_rn(stack[i][u][S::kLog], scale);
        }
      }
      // TileStep's max: a serial scan `mt = !seen || mt < s ? s : mt` in increasing position
      // yields the first visible score if it is NaN, else the first-positioned maximum of the
      // non-NaN scores (NaNs after the first are never taken; -0 and +0 tie, the earlier stays).
      // That is an associative (value, position) choice, so a butterfly gives the same bits.
      float mt[kPW];
#pragma unroll
      for (int i = 0; i < kPW; ++i) {
        float best = 0.0f;
        int at = kAttnTile;  // kAttnTile: none yet
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int x = lane + u * kWarpSize;
          const float v = s[i][u];
          if (((mask[i] >> x) & 1u) && !isnan(v) && (at == kAttnTile || best < v)) best = v, at = x;
        }
#pragma unroll
        for (int off = kWarpSize / 2; off > 0; off /= 2) {
          const float ob = __shfl_xor_sync(kFullMask, best, off);
          const int oat = __shfl_xor_sync(kFullMask, at, off);
          const bool take = oat != kAttnTile &&
                            (at == kAttnTile || best < ob || (!(ob < best) && oat < at));
          best = take ? ob : best;
          at = take ? oat : at;
        }
        const int first = mask[i] != 0 ? __ffsll(static_cast<long long>(mask[i])) - 1 : 0;
        const float sf =
            __shfl_sync(kFullMask, first < kWarpSize ? s[i][0] : s[i][1], first % kWarpSize);
        mt[i] = isnan(sf) ? sf : best;
      }
#pragma unroll
      for (int i = 0; i < kPW; ++i) {
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int x = lane + u * kWarpSize;
          if ((mask[i] >> x) & 1u) scw[i * kAttnTile + x] = expf(__fsub_rn(s[i][u], mt[i]));
        }
      }
      __syncwarp();
      // lt and e_i * v_i over visible keys in increasing position, lane's dimensions.
      float lt[kPW], acct[kPW][S::kDims];
#pragma unroll
      for (int i = 0; i < kPW; ++i) {
        lt[i] = 0.0f;
#pragma unroll
        for (int d = 0; d < S::kDims; ++d) acct[i][d] = 0.0f;
      }
      uint64_t any = 0;
#pragma unroll
      for (int i = 0; i < kPW; ++i) any |= mask[i];
      while (any != 0) {  // uniform
        const int x = __ffsll(static_cast<long long>(any)) - 1;
        any &= any - 1;
        float vv[S::kDims];
        const float* vp = vt + x * S::kRow + lane * S::kDims;
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
          if (((mask[i] >> x) & 1u) == 0) continue;  // uniform
          const float w = scw[i * kAttnTile + x];
          lt[i] = __fadd_rn(lt[i], w);
#pragma unroll
          for (int d = 0; d < S::kDims; ++d) {
            acct[i][d] = __fadd_rn(acct[i][d], __fmul_rn(w, vv[d]));
          }
        }
      }
      // Merge (TileStep's), only for pairs that saw a key in this tile.
#pragma unroll
      for (int i = 0; i < kPW; ++i) {
        if (mask[i] == 0) continue;  // uniform
        const bool first = st_l[i] == 0.0f;
        const MergeWeights mw =
            first ? MergeWeights{mt[i], 0.0f, 1.0f} : MergeFactors(st_m[i], mt[i]);
        st_m[i] = mw.m;
        st_l[i] = first ? lt[i] : Merged(st_l[i], mw.a, lt[i], mw.b);
#pragma unroll
        for (int d = 0; d < S::kDims; ++d) {
          st_acc[i][d] = first ? acct[i][d] : Merged(st_acc[i][d], mw.a, acct[i][d], mw.b);
        }
      }
    }
  }

  // out[t, n] for the warp's pairs (padding and past-T tokens: Normalised gives exact zeros).
#pragma unroll
  for (int i = 0; i < kPW; ++i) {
    const int p = warp * kPW + i;
    const int64_t t = t0 + p / g_count, n = kvh * g_count + p % g_count;
    if (t >= dm.t) continue;
    Q* o = out + (t * dm.n + n) * kH + lane * S::kDims;
#pragma unroll
    for (int d = 0; d < S::kDims; ++d) FromF32(Normalised(st_acc[i][d], st_l[i]), o + d);
  }
}

// Dynamic shared memory bytes of one block.
template <int kH, int kPW>
constexpr size_t SmemBytes() {
  using S = Shape<kH, kPW>;
  return S::kFloats * sizeof(float) + kAttnTile * sizeof(int64_t) +
         S::kPairs * (sizeof(Token) + sizeof(ChainRange));
}

}  // namespace block
}  // namespace prism
