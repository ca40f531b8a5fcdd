// Tree attention on CUDA; arguments, semantics and numerics are in tree_attention.h:
//   prism_tree_attention  q [T, N, H], k_new, v_new [T, K, H], k_pages, v_pages [P, L, K, H],
//                         slot, positions, chain_of s32 [T], chain_segments s32 [C, S, 3],
//                         pages_flat s32 [Pt]  -> out [T, N, H], k_pages, v_pages,
//                         workspace f32 [W] (the split kernel's); attrs scale f32, window s32
// Two kernels on the handler's stream, so every write lands before any read: WriteKernel
// stores this step's k/v into the pools, then AttendKernel runs one warp per (token, q head).
// The warp walks the query's tiles in increasing order; lane x resolves tile positions
// x and x + 32 to pool rows, scores are canonical warp dots (bit-identical to the CPU's),
// then the lanes accumulate e_i * v_i over the tile in increasing position, each lane for its
// own canonical chunks of H. Every sum has the CPU's order; only expf may differ by ulps.
// Head dims 64, 128 and 256 take a faster kernel with the same bits (ChooseKernel):
// tree_attention_block.cuh (K/V tiles in shared memory, shared by a block's tokens and GQA
// heads), tree_attention_split.cuh (the block kernel's tile partials computed in parallel over
// tiles, merged in order by a second pass) or tree_attention_lanes.cuh (coalesced rows).
// No host synchronisation and no allocation (the split kernel's workspace is a result of the
// call, planned by XLA with the executable's memory), so the handler is command-buffer
// compatible: XLA may capture it in a CUDA graph.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

#include "cc/common.h"
#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/tree_attention.h"
#include "cc/ops/tree_attention_block.cuh"
#include "cc/ops/tree_attention_lanes.cuh"
#include "cc/ops/tree_attention_launch.cuh"
#include "cc/ops/tree_attention_split.cuh"

namespace prism {
namespace {

constexpr int kAttnWarps = 4;                       // warps (queries x heads) per block
constexpr int kTileParts = kAttnTile / kWarpSize;   // tile positions per lane
constexpr int kWriteThreads = 256;
constexpr int64_t kMaxWriteBlocks = 4096;

// Token t's k/v rows (row elements each) to pool row slot[t], one block per token at a time.
// kVec16: rows are whole 16-byte words at 16-byte aligned addresses, copied as such (a step's
// 27B rows are 8 KB each: per-element copies with a 64-bit division each ran at ~0.8 TB/s).
// The block reads slot[t] once, so the skip of an out-of-pool slot is uniform.
template <typename KV, bool kVec16>
__global__ void __launch_bounds__(kWriteThreads)
    WriteKernel(const KV* __restrict__ k_new, const KV* __restrict__ v_new,
                const int32_t* __restrict__ slot, int64_t t_count, int64_t row, int64_t rows,
                KV* __restrict__ k_pool, KV* __restrict__ v_pool) {
  for (int64_t t = blockIdx.x; t < t_count; t += gridDim.x) {
    const int64_t sl = slot[t];
    if (sl < 0 || sl >= rows) continue;  // uniform per block
    if constexpr (kVec16) {
      const int64_t words = row * static_cast<int64_t>(sizeof(KV)) / 16;
      const uint4* ks = reinterpret_cast<const uint4*>(k_new + t * row);
      const uint4* vs = reinterpret_cast<const uint4*>(v_new + t * row);
      uint4* kd = reinterpret_cast<uint4*>(k_pool + sl * row);
      uint4* vd = reinterpret_cast<uint4*>(v_pool + sl * row);
      for (int64_t i = threadIdx.x; i < words; i += blockDim.x) {
        const uint4 kw = ks[i], vw = vs[i];
        kd[i] = kw;
        vd[i] = vw;
      }
    } else {
      for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
        k_pool[sl * row + i] = k_new[t * row + i];
        v_pool[sl * row + i] = v_new[t * row + i];
      }
    }
  }
}

// Attention dot (tree_attention.h) of the lane's q chunks with key row k (all 32 lanes call
// it; all get the sum).
template <typename KV, int kChunks>
__device__ __forceinline__ float WarpDot(const float (&qv)[kChunks][kVec], const KV* k,
                                         int64_t h, int lane) {
  float acc = 0.0f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t d0 = static_cast<int64_t>(lane) * kVec + c * kStride;
    const int cnt = d0 < h ? ChunkCount(d0, h) : 0;
    if (cnt == 0) continue;
    float kv[kVec];
    LoadChunk(k + d0, cnt, kv);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      if (i < cnt) acc = __fmaf_rn(qv[c][i], kv[i], acc);
    }
  }
  return WarpButterflySum(acc);
}

// Per-lane softmax state: the lane's chunks of acc, plus m and l (equal on every lane).
template <int kChunks>
struct LaneState {
  float acc[kChunks][kVec];
  float m, l;
};

// One tile of one (query, head): rows[x] is the pool row of tile position x * 32 + lane if
// visible, else -1. Computes the tile partial and merges it into st (see tree_attention.h).
template <typename KV, int kChunks>
__device__ void TileStep(const float (&qv)[kChunks][kVec], const KV* k_pool, const KV* v_pool,
                         const int64_t (&rows)[kTileParts], int64_t stride, int64_t kvh,
                         int64_t h, float scale, int lane, LaneState<kChunks>* st) {
  float sc[kTileParts] = {};
  float mt = 0.0f;
  bool seen = false;
#pragma unroll
  for (int part = 0; part < kTileParts; ++part) {
    for (int x = 0; x < kWarpSize; ++x) {
      const int64_t r = __shfl_sync(kFullMask, rows[part], x);
      if (r < 0) continue;  // uniform across the warp
      const float s = __fmul_rn(WarpDot(qv, k_pool + r * stride + kvh * h, h, lane), scale);
      if (lane == x) sc[part] = s;
      mt = !seen || mt < s ? s : mt;
      seen = true;
    }
  }
  float lt = 0.0f, acct[kChunks][kVec] = {};
#pragma unroll
  for (int part = 0; part < kTileParts; ++part) {
    for (int x = 0; x < kWarpSize; ++x) {
      const int64_t r = __shfl_sync(kFullMask, rows[part], x);
      const float s = __shfl_sync(kFullMask, sc[part], x);
      if (r < 0) continue;
      const float w = expf(__fsub_rn(s, mt));
      lt = __fadd_rn(lt, w);
      const KV* v = v_pool + r * stride + kvh * h;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int64_t d0 = static_cast<int64_t>(lane) * kVec + c * kStride;
        const int cnt = d0 < h ? ChunkCount(d0, h) : 0;
        if (cnt == 0) continue;
        float vv[kVec];
        LoadChunk(v + d0, cnt, vv);
#pragma unroll
        for (int i = 0; i < kVec; ++i) acct[c][i] = __fmaf_rn(w, vv[i], acct[c][i]);
      }
    }
  }
  const bool first = st->l == 0.0f;
  const MergeWeights mw = first ? MergeWeights{mt, 0.0f, 1.0f} : MergeFactors(st->m, mt);
  st->m = mw.m;
  st->l = first ? lt : Merged(st->l, mw.a, lt, mw.b);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      st->acc[c][i] = first ? acct[c][i] : Merged(st->acc[c][i], mw.a, acct[c][i], mw.b);
    }
  }
}

// One warp per (token t, query head n): tiles in increasing order, then out[t, n].
template <typename Q, typename KV, int kChunks>
__global__ void __launch_bounds__(kAttnWarps * kWarpSize)
    AttendKernel(const Q* __restrict__ q, const KV* __restrict__ k_pool,
                 const KV* __restrict__ v_pool, Dims dm, Tables tb, float scale, int32_t window,
                 Q* __restrict__ out) {
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kAttnWarps + threadIdx.x / kWarpSize;
  if (w >= dm.t * dm.n) return;  // uniform per warp
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const int64_t t = w / dm.n, n = w % dm.n, kvh = n / (dm.n / dm.k), h = dm.h;
  const int64_t pos = tb.positions[t], chain = tb.chain_of[t];
  LaneState<kChunks> st = {};
  if (pos >= 0 && chain >= 0 && chain < dm.c) {
    float qv[kChunks][kVec];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int64_t d0 = static_cast<int64_t>(lane) * kVec + c * kStride;
      LoadChunk(q + w * h + d0, d0 < h ? ChunkCount(d0, h) : 0, qv[c]);
    }
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
      TileStep(qv, k_pool, v_pool, rows, dm.k * h, kvh, h, scale, lane, &st);
    }
  }
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t d0 = static_cast<int64_t>(lane) * kVec + c * kStride;
    if (d0 >= h) continue;
    float o[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) o[i] = Normalised(st.acc[c][i], st.l);
    StoreChunk(out + w * h + d0, ChunkCount(d0, h), o);
  }
}

using launch::Kernel;
using launch::ForcedKernel;
using launch::Workspace;
using launch::kBlockPW;
using launch::kSplitMaxTokens;
using launch::LaunchLanes;
using launch::LaunchBlock;
using launch::LaunchSplit;

// The kernel for this step. Block shares each K/V tile among a query tile of one chain's tokens
// and the G heads of a kv head: it pays for forests and prefill chunks (measured on the H200:
// 1.3-2.9x the lanes kernel), but a block of one-token chains (decode: T <= 64 rows) runs its
// chains one after another (~6x slower). The handler cannot see the tables (no host sync) and
// C is padded to T, so the step's size decides: T > kSplitMaxTokens takes the block kernel.
// Small steps (decode rows, a follow-up question of <= 64 tokens on a long cached state) have
// too few (token, head) pairs to fill the GPU when each walks its tiles serially (lanes: ~1,000
// warps, ~0.6 ms per 27B layer on a 4K state), so they take the split kernel: one work item
// per (query tile, kv head, key tile), then an in-order merge pass; same bits. Up to
// kSplitMaxTokens (a forest, a one-question prefill) the split also wins: the block kernel's
// blocks walk 1 to T / 64 tiles each (causal), so the SMs holding the last query tiles finish
// long after the rest; the split spreads the tiles evenly.

Kernel ChooseKernel(const Dims& dm) {
  const bool fast_h = dm.h == 64 || dm.h == 128 || dm.h == 256;
  const int64_t pairs = block::kWarps * kBlockPW;
  const bool block_ok = fast_h && dm.g() <= pairs && pairs % dm.g() == 0 &&
                        CeilDiv(dm.t, pairs / dm.g()) <= 0x7fffffff && dm.k <= 65535;
  Kernel k = ForcedKernel();
  const bool split_ok = block_ok && CeilDiv(dm.t, pairs / dm.g()) <= split::kMaxQueryTiles;
  if (k == Kernel::kAuto) k = !block_ok ? Kernel::kLanes
                          : dm.t > kSplitMaxTokens || !split_ok ? Kernel::kBlock : Kernel::kSplit;
  if (k == Kernel::kSplit && block_ok && !split_ok) k = Kernel::kBlock;
  if ((k == Kernel::kBlock || k == Kernel::kSplit) && !block_ok) k = Kernel::kLanes;
  if (k == Kernel::kLanes && !fast_h) k = Kernel::kWarp;
  return k;
}

template <typename Q, typename KV>
ffi::Error Launch(cudaStream_t stream, const Workspace& ws, const Q* q, const KV* k_new,
                  const KV* v_new, const Dims& dm, const Tables& tb, float scale, int32_t window,
                  Q* out, KV* k_pool, KV* v_pool) {
  const char* op = "prism_tree_attention";
  const int64_t row = dm.k * dm.h, total = k_new != nullptr ? dm.t * row : 0;
  if (total > 0) {  // first the writes (none: qkv_rope stored them), then (same stream) the reads
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(dm.t, kMaxWriteBlocks));
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    const bool vec16 = row * static_cast<int64_t>(sizeof(KV)) % 16 == 0 && aligned(k_new) &&
                       aligned(v_new) && aligned(k_pool) && aligned(v_pool);
    auto* write = vec16 ? WriteKernel<KV, true> : WriteKernel<KV, false>;
    write<<<blocks, kWriteThreads, 0, stream>>>(k_new, v_new, tb.slot, dm.t, row, dm.p * dm.l,
                                               k_pool, v_pool);
    if (auto e = LaunchStatus(op); e.failure()) return e;
  }
  const int64_t blocks = CeilDiv(dm.t * dm.n, kAttnWarps);
  if (blocks == 0) return ffi::Error::Success();
  PRISM_REQUIRE(blocks <= 0x7fffffff, "prism_tree_attention: T * N too large for one grid");
  const unsigned grid = static_cast<unsigned>(blocks);
  static_assert(lanes::kWarps == kAttnWarps, "warp and lanes kernels use the same grid");
  const Kernel kernel = ChooseKernel(dm);
  if (kernel == Kernel::kBlock) {  // tree_attention_block.cuh: same bits, K/V shared in smem
    switch (dm.h) {
      case 64: return LaunchBlock<64>(stream, q, k_pool, v_pool, dm, tb, scale, window, out);
      case 128: return LaunchBlock<128>(stream, q, k_pool, v_pool, dm, tb, scale, window, out);
      case 256: return LaunchBlock<256>(stream, q, k_pool, v_pool, dm, tb, scale, window, out);
      default: break;
    }
  }
  if (kernel == Kernel::kSplit) {  // tree_attention_split.cuh: same bits, parallel over tiles
    auto split = [&](auto h) {
      return LaunchSplit<decltype(h)::value>(stream, ws, q, k_pool, v_pool, dm, tb, scale,
                                             window, out);
    };
    switch (dm.h) {
      case 64: return split(std::integral_constant<int, 64>{});
      case 128: return split(std::integral_constant<int, 128>{});
      case 256: return split(std::integral_constant<int, 256>{});
      default: break;
    }
  }
  if (kernel == Kernel::kLanes) {  // tree_attention_lanes.cuh: same bits, batched coalesced loads
    switch (dm.h) {
      case 64: return LaunchLanes<64>(grid, stream, q, k_pool, v_pool, dm, tb, scale, window, out);
      case 128: return LaunchLanes<128>(grid, stream, q, k_pool, v_pool, dm, tb, scale, window, out);
      case 256: return LaunchLanes<256>(grid, stream, q, k_pool, v_pool, dm, tb, scale, window, out);
      default: break;
    }
  }
  if (dm.h <= kStride) {
    AttendKernel<Q, KV, 1><<<grid, kAttnWarps * kWarpSize, 0, stream>>>(
        q, k_pool, v_pool, dm, tb, scale, window, out);
  } else {
    AttendKernel<Q, KV, 2><<<grid, kAttnWarps * kWarpSize, 0, stream>>>(
        q, k_pool, v_pool, dm, tb, scale, window, out);
  }
  return LaunchStatus(op);
}

ffi::Error TreeAttentionCuda(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k_new,
                             ffi::AnyBuffer v_new, ffi::AnyBuffer k_pages, ffi::AnyBuffer v_pages,
                             ffi::BufferR1<ffi::S32> slot, ffi::BufferR1<ffi::S32> positions,
                             ffi::BufferR1<ffi::S32> chain_of, ffi::BufferR3<ffi::S32> segs,
                             ffi::BufferR1<ffi::S32> pages_flat, ffi::Result<ffi::AnyBuffer> out,
                             ffi::Result<ffi::AnyBuffer> k_out, ffi::Result<ffi::AnyBuffer> v_out,
                             ffi::Result<ffi::BufferR1<ffi::F32>> workspace, float scale,
                             int32_t window) {
  Dims dm;
  if (auto e = CheckTreeAttentionShapes(q, k_new, v_new, k_pages, v_pages, slot.dimensions()[0],
                           positions.dimensions()[0], chain_of.dimensions()[0],
                           segs.dimensions(), pages_flat.dimensions()[0], &dm);
      e.failure()) {
    return e;
  }
  PRISM_RETURN_IF_ERROR(CopyUnlessAliasedAsync(stream, k_pages, k_out, "prism_tree_attention"));
  PRISM_RETURN_IF_ERROR(CopyUnlessAliasedAsync(stream, v_pages, v_out, "prism_tree_attention"));
  const Tables tb{slot.typed_data(), positions.typed_data(), chain_of.typed_data(),
                  segs.typed_data(), pages_flat.typed_data()};
  auto run = [&](auto* qp, auto* kvp) {
    using Q = std::remove_const_t<std::remove_pointer_t<decltype(qp)>>;
    using KV = std::remove_const_t<std::remove_pointer_t<decltype(kvp)>>;
    const Workspace ws{workspace->typed_data(), static_cast<int64_t>(workspace->element_count())};
    const bool write = WritesNewRows(k_new);  // else qkv_rope stored them
    return Launch(stream, ws, qp, write ? k_new.reinterpret_data<KV>() : nullptr,
                  write ? v_new.reinterpret_data<KV>() : nullptr, dm, tb, scale, window,
                  out->reinterpret_data<Q>(),
                  k_out->reinterpret_data<KV>(), v_out->reinterpret_data<KV>());
  };
  const bool q32 = q.element_type() == ffi::DataType::F32;
  const bool kv32 = k_pages.element_type() == ffi::DataType::F32;
  if (q32 && kv32) return run(q.reinterpret_data<float>(), static_cast<float*>(nullptr));
  if (q32) return run(q.reinterpret_data<float>(), static_cast<uint16_t*>(nullptr));
  if (kv32) return run(q.reinterpret_data<uint16_t>(), static_cast<float*>(nullptr));
  return run(q.reinterpret_data<uint16_t>(), static_cast<uint16_t*>(nullptr));
}

}  // namespace
}  // namespace prism

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismTreeAttentionCuda, prism::TreeAttentionCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()            // q [T, N, H]
                                  .Arg<ffi::AnyBuffer>()            // k_new [T, K, H]
                                  .Arg<ffi::AnyBuffer>()            // v_new [T, K, H]
                                  .Arg<ffi::AnyBuffer>()            // k_pages [P, L, K, H]
                                  .Arg<ffi::AnyBuffer>()            // v_pages [P, L, K, H]
                                  .Arg<ffi::BufferR1<ffi::S32>>()  // slot [T]
                                  .Arg<ffi::BufferR1<ffi::S32>>()  // positions [T]
                                  .Arg<ffi::BufferR1<ffi::S32>>()  // chain_of [T]
                                  .Arg<ffi::BufferR3<ffi::S32>>()  // chain_segments [C, S, 3]
                                  .Arg<ffi::BufferR1<ffi::S32>>()  // pages_flat [Pt]
                                  .Ret<ffi::AnyBuffer>()            // out [T, N, H] q's dtype
                                  .Ret<ffi::AnyBuffer>()            // k_pages (aliased)
                                  .Ret<ffi::AnyBuffer>()            // v_pages (aliased)
                                  .Ret<ffi::BufferR1<ffi::F32>>()  // split kernel workspace
                                  .Attr<float>("scale")
                                  .Attr<int32_t>("window"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
