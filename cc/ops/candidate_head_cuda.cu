// Candidate readout on CUDA; the specification is candidate_head_cpu.cc. Shapes: R readout rows,
// C candidates per row, D model dim, V vocab, T = ceil(V / kVocabTile) vocab tiles.
//   prism_candidate_head   hidden [R, D], embedding [V, D], ids s32 [R, C], counts s32 [R]
//                          -> logits f32 [R, C], logprobs f32 [R, C]
//   prism_vocab_logsumexp  hidden [R, D], embedding [V, D] -> lse f32 [R], partials [R, T, 2]
// Every logit is a canonical warp dot (bit-identical to the CPU before Softcap); the softmax
// steps use CUDA's expf/logf/tanhf, so logprobs and lse may differ from the CPU by ulps.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "cc/common.h"
#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/reg_chunk.cuh"

namespace prism {
namespace {

constexpr int kLogitWarps = 4;        // candidate logits: one warp per (row, candidate)
constexpr int kRowThreads = 128;      // one thread per row for the sequential merges
constexpr int kTileThreads = 1024;    // vocab tile block: 32 warps share a tile's 2048 rows
                                      // (with R = 1 there is one block per tile: 129 in all)
constexpr int kTileWarps = kTileThreads / kWarpSize;
constexpr int kRowsPerBlock = 4;      // hidden rows per tile block: the tile is read once for
                                      // all of them; each row's dot is still its own chain
constexpr int kDotUnroll = 2;         // embedding chunks in flight per lane (fits 64 registers)

// The CPU's std::max(mx, l): a NaN l leaves mx unchanged.
__device__ __forceinline__ float MaxLikeStd(float mx, float l) { return mx < l ? l : mx; }

// Softcap(canonical dot(h, e)) by one whole warp: CandidateRows' Logit.
template <typename H, typename E>
__device__ float WarpLogit(const H* h, const E* e, int64_t d, int lane, float softcap) {
  const float dot = WarpCanonicalSum(d, lane, [&](int64_t d0, int cnt, float (&t)[kVec]) {
    float hv[kVec];
    LoadChunk(h + d0, cnt, hv);
    LoadChunk(e + d0, cnt, t);
#pragma unroll
    for (int i = 0; i < kVec; ++i) t[i] = __fmul_rn(hv[i], t[i]);
  });
  return Softcap(dot, softcap);
}

// The logit of candidate c of a row with n candidates when it is not computed: NaN for a bad
// count or a present candidate's bad id, -inf for padding past n (CandidateRows' rules). Returns
// false when the logit is to be computed. Both logit kernels take it.
__device__ __forceinline__ bool FixedLogit(int32_t n, int64_t c_count, int64_t c, int32_t id,
                                           int64_t v, float* out) {
  if (n < 1 || n > c_count || (c < n && (id < 0 || id >= v))) {
    *out = QuietNaN();
    return true;
  }
  if (c >= n) {
    *out = NegInf();
    return true;
  }
  return false;
}

// Warp g computes logits[r, c] for g = r * C + c: NaN for a bad row or id, -inf for padding.
template <typename H, typename E>
__global__ void __launch_bounds__(kLogitWarps * kWarpSize)
    CandidateLogitsKernel(const H* __restrict__ hidden, const E* __restrict__ emb,
                          const int32_t* __restrict__ ids, const int32_t* __restrict__ counts,
                          int64_t rc, int64_t c_count, int64_t v, int64_t d, float softcap,
                          float* __restrict__ logits) {
  const int64_t g = static_cast<int64_t>(blockIdx.x) * kLogitWarps + threadIdx.x / kWarpSize;
  if (g >= rc) return;  // uniform per warp
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const int64_t r = g / c_count, c = g % c_count;
  const int32_t n = counts[r];
  const int32_t id = ids[g];
  float out;
  if (!FixedLogit(n, c_count, c, id, v, &out)) {
    out = WarpLogit(hidden + r * d, emb + static_cast<int64_t>(id) * d, d, lane, softcap);
  }
  if (lane == 0) logits[g] = out;
}

// The row kernel (the default): one block per readout row, the row's hidden vector staged once
// in shared memory as f32 (exact for bf16), a warp per candidate with kRowUnroll embedding
// chunks in flight per lane. The warp kernel above reads the hidden row again for every
// candidate (from L2) and keeps kSumUnroll = 4 chunks in flight: at R = 2048, C = 16,
// D = 5376 it ran at 66 % of the copy bandwidth (results/ops_h200_session9/). Each logit is
// the same canonical chain of the same products (the lane's partial over its chunks in
// increasing d, then the butterfly: WarpCanonicalSum's order), so both kernels give the same
// bits.
constexpr int kRowLogitWarps = 16;
constexpr int kRowUnroll = 8;
constexpr int64_t kMaxStagedHidden = 12288;  // f32 of the staged row, within 48 KiB

// Softcap(canonical dot(hs, e)) by one whole warp, hs the staged row in shared memory. kFull:
// D % kVec == 0 and e 16-byte aligned, so every present chunk is one unconditional vector load
// (no alignment test whose join would hold each load's result before the next is issued).
template <bool kFull, typename E>
__device__ __forceinline__ float StagedLogit(const float* hs, const E* e, int64_t d, int lane,
                                            float softcap) {
  constexpr int kUnroll = sizeof(E) == 2 ? kRowUnroll : kRowUnroll / 2;  // f32: 8 registers a chunk
  float acc = 0.0f;
  for (int64_t base = static_cast<int64_t>(lane) * kVec; base < d;
       base += kUnroll * kStride) {
    RegChunk<E> t[kUnroll];  // bf16 packed until used: 8 chunks fit 64 registers
    int cnt[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {  // every chunk's load issued before any is used
      const int64_t d0 = base + u * kStride;
      cnt[u] = d0 < d ? ChunkCount(d0, d) : 0;
      if (kFull && cnt[u] > 0) t[u].LoadFull(e + d0);
      if (!kFull && cnt[u] > 0) t[u].Load(e + d0, cnt[u]);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (cnt[u] == 0) continue;
      float hv[kVec];
      LoadChunk(hs + base + u * kStride, cnt[u], hv);
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        if (i < cnt[u]) acc = __fadd_rn(acc, __fmul_rn(hv[i], t[u].Get(i)));
      }
    }
  }
  return Softcap(WarpButterflySum(acc), softcap);
}

// Block r: logits[r, c] for every c, warp w taking candidates w, w + kRowLogitWarps, ...
// NaN for a bad row or id, -inf for padding (FixedLogit).
template <bool kFull, typename H, typename E>
__global__ void __launch_bounds__(kRowLogitWarps * kWarpSize, 2)
    CandidateRowLogitsKernel(const H* __restrict__ hidden, const E* __restrict__ emb,
                             const int32_t* __restrict__ ids, const int32_t* __restrict__ counts,
                             int64_t c_count, int64_t v, int64_t d, float softcap,
                             float* __restrict__ logits) {
  extern __shared__ float4 staged4[];  // the row, whole chunks (zeros past d)
  float* hs = reinterpret_cast<float*>(staged4);
  const int64_t r = blockIdx.x;
  for (int64_t d0 = static_cast<int64_t>(threadIdx.x) * kVec; d0 < d;
       d0 += static_cast<int64_t>(blockDim.x) * kVec) {
    float t[kVec];
    LoadChunk(hidden + r * d + d0, ChunkCount(d0, d), t);
#pragma unroll
    for (int i = 0; i < kVec; ++i) hs[d0 + i] = t[i];
  }
  __syncthreads();
  const int warp = static_cast<int>(threadIdx.x / kWarpSize);
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const int32_t n = counts[r];
  for (int64_t c = warp; c < c_count; c += kRowLogitWarps) {
    const int32_t id = ids[r * c_count + c];
    float out;
    if (!FixedLogit(n, c_count, c, id, v, &out)) {
      out = StagedLogit<kFull>(hs, emb + static_cast<int64_t>(id) * d, d, lane, softcap);
    }
    if (lane == 0) logits[r * c_count + c] = out;
  }
}

// One thread per row: renormalise over the first counts[r] logits exactly as CandidateRows.
__global__ void __launch_bounds__(kRowThreads)
    CandidateRenormKernel(const int32_t* __restrict__ counts, const float* __restrict__ logits,
                          int64_t r_count, int64_t c_count, float* __restrict__ logprobs) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowThreads + threadIdx.x;
  if (r >= r_count) return;
  const float* lr = logits + r * c_count;
  float* pr = logprobs + r * c_count;
  const int32_t n = counts[r];
  if (n < 1 || n > c_count) {
    for (int64_t c = 0; c < c_count; ++c) pr[c] = QuietNaN();
    return;
  }
  float mx = NegInf();
  for (int32_t c = 0; c < n; ++c) {
    mx = isnan(lr[c]) || isnan(mx) ? QuietNaN() : MaxLikeStd(mx, lr[c]);
  }
  float se = 0.0f;
  for (int32_t c = 0; c < n; ++c) se = __fadd_rn(se, expf(__fsub_rn(lr[c], mx)));
  const float lse = __fadd_rn(mx, logf(se));
  for (int64_t c = 0; c < c_count; ++c) pr[c] = c < n ? __fsub_rn(lr[c], lse) : NegInf();
}

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

ffi::Error CheckHiddenEmbedding(const ffi::AnyBuffer& hidden, const ffi::AnyBuffer& emb,
                                const std::string& op) {
  PRISM_REQUIRE(hidden.dimensions().size() == 2, op + ": hidden must be [R, D]");
  PRISM_REQUIRE(emb.dimensions().size() == 2, op + ": embedding must be [V, D]");
  PRISM_REQUIRE(emb.dimensions()[1] == hidden.dimensions()[1],
                op + ": embedding's D must equal hidden's D");
  PRISM_REQUIRE(IsFloatActivation(hidden.element_type()) && IsFloatActivation(emb.element_type()),
                op + ": hidden and embedding must be float32 or bfloat16");
  return ffi::Error::Success();
}

// Returns fn(hidden_ptr, embedding_ptr) with the buffers' element types.
template <typename Fn>
ffi::Error DispatchHiddenEmbedding(const ffi::AnyBuffer& hidden, const ffi::AnyBuffer& emb,
                                   Fn fn) {
  const bool h32 = hidden.element_type() == ffi::DataType::F32;
  const bool e32 = emb.element_type() == ffi::DataType::F32;
  if (h32 && e32) return fn(hidden.reinterpret_data<float>(), emb.reinterpret_data<float>());
  if (h32) return fn(hidden.reinterpret_data<float>(), emb.reinterpret_data<uint16_t>());
  if (e32) return fn(hidden.reinterpret_data<uint16_t>(), emb.reinterpret_data<float>());
  return fn(hidden.reinterpret_data<uint16_t>(), emb.reinterpret_data<uint16_t>());
}

// CandidateRowLogitsKernel over r rows (kFull where every chunk is whole and aligned).
template <typename H, typename E>
void LaunchRowLogits(cudaStream_t stream, const H* h, const E* e, const int32_t* ids,
                     const int32_t* counts, int64_t r, int64_t c, int64_t v, int64_t d,
                     float softcap, float* logits) {
  const size_t smem = static_cast<size_t>(CeilDiv(d, kVec) * kVec) * sizeof(float);
  const unsigned grid = static_cast<unsigned>(r), threads = kRowLogitWarps * kWarpSize;
  if (d % kVec == 0 && (reinterpret_cast<uintptr_t>(e) & 15u) == 0) {
    CandidateRowLogitsKernel<true, H, E><<<grid, threads, smem, stream>>>(
        h, e, ids, counts, c, v, d, softcap, logits);
  } else {
    CandidateRowLogitsKernel<false, H, E><<<grid, threads, smem, stream>>>(
        h, e, ids, counts, c, v, d, softcap, logits);
  }
}

// PRISM_CANDIDATE_HEAD_KERNEL (tests compare the two bitwise): unset or empty takes the row
// kernel wherever its staged row fits (D <= kMaxStagedHidden, R < 2^31) and the warp kernel
// otherwise; "row" or "warp" force one ("row" where it cannot run is an error, not a silent
// fallback); any other value is an error.
ffi::Error UseRowKernel(int64_t r, int64_t d, bool* row) {
  const char* env = std::getenv("PRISM_CANDIDATE_HEAD_KERNEL");
  const std::string name = env != nullptr ? env : "";
  PRISM_REQUIRE(name.empty() || name == "row" || name == "warp",
                "PRISM_CANDIDATE_HEAD_KERNEL must be unset, row or warp; got " + name);
  const bool fits = d <= kMaxStagedHidden && r <= 0x7fffffff;
  PRISM_REQUIRE(name != "row" || fits,
                "prism_candidate_head: PRISM_CANDIDATE_HEAD_KERNEL=row needs D <= " +
                    std::to_string(kMaxStagedHidden) + "; got D = " + std::to_string(d));
  *row = name == "row" || (name.empty() && fits);
  return ffi::Error::Success();
}

ffi::Error CandidateHeadCuda(cudaStream_t stream, ffi::AnyBuffer hidden, ffi::AnyBuffer emb,
                             ffi::BufferR2<ffi::S32> ids, ffi::BufferR1<ffi::S32> counts,
                             ffi::Result<ffi::BufferR2<ffi::F32>> logits,
                             ffi::Result<ffi::BufferR2<ffi::F32>> logprobs, float softcap) {
  const char* op = "prism_candidate_head";
  if (auto e = CheckHiddenEmbedding(hidden, emb, op); e.failure()) return e;
  const int64_t r = hidden.dimensions()[0], d = hidden.dimensions()[1];
  const int64_t v = emb.dimensions()[0], c = ids.dimensions()[1];
  PRISM_REQUIRE(ids.dimensions()[0] == r, "prism_candidate_head: ids must be [R, C]");
  PRISM_REQUIRE(counts.dimensions()[0] == r, "prism_candidate_head: counts must be [R]");
  if (r == 0 || c == 0) return ffi::Error::Success();
  const int64_t blocks = CeilDiv(r * c, kLogitWarps);
  PRISM_REQUIRE(blocks <= 0x7fffffff, "prism_candidate_head: R * C too large for one grid");
  bool row_kernel = false;
  if (auto e = UseRowKernel(r, d, &row_kernel); e.failure()) return e;
  auto launch = [&](auto* h, auto* e) {
    if (row_kernel) {
      LaunchRowLogits(stream, h, e, ids.typed_data(), counts.typed_data(), r, c, v, d, softcap,
                      logits->typed_data());
    } else {
      CandidateLogitsKernel<<<static_cast<unsigned>(blocks), kLogitWarps * kWarpSize, 0,
                              stream>>>(h, e, ids.typed_data(), counts.typed_data(), r * c, c,
                                        v, d, softcap, logits->typed_data());
    }
    return LaunchStatus(op);
  };
  if (auto e = DispatchHiddenEmbedding(hidden, emb, launch); e.failure()) return e;
  CandidateRenormKernel<<<static_cast<unsigned>(CeilDiv(r, kRowThreads)), kRowThreads, 0,
                          stream>>>(counts.typed_data(), logits->typed_data(), r, c,
                                    logprobs->typed_data());
  return LaunchStatus(op);
}

ffi::Error VocabLogSumExpCuda(cudaStream_t stream, ffi::AnyBuffer hidden, ffi::AnyBuffer emb,
                              ffi::Result<ffi::BufferR1<ffi::F32>> lse,
                              ffi::Result<ffi::BufferR3<ffi::F32>> partials, float softcap) {
  const char* op = "prism_vocab_logsumexp";
  if (auto e = CheckHiddenEmbedding(hidden, emb, op); e.failure()) return e;
  const int64_t r = hidden.dimensions()[0], d = hidden.dimensions()[1];
  const int64_t v = emb.dimensions()[0];
  const int64_t tiles = (v + kVocabTile - 1) / kVocabTile;
  PRISM_REQUIRE(partials->dimensions()[0] == r && partials->dimensions()[1] == tiles &&
                    partials->dimensions()[2] == 2,
                "prism_vocab_logsumexp: partials must be [R, ceil(V / 2048), 2]");
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

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismCandidateHeadCuda, prism::CandidateHeadCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()            // hidden [R, D]
                                  .Arg<ffi::AnyBuffer>()            // embedding [V, D]
                                  .Arg<ffi::BufferR2<ffi::S32>>()  // ids [R, C]
                                  .Arg<ffi::BufferR1<ffi::S32>>()  // counts [R]
                                  .Ret<ffi::BufferR2<ffi::F32>>()  // logits [R, C]
                                  .Ret<ffi::BufferR2<ffi::F32>>()  // logprobs [R, C]
                                  .Attr<float>("softcap"),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismVocabLogSumExpCuda, prism::VocabLogSumExpCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()            // hidden [R, D]
                                  .Arg<ffi::AnyBuffer>()            // embedding [V, D]
                                  .Ret<ffi::BufferR1<ffi::F32>>()  // lse [R]
                                  .Ret<ffi::BufferR3<ffi::F32>>()  // partials [R, T, 2]
                                  .Attr<float>("softcap"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
