// The readout ops' argument checks and element-type dispatch, shared by their CPU handlers
// (candidate_head_cpu.cc) and CUDA handlers (candidate_head_cuda.cu, vocab_logsumexp_cuda.cu),
// so both backends accept and reject the same calls with the same messages.
#pragma once

#include <cstdint>
#include <string>

#include "cc/common.h"
#include "cc/numerics.h"

namespace prism {
namespace head {

// hidden [R, D] and embedding [V, D], each float32 or bfloat16.
inline ffi::Error CheckHiddenEmbedding(const ffi::AnyBuffer& hidden, const ffi::AnyBuffer& emb,
                                       const std::string& op) {
  PRISM_REQUIRE(hidden.dimensions().size() == 2, op + ": hidden must be [R, D]");
  PRISM_REQUIRE(emb.dimensions().size() == 2, op + ": embedding must be [V, D]");
  PRISM_REQUIRE(emb.dimensions()[1] == hidden.dimensions()[1],
                op + ": embedding's D must equal hidden's D");
  PRISM_REQUIRE(IsFloatActivation(hidden.element_type()) && IsFloatActivation(emb.element_type()),
                op + ": hidden and embedding must be float32 or bfloat16");
  return ffi::Error::Success();
}

// T: prism_vocab_logsumexp's vocab tiles (partial results) for a vocab of v rows.
inline int64_t VocabTiles(int64_t v) { return (v + kVocabTile - 1) / kVocabTile; }

// prism_vocab_logsumexp's partials must be [R, T, 2]. Call after CheckHiddenEmbedding.
template <typename Dims>
ffi::Error CheckVocabPartials(const ffi::AnyBuffer& hidden, const ffi::AnyBuffer& emb,
                              const Dims& partials) {
  const int64_t r = hidden.dimensions()[0], tiles = VocabTiles(emb.dimensions()[0]);
  PRISM_REQUIRE(partials.size() == 3 && partials[0] == r && partials[1] == tiles &&
                    partials[2] == 2,
                "prism_vocab_logsumexp: partials must be [R, ceil(V / 2048), 2]");
  return ffi::Error::Success();
}

// Returns fn(hidden_ptr, embedding_ptr) with the buffers' element types (uint16_t: bfloat16).
template <typename Fn>
decltype(auto) DispatchHiddenEmbedding(const ffi::AnyBuffer& hidden, const ffi::AnyBuffer& emb,
                                       Fn fn) {
  const bool h32 = hidden.element_type() == ffi::DataType::F32;
  const bool e32 = emb.element_type() == ffi::DataType::F32;
  if (h32 && e32) return fn(hidden.reinterpret_data<float>(), emb.reinterpret_data<float>());
  if (h32) return fn(hidden.reinterpret_data<float>(), emb.reinterpret_data<uint16_t>());
  if (e32) return fn(hidden.reinterpret_data<uint16_t>(), emb.reinterpret_data<float>());
  return fn(hidden.reinterpret_data<uint16_t>(), emb.reinterpret_data<uint16_t>());
}

}  // namespace head
}  // namespace prism
