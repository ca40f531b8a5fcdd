// Shared by every prism_jax custom call, CPU and CUDA: FFI aliases, argument-check macros
// and bf16 storage helpers. Numerics that must agree across devices live in numerics.h.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "xla/ffi/api/ffi.h"

namespace prism {

namespace ffi = xla::ffi;

// Handlers validate shapes again even though the Python wrappers already did: a handler
// reached through a hand-written ffi_call must fail with a message, never read out of bounds.
#define PRISM_REQUIRE(cond, msg)                                   \
  do {                                                             \
    if (!(cond)) return ::xla::ffi::Error::InvalidArgument(msg);   \
  } while (0)

// Returns a check's failure (an ffi::Error) from the enclosing handler.
#define PRISM_RETURN_IF_ERROR(expr)                        \
  do {                                                     \
    if (::xla::ffi::Error e_ = (expr); e_.failure()) return e_; \
  } while (0)

// An on/off environment knob, read by a handler at launch (the benchmarks' A/B settings): unset
// or empty gives `fallback`, "on" and "off" set it, and anything else is an error naming the
// knob, so a misspelt setting fails instead of timing the default.
inline ffi::Error EnvSwitch(const char* name, bool fallback, const std::string& op, bool* on) {
  const char* env = std::getenv(name);
  const std::string v = env != nullptr ? env : "";
  PRISM_REQUIRE(v.empty() || v == "on" || v == "off",
                op + ": " + name + " must be unset, on or off; got " + v);
  *on = v.empty() ? fallback : v == "on";
  return ffi::Error::Success();
}

inline std::string DimsToString(ffi::AnyBuffer::Dimensions dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(dims[i]);
  }
  return s + "]";
}

// An operand aliased to a result (a KV pool) copied into that result where XLA did not alias
// them, i.e. for a caller that did not donate it; a no-op in the engine.
template <typename In, typename Out>
void CopyUnlessAliased(const In& in, Out& out) {
  if (out->untyped_data() != in.untyped_data()) {
    std::memcpy(out->untyped_data(), in.untyped_data(), in.size_bytes());
  }
}

inline bool IsFloatActivation(ffi::DataType t) {
  return t == ffi::DataType::F32 || t == ffi::DataType::BF16;
}

}  // namespace prism
