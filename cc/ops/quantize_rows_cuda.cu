// prism_quantize_rows on CUDA; the specification is quantize_rows_cpu.cc.
//   y [M, D] f32 -> q s8 [digits * M, D], s f32 [digits * M] (the second digit's rows after
//   the first's); attr digits (1 or 2).
// GluRowsKernel (glu_rows.cuh) over PlainRows: the row's amax, its codes and, with two digits,
// the remainder's max and codes, the row kept in shared memory between the passes.
#include <cuda_runtime.h>

#include "cc/common.h"
#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/glu_rows.cuh"
#include "cc/ops/quantize_rows.h"

namespace prism {
namespace {

ffi::Error QuantizeRowsCuda(cudaStream_t stream, ffi::BufferR2<ffi::F32> y,
                            ffi::Result<ffi::BufferR2<ffi::S8>> q,
                            ffi::Result<ffi::BufferR1<ffi::F32>> s, int32_t digits) {
  if (ffi::Error e = CheckQuantizeRows(y.dimensions(), q->dimensions(), s->dimensions(), digits);
      e.failure()) {
    return e;
  }
  const int64_t m = y.dimensions()[0], d = y.dimensions()[1];
  const PlainRows src{y.typed_data(), m, d};
  int8_t* codes = q->typed_data();
  float* scales = s->typed_data();
  const std::string op = "prism_quantize_rows";
  if (digits == 1) {
    return GluRowsLaunch<PlainRows, false>(stream, src, {codes, scales, nullptr, nullptr},
                                           Activation::kGeluTanh, op);
  }
  return GluRowsLaunch<PlainRows, true>(stream, src, {codes, scales, codes + m * d, scales + m},
                                        Activation::kGeluTanh, op);
}

}  // namespace
}  // namespace prism

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismQuantizeRowsCuda, prism::QuantizeRowsCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::BufferR2<ffi::F32>>()  // y [M, D]
                                  .Ret<ffi::BufferR2<ffi::S8>>()   // q [digits * M, D]
                                  .Ret<ffi::BufferR1<ffi::F32>>()  // s [digits * M]
                                  .Attr<int32_t>("digits"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
