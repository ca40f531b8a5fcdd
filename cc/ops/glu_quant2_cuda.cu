// prism_glu_quant2 on CUDA; the specification is glu_quant2_cpu.cc (formulas: glu_quant.h).
//   gate_up [M, 2F] f32|bf16 -> q1 s8 [M, F], s1 f32 [M], q2 s8 [M, F], s2 f32 [M].
// prism_glu_quant2_sum: the same digits of gate_up = y2[r] + (y2[M + r] + yw2[r]), the two-digit
// projection's partial products (Int8Linear: x1 W1, x2 W1, x1 W2), added in the kernel in the
// model's order instead of by an XLA pass that writes gate_up out and reads it back; the digits
// come out stacked, q [2M, F] and s [2M] (q2's rows after q1's), as the down projection's
// two-digit GEMM takes them, so XLA does not concatenate them.
// Both are GluRowsKernel (glu_rows.cuh) with two digits: pass 1 takes the row's amax, pass 2
// writes q1 and takes the remainder's max, pass 3 writes q2; both maxima are exact in any
// order, so the result depends only on the row, never on the block width. The row stays in
// shared memory through the passes when F floats fit, and is recomputed otherwise.
#include <cuda_runtime.h>

#include "cc/common.h"
#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/glu_quant.h"
#include "cc/ops/glu_rows.cuh"

namespace prism {
namespace {

ffi::Error GluQuant2SumCuda(cudaStream_t stream, ffi::BufferR2<ffi::F32> y2,
                            ffi::BufferR2<ffi::F32> yw2, ffi::Result<ffi::BufferR2<ffi::S8>> q,
                            ffi::Result<ffi::BufferR1<ffi::F32>> s, int32_t activation) {
  if (ffi::Error e = CheckGluSumArgs(y2.dimensions(), yw2.dimensions(), q->dimensions(),
                                     s->dimensions(), activation);
      e.failure()) {
    return e;
  }
  const int64_t m = yw2.dimensions()[0], f = yw2.dimensions()[1] / 2;
  const SumRows src{y2.typed_data(), yw2.typed_data(), m, f};
  int8_t* codes = q->typed_data();
  float* scales = s->typed_data();
  const GluOut out{codes, scales, codes + m * f, scales + m};  // the digits stacked
  const Activation act = static_cast<Activation>(activation);
  if (m <= DeviceSmCount()) {  // glu_rows.cuh says why the row count picks the block
    return GluRowsLaunch<WideSumRows, true>(stream, WideSumRows{src}, out, act,
                                            "prism_glu_quant2_sum");
  }
  return GluRowsLaunch<SumRows, true>(stream, src, out, act, "prism_glu_quant2_sum");
}

template <typename T>
ffi::Error Launch(cudaStream_t stream, const ffi::AnyBuffer& gate_up, const GluOut& out,
                  Activation act) {
  const int64_t m = gate_up.dimensions()[0], f = gate_up.dimensions()[1] / 2;
  const PairRows<T> src{gate_up.reinterpret_data<T>(), m, f};
  return GluRowsLaunch<PairRows<T>, true>(stream, src, out, act, "prism_glu_quant2");
}

ffi::Error GluQuant2Cuda(cudaStream_t stream, ffi::AnyBuffer gate_up,
                         ffi::Result<ffi::BufferR2<ffi::S8>> q1,
                         ffi::Result<ffi::BufferR1<ffi::F32>> s1,
                         ffi::Result<ffi::BufferR2<ffi::S8>> q2,
                         ffi::Result<ffi::BufferR1<ffi::F32>> s2, int32_t activation) {
  if (ffi::Error e = CheckGluArgs("prism_glu_quant2", gate_up, activation); e.failure()) {
    return e;
  }
  const auto act = static_cast<Activation>(activation);
  const GluOut out{q1->typed_data(), s1->typed_data(), q2->typed_data(), s2->typed_data()};
  if (gate_up.element_type() == ffi::DataType::F32) {
    return Launch<float>(stream, gate_up, out, act);
  }
  return Launch<uint16_t>(stream, gate_up, out, act);
}

}  // namespace
}  // namespace prism

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismGluQuant2Cuda, prism::GluQuant2Cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()            // gate_up [M, 2F] f32|bf16
                                  .Ret<ffi::BufferR2<ffi::S8>>()   // q1 [M, F]
                                  .Ret<ffi::BufferR1<ffi::F32>>()  // s1 [M]
                                  .Ret<ffi::BufferR2<ffi::S8>>()   // q2 [M, F]
                                  .Ret<ffi::BufferR1<ffi::F32>>()  // s2 [M]
                                  .Attr<int32_t>("activation"),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismGluQuant2SumCuda, prism::GluQuant2SumCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::BufferR2<ffi::F32>>()  // y2 [2M, 2F]
                                  .Arg<ffi::BufferR2<ffi::F32>>()  // yw2 [M, 2F]
                                  .Ret<ffi::BufferR2<ffi::S8>>()   // q [2M, F]: q1, then q2
                                  .Ret<ffi::BufferR1<ffi::F32>>()  // s [2M]: s1, then s2
                                  .Attr<int32_t>("activation"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
