// prism_glu_quant2 on the CPU: glu_quant plus the second INT8 digit of each row (glu_quant.h).
//   gate_up [M, 2F] f32|bf16 -> q1 s8 [M, F], s1 f32 [M], q2 s8 [M, F], s2 f32 [M].
// Each row is one pass of Activate (a kept in a row buffer, then overwritten by the remainder);
// rows are spread over XLA's thread pool, and a row's bits never depend on which thread ran it.
// prism_glu_quant2_sum first adds the row's partial products, gate_up = y2[r] + (y2[M + r] +
// yw2[r]) in f32 (the model's order, Int8Linear), then does the same; its digits come out
// stacked, q [2M, F] and s [2M] (q2's rows after q1's).
#include <algorithm>
#include <vector>

#include "cc/common.h"
#include "cc/cpu_parallel.h"
#include "cc/numerics.h"
#include "cc/ops/glu_quant.h"
#include "cc/ops/quantize_rows.h"

namespace prism {
namespace {

constexpr int64_t kElementsPerItem = 1 << 16;  // enough work per item to amortise scheduling

struct Digits {
  int8_t* q1;
  float* s1;
  int8_t* q2;
  float* s2;
};

// One row: a[i] = Activate(gate) * up exactly as GluRows (glu_quant_cpu.cc) into buf (F
// floats), then both digits of it, the remainders overwriting a in buf.
template <typename T>
void GluRow2(const T* gate, const T* up, int64_t f, Activation act, float* buf, int8_t* q1,
             float* s1, int8_t* q2, float* s2) {
  for (int64_t i = 0; i < f; ++i) buf[i] = Activate(act, ToF32(gate[i])) * ToF32(up[i]);
  QuantizeRowDigits(buf, f, buf, q1, s1, q2, s2);
}

template <typename T>
void GluRows2(ffi::ThreadPool& pool, const T* gate_up, int64_t m, int64_t f, Activation act,
              Digits out) {
  const int64_t per_item = std::max<int64_t>(1, kElementsPerItem / std::max<int64_t>(f, 1));
  ParallelFor(pool, (m + per_item - 1) / per_item, [&](int64_t item) {
    std::vector<float> buf(f);
    const int64_t end = std::min(m, (item + 1) * per_item);
    for (int64_t r = item * per_item; r < end; ++r) {
      const T* gate = gate_up + r * 2 * f;
      GluRow2(gate, gate + f, f, act, buf.data(), out.q1 + r * f, out.s1 + r, out.q2 + r * f,
              out.s2 + r);
    }
  });
}

void GluRows2Sum(ffi::ThreadPool& pool, const float* y2, const float* yw2, int64_t m, int64_t f,
                 Activation act, Digits out) {
  const int64_t per_item = std::max<int64_t>(1, kElementsPerItem / std::max<int64_t>(f, 1));
  ParallelFor(pool, (m + per_item - 1) / per_item, [&](int64_t item) {
    std::vector<float> buf(f), row(2 * f);
    const int64_t end = std::min(m, (item + 1) * per_item);
    for (int64_t r = item * per_item; r < end; ++r) {
      const float *x1 = y2 + r * 2 * f, *x2 = y2 + (m + r) * 2 * f, *w2 = yw2 + r * 2 * f;
      for (int64_t i = 0; i < 2 * f; ++i) row[i] = x1[i] + (x2[i] + w2[i]);
      GluRow2(row.data(), row.data() + f, f, act, buf.data(), out.q1 + r * f, out.s1 + r,
              out.q2 + r * f, out.s2 + r);
    }
  });
}

ffi::Error GluQuant2SumCpu(ffi::ThreadPool pool, ffi::BufferR2<ffi::F32> y2,
                           ffi::BufferR2<ffi::F32> yw2, ffi::Result<ffi::BufferR2<ffi::S8>> q,
                           ffi::Result<ffi::BufferR1<ffi::F32>> s, int32_t activation) {
  if (ffi::Error e = CheckGluSumArgs(y2.dimensions(), yw2.dimensions(), q->dimensions(),
                                     s->dimensions(), activation);
      e.failure()) {
    return e;
  }
  const int64_t m = yw2.dimensions()[0], f = yw2.dimensions()[1] / 2;
  int8_t* codes = q->typed_data();
  float* scales = s->typed_data();
  const Digits out{codes, scales, codes + m * f, scales + m};  // the digits stacked
  GluRows2Sum(pool, y2.typed_data(), yw2.typed_data(), m, f, static_cast<Activation>(activation),
              out);
  return ffi::Error::Success();
}

ffi::Error GluQuant2Cpu(ffi::ThreadPool pool, ffi::AnyBuffer gate_up,
                        ffi::Result<ffi::BufferR2<ffi::S8>> q1,
                        ffi::Result<ffi::BufferR1<ffi::F32>> s1,
                        ffi::Result<ffi::BufferR2<ffi::S8>> q2,
                        ffi::Result<ffi::BufferR1<ffi::F32>> s2, int32_t activation) {
  if (ffi::Error e = CheckGluArgs("prism_glu_quant2", gate_up, activation); e.failure()) {
    return e;
  }
  const int64_t m = gate_up.dimensions()[0], f = gate_up.dimensions()[1] / 2;
  const auto act = static_cast<Activation>(activation);
  const Digits out{q1->typed_data(), s1->typed_data(), q2->typed_data(), s2->typed_data()};
  if (gate_up.element_type() == ffi::DataType::F32) {
    GluRows2(pool, gate_up.reinterpret_data<float>(), m, f, act, out);
  } else {
    GluRows2(pool, gate_up.reinterpret_data<uint16_t>(), m, f, act, out);
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace prism

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismGluQuant2Cpu, prism::GluQuant2Cpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()            // gate_up [M, 2F] f32|bf16
                                  .Ret<ffi::BufferR2<ffi::S8>>()   // q1 [M, F]
                                  .Ret<ffi::BufferR1<ffi::F32>>()  // s1 [M]
                                  .Ret<ffi::BufferR2<ffi::S8>>()   // q2 [M, F]
                                  .Ret<ffi::BufferR1<ffi::F32>>()  // s2 [M]
                                  .Attr<int32_t>("activation"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismGluQuant2SumCpu, prism::GluQuant2SumCpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::BufferR2<ffi::F32>>()  // y2 [2M, 2F]
                                  .Arg<ffi::BufferR2<ffi::F32>>()  // yw2 [M, 2F]
                                  .Ret<ffi::BufferR2<ffi::S8>>()   // q [2M, F]: q1, then q2
                                  .Ret<ffi::BufferR1<ffi::F32>>()  // s [2M]: s1, then s2
                                  .Attr<int32_t>("activation"));
