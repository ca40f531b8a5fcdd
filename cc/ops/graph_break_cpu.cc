// prism_graph_break on the CPU (graph_break.h): nothing to split, so y = x.
#include <cstring>

#include "cc/common.h"
#include "cc/ops/graph_break.h"

namespace prism {
namespace {

ffi::Error GraphBreakCpu(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y) {
  if (auto e = CheckGraphBreak(x, *y); e.failure()) return e;
  if (y->untyped_data() != x.untyped_data()) {
    std::memcpy(y->untyped_data(), x.untyped_data(), x.size_bytes());
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace prism

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismGraphBreakCpu, prism::GraphBreakCpu,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()    // x
                                  .Ret<xla::ffi::AnyBuffer>());  // y, aliased to x
