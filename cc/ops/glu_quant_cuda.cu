// prism_glu_quant on CUDA; the specification is glu_quant_cpu.cc. Shapes: M rows, F ffw dim.
//   gate_up [M, 2F] f32|bf16 -> a_q s8 [M, F], s_a f32 [M]; attr activation (numerics.h).
// a = Activate(gate) * up, then per-row symmetric INT8 quantisation: GluRowsKernel
// (glu_rows.cuh) with one digit, the row kept in shared memory between its passes. expf/tanhf
// are CUDA's, so a (and rarely a code) may differ from the CPU by an ulp-level amount; the
// result still depends only on the row.
#include <cuda_runtime.h>

#include "cc/common.h"
#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/glu_quant.h"
#include "cc/ops/glu_rows.cuh"

namespace prism {
namespace {

template <typename T>
ffi::Error Launch(cudaStream_t stream, const ffi::AnyBuffer& gate_up, int8_t* q, float* s,
                  Activation act) {
  const int64_t m = gate_up.dimensions()[0], f = gate_up.dimensions()[1] / 2;
  const PairRows<T> src{gate_up.reinterpret_data<T>(), m, f};
  return GluRowsLaunch<PairRows<T>, false>(stream, src, {q, s, nullptr, nullptr}, act,
                                           "prism_glu_quant");
}

ffi::Error GluQuantCuda(cudaStream_t stream, ffi::AnyBuffer gate_up,
                        ffi::Result<ffi::BufferR2<ffi::S8>> a_q,
                        ffi::Result<ffi::BufferR1<ffi::F32>> s_a, int32_t activation) {
  if (ffi::Error e = CheckGluArgs("prism_glu_quant", gate_up, activation); e.failure()) {
    return e;
  }
  const auto act = static_cast<Activation>(activation);
  if (gate_up.element_type() == ffi::DataType::F32) {
    return Launch<float>(stream, gate_up, a_q->typed_data(), s_a->typed_data(), act);
  }
  return Launch<uint16_t>(stream, gate_up, a_q->typed_data(), s_a->typed_data(), act);
}

}  // namespace
}  // namespace prism

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismGluQuantCuda, prism::GluQuantCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()            // gate_up [M, 2F] f32|bf16
                                  .Ret<ffi::BufferR2<ffi::S8>>()   // a_q [M, F]
                                  .Ret<ffi::BufferR1<ffi::F32>>()  // s_a [M]
                                  .Attr<int32_t>("activation"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
