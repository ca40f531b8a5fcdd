// prism_glu_quant on the CPU: a = act(gate) * up, then per-row symmetric INT8 quantisation.
//   gate_up [M, 2F] f32|bf16 -> a_q s8 [M, F], s_a f32 [M]; attr activation (numerics.h).
#include <vector>

#include "cc/common.h"
#include "cc/numerics.h"
#include "cc/ops/glu_quant.h"
#include "cc/ops/quantize_rows.h"

namespace prism {
namespace {

template <typename T>
void GluRows(const T* gate_up, int64_t m, int64_t f, Activation act, int8_t* q, float* s) {
  std::vector<float> a(f);
  for (int64_t r = 0; r < m; ++r) {
    const T* gate = gate_up + r * 2 * f;
    const T* up = gate + f;
    for (int64_t i = 0; i < f; ++i) a[i] = Activate(act, ToF32(gate[i])) * ToF32(up[i]);
    QuantizeRowDigits(a.data(), f, nullptr, q + r * f, s + r, nullptr, nullptr);
  }
}

ffi::Error GluQuantCpu(ffi::AnyBuffer gate_up, ffi::Result<ffi::BufferR2<ffi::S8>> a_q,
                       ffi::Result<ffi::BufferR1<ffi::F32>> s_a, int32_t activation) {
  if (ffi::Error e = CheckGluArgs("prism_glu_quant", gate_up, activation); e.failure()) {
    return e;
  }
  const int64_t m = gate_up.dimensions()[0], f = gate_up.dimensions()[1] / 2;
  const auto act = static_cast<Activation>(activation);
  if (gate_up.element_type() == ffi::DataType::F32) {
    GluRows(gate_up.reinterpret_data<float>(), m, f, act, a_q->typed_data(), s_a->typed_data());
  } else {
    GluRows(gate_up.reinterpret_data<uint16_t>(), m, f, act, a_q->typed_data(),
            s_a->typed_data());
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace prism

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismGluQuantCpu, prism::GluQuantCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()            // gate_up [M, 2F] f32|bf16
                                  .Ret<ffi::BufferR2<ffi::S8>>()   // a_q [M, F]
                                  .Ret<ffi::BufferR1<ffi::F32>>()  // s_a [M]
                                  .Attr<int32_t>("activation"));
