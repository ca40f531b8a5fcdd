// prism_graph_break: an identity on one buffer (y aliases x) whose CUDA handler is deliberately
// NOT command-buffer compatible. XLA puts runs of compatible thunks into one CUDA graph; the
// 27B forward was one graph of 1,058 commands, and the H200 host spent ~4 ms in the call
// before its first kernel ran (benchmarks/dispatch_probe.py). A break every few layers cuts the
// forward into several graphs, so the GPU starts on the first while the host launches the
// rest. It moves no data when XLA honours the alias (the usual case); otherwise it copies x.
//   x [any shape] any dtype -> y (same shape and dtype, aliased to x)
#pragma once

#include <cstdint>
#include <string>

#include "cc/common.h"

namespace prism {

inline ffi::Error CheckGraphBreak(const ffi::AnyBuffer& x, const ffi::AnyBuffer& y) {
  PRISM_REQUIRE(x.element_type() == y.element_type() && x.size_bytes() == y.size_bytes(),
                "prism_graph_break: y must have x's shape and dtype, got " +
                    DimsToString(y.dimensions()) + " for " + DimsToString(x.dimensions()));
  return ffi::Error::Success();
}

}  // namespace prism
