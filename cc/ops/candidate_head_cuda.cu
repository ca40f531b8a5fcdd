// Candidate readout on CUDA; the specification is candidate_head_cpu.cc. Shapes: R readout rows,
// C candidates per row, D model dim, V vocab.
//   prism_candidate_head   hidden [R, D], embedding [V, D], ids s32 [R, C], counts s32 [R]
//                          -> logits f32 [R, C], logprobs f32 [R, C]
// (prism_vocab_logsumexp, the full-vocabulary normaliser, is vocab_logsumexp_cuda.cu.)
// Every logit is a canonical warp dot (bit-identical to the CPU before Softcap); the softmax
// steps use CUDA's expf/logf/tanhf, so logprobs may differ from the CPU by ulps.
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>

#include "cc/common.h"
#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/candidate_head.h"
#include "cc/ops/head_common.cuh"
#include "cc/reg_chunk.cuh"

namespace prism {
namespace {

using head::CheckHiddenEmbedding;
using head::DispatchHiddenEmbedding;
using head::kRowThreads;
using head::MaxLikeStd;

constexpr int kLogitWarps = 4;  // candidate logits: one warp per (row, candidate)

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
