// prism_l2_prefetch on the CPU (the contract is l2_prefetch.h): nothing to prefetch, so the
// arguments are checked and `after` handed on (a copy only if XLA did not alias it).
#include "cc/common.h"
#include "cc/ops/l2_prefetch.h"

namespace prism {
namespace {

ffi::Error L2PrefetchCpu(ffi::AnyBuffer x, ffi::AnyBuffer after, ffi::Result<ffi::AnyBuffer> out,
                         int64_t max_bytes) {
  int64_t bytes = 0;
  if (auto e = L2PrefetchBytes(x, after, *out, max_bytes, &bytes); e.failure()) return e;
  CopyUnlessAliased(after, out);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace prism

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismL2PrefetchCpu, prism::L2PrefetchCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // x
                                  .Arg<ffi::AnyBuffer>()  // after
                                  .Ret<ffi::AnyBuffer>()  // after, unchanged (aliased)
                                  .Attr<int64_t>("max_bytes"));
