// prism_l2_prefetch on the CPU (the contract is l2_prefetch.h): nothing to prefetch, so only
// the arguments are checked and the token written.
#include "cc/common.h"
#include "cc/ops/l2_prefetch.h"

namespace prism {
namespace {

ffi::Error L2PrefetchCpu(ffi::AnyBuffer x, ffi::AnyBuffer after,
                         ffi::Result<ffi::BufferR1<ffi::S32>> token, int64_t max_bytes) {
  (void)after;
  int64_t bytes = 0;
  if (auto e = L2PrefetchBytes(x, token->dimensions()[0], max_bytes, &bytes); e.failure()) {
    return e;
  }
  token->typed_data()[0] = 0;
  return ffi::Error::Success();
}

}  // namespace
}  // namespace prism

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismL2PrefetchCpu, prism::L2PrefetchCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()            // x
                                  .Arg<ffi::AnyBuffer>()            // after (never read)
                                  .Ret<ffi::BufferR1<ffi::S32>>()  // token [1]
                                  .Attr<int64_t>("max_bytes"));
