// The vocabulary log-sum-exp on CUDA; the specification is candidate_head_cpu.cc's
// VocabLseRows. Shapes: R readout rows, D model dim, V vocab, T = ceil(V / kVocabTile) tiles.
//   prism_vocab_logsumexp  hidden [R, D], embedding [V, D] -> lse f32 [R], partials [R, T, 2]
// Every logit is a canonical warp dot (bit-identical to the CPU before Softcap); the tile
// reductions and the merge use CUDA's expf/logf, so lse may differ from the CPU by ulps.
#include <cuda_runtime.h>

#include <algorithm>

#include "cc/common.h"
#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/candidate_head.h"
#include "cc/ops/head_common.cuh"

namespace prism {
namespace {

using head::CheckHiddenEmbedding;
using head::CheckVocabPartials;
using head::VocabTiles;
using head::DispatchHiddenEmbedding;
using head::kRowThreads;
using head::MaxLikeStd;

constexpr int kTileThreads = 1024;    // vocab tile block: 32 warps share a tile's 2048 rows
                                      // (with R = 1 there is one block per tile: 129 in all)
constexpr int kTileWarps = kTileThreads / kWarpSize;
constexpr int kRowsPerBlock = 4;      // hidden rows per tile block: the tile is read once for
                                      // all of them; each row's dot is still its own chain
constexpr int kDotUnroll = 2;         // embedding chunks in flight per lane (fits 64 registers)

// acc[k] += h row k . e over the kDotUnroll chunks of this lane starting at base, in increasing
// d. The embedding chunks are all fetched first (their loads overlap), then reused for every
// row (hidden rows stay in L1).
template <typename H, typename E>
__device__ __forceinline__ void DotStep(const H* h, const E* e, int64_t d, int64_t base,
                                        int rows, float (&acc)[kRowsPerBlock]) {
  float ev[kDotUnroll][kVec];
  int cnt[kDotUnroll];
#pragma unroll
  for (int u = 0; u < kDotUnroll; ++u) {
    const int64_t d0 = base + u * kStride;
    cnt[u] = d0 < d ? ChunkCount(d0, d) : 0;
    LoadChunk(e + d0, cnt[u], ev[u]);
  }
#pragma unroll
  for (int k = 0; k < kRowsPerBlock; ++k) {
    if (k >= rows) break;
#pragma unroll
    for (int u = 0; u < kDotUnroll; ++u) {
      float hv[kVec];
      LoadChunk(h + k * d + base + u * kStride, cnt[u], hv);
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        if (i < cnt[u]) acc[k] = __fadd_rn(acc[k], __fmul_rn(hv[i], ev[u][i]));
      }
    }
  }
}

// acc[k] = canonical dot(h row k, e) for k < rows: one chain per row, as WarpCanonicalSum.
template <typename H, typename E>
__device__ void WarpDots(const H* h, const E* e, int64_t d, int rows, int lane,
                         float (&acc)[kRowsPerBlock]) {
#pragma unroll
  for (int k = 0; k < kRowsPerBlock; ++k) acc[k] = 0.0f;
  for (int64_t base = static_cast<int64_t>(lane) * kVec; base < d;
       base += kDotUnroll * kStride) {
    DotStep(h, e, d, base, rows, acc);
  }
#pragma unroll
  for (int k = 0; k < kRowsPerBlock; ++k) acc[k] = WarpButterflySum(acc[k]);
}

// One warp reduces a tile's n logits of one row to (max, sum of expf(l - max)). The lane
// split is fixed (j % 32), so the result depends only on the row's logits.
__device__ void ReduceTile(const float* lg, int n, int lane, float* out) {
  float mx = NegInf();
  for (int j = lane; j < n; j += kWarpSize) mx = MaxLikeStd(mx, lg[j]);
#pragma unroll
  for (int off = kWarpSize / 2; off > 0; off /= 2) {
    mx = MaxLikeStd(mx, __shfl_xor_sync(kFullMask, mx, off));
  }
  mx = __shfl_sync(kFullMask, mx, 0);  // one value for all lanes even if +0 and -0 tie
  float se = 0.0f;
  for (int j = lane; j < n; j += kWarpSize) se = __fadd_rn(se, expf(__fsub_rn(lg[j], mx)));
  se = WarpButterflySum(se);
  if (lane == 0) {
    out[0] = mx;
    out[1] = se;
  }
}

// Block (x = group of kRowsPerBlock rows, y = vocab tile t): logits of the tile for those rows
// into shared memory, then one warp per row writes partials[r, t, :]. Rows sharing a tile sit
// next to each other in x, so concurrent blocks read the same embedding rows from L2.
template <typename H, typename E>
__global__ void __launch_bounds__(kTileThreads)
    VocabTileKernel(const H* __restrict__ hidden, const E* __restrict__ emb, int64_t r_count,
                    int64_t v, int64_t d, int64_t tiles, float softcap,
                    float* __restrict__ partials) {
  __shared__ float lg[kRowsPerBlock][kVocabTile];
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock;
  const int rows = static_cast<int>(std::min<int64_t>(kRowsPerBlock, r_count - r0));
  const int64_t t = blockIdx.y, v0 = t * kVocabTile;
  const int n = static_cast<int>(std::min<int64_t>(kVocabTile, v - v0));
  const int warp = static_cast<int>(threadIdx.x / kWarpSize);
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  for (int j = warp; j < n; j += kTileWarps) {
    float acc[kRowsPerBlock];
    WarpDots(hidden + r0 * d, emb + (v0 + j) * d, d, rows, lane, acc);
#pragma unroll
    for (int k = 0; k < kRowsPerBlock; ++k) {
      if (lane == 0 && k < rows) lg[k][j] = Softcap(acc[k], softcap);
    }
  }
  __syncthreads();
  if (warp < rows) ReduceTile(lg[warp], n, lane, partials + ((r0 + warp) * tiles + t) * 2);
}

// One thread per row merges its tiles in increasing t, exactly as VocabLseRows.
__global__ void __launch_bounds__(kRowThreads)
    VocabMergeKernel(const float* __restrict__ partials, int64_t r_count, int64_t tiles,
                     float* __restrict__ lse) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowThreads + threadIdx.x;
  if (r >= r_count) return;
  const float* part = partials + r * tiles * 2;
  float mx = NegInf();
  for (int64_t t = 0; t < tiles; ++t) mx = MaxLikeStd(mx, part[2 * t]);
  float se = 0.0f;
  for (int64_t t = 0; t < tiles; ++t) {
    se = __fadd_rn(se, __fmul_rn(part[2 * t + 1], expf(__fsub_rn(part[2 * t], mx))));
  }
  lse[r] = __fadd_rn(mx, logf(se));
}


ffi::Error VocabLogSumExpCuda(cudaStream_t stream, ffi::AnyBuffer hidden, ffi::AnyBuffer emb,
                              ffi::Result<ffi::BufferR1<ffi::F32>> lse,
                              ffi::Result<ffi::BufferR3<ffi::F32>> partials, float softcap) {
  const char* op = "prism_vocab_logsumexp";
  if (auto e = CheckHiddenEmbedding(hidden, emb, op); e.failure()) return e;
  if (auto e = CheckVocabPartials(hidden, emb, partials->dimensions()); e.failure()) return e;
  const int64_t r = hidden.dimensions()[0], d = hidden.dimensions()[1];
  const int64_t v = emb.dimensions()[0], tiles = VocabTiles(v);
  if (r == 0) return ffi::Error::Success();
  PRISM_REQUIRE(tiles <= 65535, "prism_vocab_logsumexp: V above 65535 * 2048 is not supported");
  if (tiles > 0) {  // V = 0 leaves lse = -inf, as on the CPU
    const dim3 grid(static_cast<unsigned>(CeilDiv(r, kRowsPerBlock)),
                    static_cast<unsigned>(tiles));
    auto launch = [&](auto* h, auto* e) {
      VocabTileKernel<<<grid, kTileThreads, 0, stream>>>(h, e, r, v, d, tiles, softcap,
                                                         partials->typed_data());
      return LaunchStatus(op);
    };
    if (auto e = DispatchHiddenEmbedding(hidden, emb, launch); e.failure()) return e;
  }
  VocabMergeKernel<<<static_cast<unsigned>(CeilDiv(r, kRowThreads)), kRowThreads, 0, stream>>>(
      partials->typed_data(), r, tiles, lse->typed_data());
  return LaunchStatus(op);
}


}  // namespace
}  // namespace prism

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismVocabLogSumExpCuda, prism::VocabLogSumExpCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()            // hidden [R, D]
                                  .Arg<ffi::AnyBuffer>()            // embedding [V, D]
                                  .Ret<ffi::BufferR1<ffi::F32>>()  // lse [R]
                                  .Ret<ffi::BufferR3<ffi::F32>>()  // partials [R, T, 2]
                                  .Attr<float>("softcap"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
