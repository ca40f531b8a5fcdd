// Candidate readout on the CPU (R readout rows, C candidates per row, D model dim, V vocab):
//   prism_candidate_head   hidden [R, D], embedding [V, D], ids s32 [R, C], counts s32 [R]
//                          -> logits f32 [R, C], logprobs f32 [R, C] (renormalised over the
//                             row's first counts[r] candidates; padding gets -inf)
//   prism_vocab_logsumexp  hidden [R, D], embedding [V, D]
//                          -> lse f32 [R], partials f32 [R, T, 2] (T = ceil(V / kVocabTile))
// Logits are Softcap(canonical dot(hidden, embedding[id])); both ops use the same dot, so
// logits[r, c] - lse[r] is the full-vocabulary log-probability of candidate c.
// Out-of-range ids and rows whose count is outside [1, C] produce NaN, never a bad read.
// Work runs on XLA's CPU thread pool: vocab_logsumexp over (row chunk, vocab tile) items whose
// partials are merged in tile order afterwards, candidate_head over row blocks. With AVX2, one
// register holds 8 vocab entries' dots, each element repeating the scalar canonical sequence,
// so every path and every split gives the bits of the scalar loop.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cc/common.h"
#include "cc/cpu_parallel.h"
#include "cc/numerics.h"
#include "cc/ops/candidate_head.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PRISM_X86 1
#else
#define PRISM_X86 0
#endif

namespace prism {
namespace {

using head::CheckHiddenEmbedding;
using head::CheckVocabPartials;
using head::DispatchHiddenEmbedding;
using head::VocabTiles;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int kGroup = 8;          // vocab entries per SIMD group: one AVX2 register of f32
constexpr int64_t kRowChunk = 32;  // hidden rows per work item; the vocab tile is read once
constexpr int64_t kMinItemMacs = int64_t{1} << 18;  // candidate rows per item: ~0.25 ms each

// The canonical logit of numerics.h, one vocab entry at a time: the definition every faster
// path below must reproduce bit for bit, and the path of CPUs without AVX2.
template <typename H, typename E>
float Logit(const H* h, const E* e, int64_t d, float softcap) {
  const float dot = CanonicalSumHost(d, [&](int64_t i) { return ToF32(h[i]) * ToF32(e[i]); });
  return Softcap(dot, softcap);
}

#if PRISM_X86
// Canonical dots vectorised ACROSS vocab entries: SIMD element k runs CanonicalSumHost's exact
// sequence for entry k (per lane, h[d] * e[d] rounded, then added in increasing d; then the
// butterfly), so no element ever meets another one's data. Multiply and add stay separate
// instructions (no "fma" target, and -ffp-contract=off); bf16 -> f32 is an exact shift.
#define PRISM_AVX2 __attribute__((target("avx2")))

PRISM_AVX2 inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
PRISM_AVX2 inline __m256 Load8(const uint16_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

// In place: r[k][j] becomes r[j][k] (8 x 8 floats).
PRISM_AVX2 inline void Transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// et[i * 8 + k] = float(e[k][i]) for i < d: one load then gives element i of all 8 entries.
template <typename E>
PRISM_AVX2 void TransposeGroup(const E* const e[kGroup], int64_t d, float* et) {
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) {
    __m256 r[8];
    for (int k = 0; k < kGroup; ++k) r[k] = Load8(e[k] + i);
    Transpose8(r);
    for (int k = 0; k < 8; ++k) _mm256_storeu_ps(et + (i + k) * kGroup, r[k]);
  }
  for (; i < d; ++i)
    for (int k = 0; k < kGroup; ++k) et[i * kGroup + k] = ToF32(e[k][i]);
}

// One element i of one lane for RB rows: acc[r] = acc[r] + h[r][i] * e[i] (8 entries each).
// A function, not a lambda: GCC compiles lambdas without the enclosing target("avx2").
template <int RB>
PRISM_AVX2 __attribute__((always_inline)) inline void Step(__m256 acc[RB], const float* const h[RB],
                                                          const float* et, int64_t i) {
  const __m256 e = _mm256_loadu_ps(et + i * kGroup);
  for (int r = 0; r < RB; ++r)
    acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(_mm256_broadcast_ss(h[r] + i), e));
}

// dots[r] = canonical dots of hidden row h[r] with the group's 8 entries, for RB rows. NL lanes
// are accumulated together so that RB * NL independent add chains hide the add latency.
template <int RB, int NL>
PRISM_AVX2 void GroupDots(const float* const h[RB], const float* et, int64_t d, __m256 dots[RB]) {
  __m256 lane[kLanes][RB];
  for (int l0 = 0; l0 < kLanes; l0 += NL) {
    __m256 acc[NL][RB];
    for (auto& a : acc)
      for (auto& x : a) x = _mm256_setzero_ps();
    for (int64_t base = 0; base < d; base += kStride) {
      const int64_t d0 = base + int64_t{l0} * kVec;  // lane l0 + k owns [d0 + 8k, d0 + 8k + 8)
      if (d0 + NL * kVec <= d) {
        // Not unrolled: fully unrolled, GCC hoists every broadcast of the chunk and spills them.
#pragma GCC unroll 1
        for (int v = 0; v < kVec; ++v)
#pragma GCC unroll 8
          for (int k = 0; k < NL; ++k) Step<RB>(acc[k], h, et, d0 + k * kVec + v);
      } else {
        for (int k = 0; k < NL; ++k) {
          const int64_t end = std::min(d, d0 + (k + 1) * kVec);
          for (int64_t i = d0 + k * kVec; i < end; ++i) Step<RB>(acc[k], h, et, i);
        }
      }
    }
    for (int k = 0; k < NL; ++k)
      for (int r = 0; r < RB; ++r) lane[l0 + k][r] = acc[k][r];
  }
  for (int off = kLanes / 2; off > 0; off /= 2)
    for (int i = 0; i < off; ++i)
      for (int r = 0; r < RB; ++r) lane[i][r] = _mm256_add_ps(lane[i][r], lane[i + off][r]);
  for (int r = 0; r < RB; ++r) dots[r] = lane[0][r];
}

template <int RB, int NL>
PRISM_AVX2 void StoreGroupDots(const float* const* h, const float* et, int64_t d, float* out) {
  __m256 dots[RB];
  GroupDots<RB, NL>(h, et, d, dots);
  for (int r = 0; r < RB; ++r) _mm256_storeu_ps(out + r * kGroup, dots[r]);
}

// out[r * 8 + k] = canonical dot(h[r], e[k]) for r < n_rows: 8 rows at a time, then 4, 2, 1
// (fewer rows, more lanes at once).
template <typename E>
PRISM_AVX2 void GroupDotsRows(const E* const e[kGroup], const float* const* h, int64_t n_rows,
                              int64_t d, float* et, float* out) {
  TransposeGroup(e, d, et);
  int64_t r = 0;
  for (; r + 8 <= n_rows; r += 8) StoreGroupDots<8, 1>(h + r, et, d, out + r * kGroup);
  if (r + 4 <= n_rows) StoreGroupDots<4, 2>(h + r, et, d, out + r * kGroup), r += 4;
  if (r + 2 <= n_rows) StoreGroupDots<2, 4>(h + r, et, d, out + r * kGroup), r += 2;
  if (r < n_rows) StoreGroupDots<1, 8>(h + r, et, d, out + r * kGroup);
}

// logits[r * kVocabTile + j - v0] for rows h[0, n_rows) and vocab [v0, v1); a short last group
// repeats entry v1 - 1, whose extra dots are dropped.
template <typename E>
PRISM_AVX2 void TileLogitsAvx2(const float* const* h, int64_t n_rows, const E* emb, int64_t v0,
                               int64_t v1, int64_t d, float softcap, float* logits) {
  std::vector<float> et(d * kGroup), dots(n_rows * kGroup);
  for (int64_t j0 = v0; j0 < v1; j0 += kGroup) {
    const E* e[kGroup];
    for (int k = 0; k < kGroup; ++k) e[k] = emb + std::min(j0 + k, v1 - 1) * d;
    GroupDotsRows(e, h, n_rows, d, et.data(), dots.data());
    const int64_t n = std::min<int64_t>(kGroup, v1 - j0);
    for (int64_t r = 0; r < n_rows; ++r)
      for (int64_t k = 0; k < n; ++k)
        logits[r * kVocabTile + j0 - v0 + k] = Softcap(dots[r * kGroup + k], softcap);
  }
}
#endif  // PRISM_X86

bool HasAvx2() {
#if PRISM_X86
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
#else
  return false;
#endif
}

// hidden as float32 rows (bf16 -> f32 is exact), for the AVX2 paths.
template <typename H>
std::vector<float> HiddenF32(const H* hidden, int64_t n) {
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = ToF32(hidden[i]);
  return out;
}

// One readout row: logits of its first n candidates (NaN for an out-of-range id), -inf after;
// log-probs renormalised over the n candidates, in the original sequential order.
template <typename H, typename E>
void CandidateRow(const H* h, const float* hf, const E* emb, const int32_t* ids, int32_t n,
                  int64_t c_count, int64_t v, int64_t d, float softcap, float* lr, float* pr) {
  if (n < 1 || n > c_count) {
    std::fill(lr, lr + c_count, kNaN);
    std::fill(pr, pr + c_count, kNaN);
    return;
  }
  auto valid = [&](int64_t c) { return ids[c] >= 0 && ids[c] < v; };
  int64_t c = 0;
#if PRISM_X86
  if (hf != nullptr) {
    std::vector<float> et(d * kGroup);
    for (; c + kGroup <= n; c += kGroup) {
      const E* e[kGroup];
      for (int k = 0; k < kGroup; ++k) e[k] = emb + (valid(c + k) ? ids[c + k] : 0) * d;
      GroupDotsRows(e, &hf, 1, d, et.data(), lr + c);
      for (int k = 0; k < kGroup; ++k) lr[c + k] = Softcap(lr[c + k], softcap);
    }
  }
#endif
  for (; c < n; ++c) lr[c] = valid(c) ? Logit(h, emb + ids[c] * d, d, softcap) : 0.0f;
  float mx = kNegInf;
  for (c = 0; c < c_count; ++c) {
    if (c >= n) {
      lr[c] = kNegInf;
    } else {
      if (!valid(c)) lr[c] = kNaN;
      mx = std::isnan(lr[c]) || std::isnan(mx) ? kNaN : std::max(mx, lr[c]);
    }
  }
  float se = 0.0f;
  for (c = 0; c < n; ++c) se = se + expf(lr[c] - mx);
  const float lse = mx + logf(se);
  for (c = 0; c < c_count; ++c) pr[c] = c < n ? lr[c] - lse : kNegInf;
}

template <typename H, typename E>
void CandidateRows(ffi::ThreadPool& pool, const H* hidden, const E* emb, const int32_t* ids,
                   const int32_t* counts, int64_t r_count, int64_t c_count, int64_t v, int64_t d,
                   float softcap, float* logits, float* logprobs) {
  const bool avx2 = HasAvx2() && v > 0;  // the AVX2 path reads entry 0 for invalid ids
  const std::vector<float> hf = avx2 ? HiddenF32(hidden, r_count * d) : std::vector<float>();
  const int64_t per_item = std::max<int64_t>(1, kMinItemMacs / std::max<int64_t>(1, c_count * d));
  ParallelFor(pool, (r_count + per_item - 1) / per_item, [&](int64_t it) {
    for (int64_t r = it * per_item; r < std::min(r_count, (it + 1) * per_item); ++r) {
      CandidateRow(hidden + r * d, avx2 ? hf.data() + r * d : nullptr, emb, ids + r * c_count,
                   counts[r], c_count, v, d, softcap, logits + r * c_count,
                   logprobs + r * c_count);
    }
  });
}

// Work item (row chunk, vocab tile t): the tile's logits, then its online log-sum-exp
// partial (max, sum of exp(logit - max)) in increasing vocab order.
template <typename H, typename E>
void VocabTile(const H* hidden, const float* hf, const E* emb, int64_t r0, int64_t r1,
               int64_t t, int64_t v, int64_t d, float softcap, float* partials) {
  const int64_t tiles = VocabTiles(v);
  const int64_t v0 = t * kVocabTile, v1 = std::min(v, v0 + kVocabTile);
  std::vector<float> logits((r1 - r0) * kVocabTile);
#if PRISM_X86
  if (hf != nullptr) {
    const float* h[kRowChunk];
    for (int64_t r = r0; r < r1; ++r) h[r - r0] = hf + r * d;
    TileLogitsAvx2(h, r1 - r0, emb, v0, v1, d, softcap, logits.data());
  }
#endif
  for (int64_t r = r0; r < r1; ++r) {
    float* lg = logits.data() + (r - r0) * kVocabTile;
    if (hf == nullptr) {
      for (int64_t j = v0; j < v1; ++j) lg[j - v0] = Logit(hidden + r * d, emb + j * d, d, softcap);
    }
    float mx = kNegInf;
    for (int64_t j = v0; j < v1; ++j) mx = std::max(mx, lg[j - v0]);
    float se = 0.0f;
    for (int64_t j = v0; j < v1; ++j) se = se + expf(lg[j - v0] - mx);
    partials[(r * tiles + t) * 2] = mx;
    partials[(r * tiles + t) * 2 + 1] = se;
  }
}

// Online log-sum-exp per vocab tile (work items over row chunks x tiles, in any order), then
// each row's tiles merged in increasing tile order.
template <typename H, typename E>
void VocabLseRows(ffi::ThreadPool& pool, const H* hidden, const E* emb, int64_t r_count,
                  int64_t v, int64_t d, float softcap, float* lse, float* partials) {
  const int64_t tiles = VocabTiles(v);
  const int64_t chunks = (r_count + kRowChunk - 1) / kRowChunk;
  const bool avx2 = HasAvx2();
  const std::vector<float> hf = avx2 ? HiddenF32(hidden, r_count * d) : std::vector<float>();
  // Item it = t * chunks + c: the chunks of one tile run side by side and share it in cache.
  ParallelFor(pool, tiles * chunks, [&](int64_t it) {
    const int64_t t = it / chunks, r0 = (it % chunks) * kRowChunk;
    VocabTile(hidden, avx2 ? hf.data() : nullptr, emb, r0, std::min(r_count, r0 + kRowChunk), t,
              v, d, softcap, partials);
  });
  for (int64_t r = 0; r < r_count; ++r) {
    const float* part = partials + r * tiles * 2;
    float mx = kNegInf;
    for (int64_t t = 0; t < tiles; ++t) mx = std::max(mx, part[2 * t]);
    float se = 0.0f;
    for (int64_t t = 0; t < tiles; ++t) se = se + part[2 * t + 1] * expf(part[2 * t] - mx);
    lse[r] = mx + logf(se);
  }
}

ffi::Error CandidateHeadCpu(ffi::ThreadPool pool, ffi::AnyBuffer hidden, ffi::AnyBuffer emb,
                            ffi::BufferR2<ffi::S32> ids, ffi::BufferR1<ffi::S32> counts,
                            ffi::Result<ffi::BufferR2<ffi::F32>> logits,
                            ffi::Result<ffi::BufferR2<ffi::F32>> logprobs, float softcap) {
  if (auto e = CheckHiddenEmbedding(hidden, emb, "prism_candidate_head"); e.failure()) return e;
  const int64_t r = hidden.dimensions()[0], d = hidden.dimensions()[1];
  const int64_t v = emb.dimensions()[0], c = ids.dimensions()[1];
  PRISM_REQUIRE(ids.dimensions()[0] == r, "prism_candidate_head: ids must be [R, C]");
  PRISM_REQUIRE(counts.dimensions()[0] == r, "prism_candidate_head: counts must be [R]");
  DispatchHiddenEmbedding(hidden, emb, [&](auto* h, auto* e) {
    CandidateRows(pool, h, e, ids.typed_data(), counts.typed_data(), r, c, v, d, softcap,
                  logits->typed_data(), logprobs->typed_data());
  });
  return ffi::Error::Success();
}

ffi::Error VocabLogSumExpCpu(ffi::ThreadPool pool, ffi::AnyBuffer hidden, ffi::AnyBuffer emb,
                             ffi::Result<ffi::BufferR1<ffi::F32>> lse,
                             ffi::Result<ffi::BufferR3<ffi::F32>> partials, float softcap) {
  if (auto e = CheckHiddenEmbedding(hidden, emb, "prism_vocab_logsumexp"); e.failure()) return e;
  if (auto e = CheckVocabPartials(hidden, emb, partials->dimensions()); e.failure()) return e;
  const int64_t r = hidden.dimensions()[0], d = hidden.dimensions()[1];
  const int64_t v = emb.dimensions()[0];
  DispatchHiddenEmbedding(hidden, emb, [&](auto* h, auto* e) {
    VocabLseRows(pool, h, e, r, v, d, softcap, lse->typed_data(), partials->typed_data());
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace prism

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismCandidateHeadCpu, prism::CandidateHeadCpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()            // hidden [R, D]
                                  .Arg<ffi::AnyBuffer>()            // embedding [V, D]
                                  .Arg<ffi::BufferR2<ffi::S32>>()  // ids [R, C]
                                  .Arg<ffi::BufferR1<ffi::S32>>()  // counts [R]
                                  .Ret<ffi::BufferR2<ffi::F32>>()  // logits [R, C]
                                  .Ret<ffi::BufferR2<ffi::F32>>()  // logprobs [R, C]
                                  .Attr<float>("softcap"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismVocabLogSumExpCpu, prism::VocabLogSumExpCpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()            // hidden [R, D]
                                  .Arg<ffi::AnyBuffer>()            // embedding [V, D]
                                  .Ret<ffi::BufferR1<ffi::F32>>()  // lse [R]
                                  .Ret<ffi::BufferR3<ffi::F32>>()  // partials [R, T, 2]
                                  .Attr<float>("softcap"));
