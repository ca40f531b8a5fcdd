// Candidate readout on the CPU (R readout rows, C candidates per row, D model dim, V vocab):
//   prism_candidate_head   hidden [R, D], embedding [V, D], ids s32 [R, C], counts s32 [R]
//                          -> logits f32 [R, C], logprobs f32 [R, C] (renormalised over the
//                             row's first counts[r] candidates; padding gets -inf)
//   prism_vocab_logsumexp  hidden [R, D], embedding [V, D]
//                          -> lse f32 [R], partials f32 [R, T, 2] (T = ceil(V / kVocabTile))
// Logits are Softcap(canonical dot(hidden, embedding[id])); both ops use the same dot, so
// logits[r, c] - lse[r] is the full-vocabulary log-probability of candidate c.
// Out-of-range ids and rows whose count is outside [1, C] produce NaN, never a bad read.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cc/common.h"
#include "cc/numerics.h"

namespace prism {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

template <typename H, typename E>
float Logit(const H* h, const E* e, int64_t d, float softcap) {
  const float dot = CanonicalSumHost(d, [&](int64_t i) { return ToF32(h[i]) * ToF32(e[i]); });
  return Softcap(dot, softcap);
}

template <typename H, typename E>
void CandidateRows(const H* hidden, const E* emb, const int32_t* ids, const int32_t* counts,
                   int64_t r_count, int64_t c_count, int64_t v, int64_t d, float softcap,
                   float* logits, float* logprobs) {
  for (int64_t r = 0; r < r_count; ++r) {
    float* lr = logits + r * c_count;
    float* pr = logprobs + r * c_count;
    const int32_t n = counts[r];
    if (n < 1 || n > c_count) {
      std::fill(lr, lr + c_count, kNaN);
      std::fill(pr, pr + c_count, kNaN);
      continue;
    }
    float mx = kNegInf;
    for (int64_t c = 0; c < c_count; ++c) {
      const int32_t id = ids[r * c_count + c];
      if (c >= n) {
        lr[c] = kNegInf;
      } else {
        lr[c] = (id < 0 || id >= v) ? kNaN : Logit(hidden + r * d, emb + id * d, d, softcap);
        mx = std::isnan(lr[c]) || std::isnan(mx) ? kNaN : std::max(mx, lr[c]);
      }
    }
    float se = 0.0f;
    for (int64_t c = 0; c < n; ++c) se = se + expf(lr[c] - mx);
    const float lse = mx + logf(se);
    for (int64_t c = 0; c < c_count; ++c) pr[c] = c < n ? lr[c] - lse : kNegInf;
  }
}

// Online log-sum-exp per vocab tile, then tiles merged in increasing tile order.
template <typename H, typename E>
void VocabLseRows(const H* hidden, const E* emb, int64_t r_count, int64_t v, int64_t d,
                  float softcap, float* lse, float* partials) {
  const int64_t tiles = (v + kVocabTile - 1) / kVocabTile;
  std::vector<float> logits(kVocabTile);
  for (int64_t r = 0; r < r_count; ++r) {
    float* part = partials + r * tiles * 2;
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t v0 = t * kVocabTile, v1 = std::min(v, v0 + kVocabTile);
      float mx = kNegInf;
      for (int64_t j = v0; j < v1; ++j) {
        logits[j - v0] = Logit(hidden + r * d, emb + j * d, d, softcap);
        mx = std::max(mx, logits[j - v0]);
      }
      float se = 0.0f;
      for (int64_t j = v0; j < v1; ++j) se = se + expf(logits[j - v0] - mx);
      part[2 * t] = mx;
      part[2 * t + 1] = se;
    }
    float mx = kNegInf;
    for (int64_t t = 0; t < tiles; ++t) mx = std::max(mx, part[2 * t]);
    float se = 0.0f;
    for (int64_t t = 0; t < tiles; ++t) se = se + part[2 * t + 1] * expf(part[2 * t] - mx);
    lse[r] = mx + logf(se);
  }
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

// Calls fn(hidden_ptr, embedding_ptr) with the buffers' element types.
template <typename Fn>
void DispatchHiddenEmbedding(const ffi::AnyBuffer& hidden, const ffi::AnyBuffer& emb, Fn fn) {
  const bool h32 = hidden.element_type() == ffi::DataType::F32;
  const bool e32 = emb.element_type() == ffi::DataType::F32;
  if (h32 && e32) fn(hidden.reinterpret_data<float>(), emb.reinterpret_data<float>());
  if (h32 && !e32) fn(hidden.reinterpret_data<float>(), emb.reinterpret_data<uint16_t>());
  if (!h32 && e32) fn(hidden.reinterpret_data<uint16_t>(), emb.reinterpret_data<float>());
  if (!h32 && !e32) fn(hidden.reinterpret_data<uint16_t>(), emb.reinterpret_data<uint16_t>());
}

ffi::Error CandidateHeadCpu(ffi::AnyBuffer hidden, ffi::AnyBuffer emb,
                            ffi::BufferR2<ffi::S32> ids, ffi::BufferR1<ffi::S32> counts,
                            ffi::Result<ffi::BufferR2<ffi::F32>> logits,
                            ffi::Result<ffi::BufferR2<ffi::F32>> logprobs, float softcap) {
  if (auto e = CheckHiddenEmbedding(hidden, emb, "prism_candidate_head"); e.failure()) return e;
  const int64_t r = hidden.dimensions()[0], d = hidden.dimensions()[1];
  const int64_t v = emb.dimensions()[0], c = ids.dimensions()[1];
  PRISM_REQUIRE(ids.dimensions()[0] == r, "prism_candidate_head: ids must be [R, C]");
  PRISM_REQUIRE(counts.dimensions()[0] == r, "prism_candidate_head: counts must be [R]");
  DispatchHiddenEmbedding(hidden, emb, [&](auto* h, auto* e) {
    CandidateRows(h, e, ids.typed_data(), counts.typed_data(), r, c, v, d, softcap,
                  logits->typed_data(), logprobs->typed_data());
  });
  return ffi::Error::Success();
}

ffi::Error VocabLogSumExpCpu(ffi::AnyBuffer hidden, ffi::AnyBuffer emb,
                             ffi::Result<ffi::BufferR1<ffi::F32>> lse,
                             ffi::Result<ffi::BufferR3<ffi::F32>> partials, float softcap) {
  if (auto e = CheckHiddenEmbedding(hidden, emb, "prism_vocab_logsumexp"); e.failure()) return e;
  const int64_t r = hidden.dimensions()[0], d = hidden.dimensions()[1];
  const int64_t v = emb.dimensions()[0];
  const int64_t tiles = (v + kVocabTile - 1) / kVocabTile;
  PRISM_REQUIRE(partials->dimensions()[0] == r && partials->dimensions()[1] == tiles &&
                    partials->dimensions()[2] == 2,
                "prism_vocab_logsumexp: partials must be [R, ceil(V / 2048), 2]");
  DispatchHiddenEmbedding(hidden, emb, [&](auto* h, auto* e) {
    VocabLseRows(h, e, r, v, d, softcap, lse->typed_data(), partials->typed_data());
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace prism

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismCandidateHeadCpu, prism::CandidateHeadCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()            // hidden [R, D]
                                  .Arg<ffi::AnyBuffer>()            // embedding [V, D]
                                  .Arg<ffi::BufferR2<ffi::S32>>()  // ids [R, C]
                                  .Arg<ffi::BufferR1<ffi::S32>>()  // counts [R]
                                  .Ret<ffi::BufferR2<ffi::F32>>()  // logits [R, C]
                                  .Ret<ffi::BufferR2<ffi::F32>>()  // logprobs [R, C]
                                  .Attr<float>("softcap"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismVocabLogSumExpCpu, prism::VocabLogSumExpCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()            // hidden [R, D]
                                  .Arg<ffi::AnyBuffer>()            // embedding [V, D]
                                  .Ret<ffi::BufferR1<ffi::F32>>()  // lse [R]
                                  .Ret<ffi::BufferR3<ffi::F32>>()  // partials [R, T, 2]
                                  .Attr<float>("softcap"));
