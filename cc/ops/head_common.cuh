// What the two readout ops on CUDA share (candidate_head_cuda.cu, vocab_logsumexp_cuda.cu): the
// CPU's max, one thread per row for the sequential merges, and the hidden/embedding checks and
// element-type dispatch of their FFI handlers.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "cc/common.h"
#include "cc/cuda_common.cuh"

namespace prism {
namespace head {

constexpr int kRowThreads = 128;  // one thread per row for the sequential merges

// The CPU's std::max(mx, l): a NaN l leaves mx unchanged.
__device__ __forceinline__ float MaxLikeStd(float mx, float l) { return mx < l ? l : mx; }

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

}  // namespace head
}  // namespace prism
