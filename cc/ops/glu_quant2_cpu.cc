// prism_glu_quant2 on the CPU: glu_quant plus the second INT8 digit of each row (glu_quant.h).
//   gate_up [M, 2F] f32|bf16 -> q1 s8 [M, F], s1 f32 [M], q2 s8 [M, F], s2 f32 [M]; gate_up
//   may also come as f32 partial sums (GluParts in glu_quant.h).
// Each row is one pass of Activate (a kept in a row buffer, then overwritten by the remainder);
// rows are spread over XLA's thread pool, and a row's bits never depend on which thread ran it.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cc/common.h"
#include "cc/cpu_parallel.h"
#include "cc/numerics.h"
#include "cc/ops/glu_quant.h"

namespace prism {
namespace {

constexpr int64_t kElementsPerItem = 1 << 16;  // enough work per item to amortise scheduling

struct Digits {
  int8_t* q1;
  float* s1;
  int8_t* q2;
  float* s2;
};

// Row r's gate_up element i as a float: the plain row, or GluParts' sum main[r] + (main[r + M]
// + extra[r]) with the absent terms left out.
template <typename T>
struct RowReader {
  const T* main;
  const float* extra;  // nullptr: none (parts are f32 only)
  int64_t m, f;
  bool stacked;
  float At(int64_t r, int64_t i) const {
    const float v = ToF32(main[r * 2 * f + i]);
    if (!stacked && extra == nullptr) return v;
    float small;
    if (stacked && extra != nullptr) {
      small = ToF32(main[(r + m) * 2 * f + i]) + extra[r * 2 * f + i];
    } else {
      small = stacked ? ToF32(main[(r + m) * 2 * f + i]) : extra[r * 2 * f + i];
    }
    return v + small;
  }
};

// One row: a[i] = Activate(gate) * up exactly as GluRows (glu_quant_cpu.cc), then in place
// the remainder, then both digits. buf holds F floats.
template <typename T>
void GluRow2(const RowReader<T>& in, int64_t r, Activation act, float* buf, int8_t* q1,
             float* s1, int8_t* q2, float* s2) {
  const int64_t f = in.f;
  float amax = 0.0f;
  for (int64_t i = 0; i < f; ++i) {
    buf[i] = Activate(act, in.At(r, i)) * in.At(r, f + i);
    amax = std::max(amax, std::fabs(buf[i]));
  }
  const float inv = QuantInverse(amax), scale = QuantScale(amax);
  float rmax = 0.0f;
  for (int64_t i = 0; i < f; ++i) {
    q1[i] = QuantCode(buf[i], inv);
    buf[i] = QuantRemainder(buf[i], q1[i], scale);
    rmax = std::max(rmax, std::fabs(buf[i]));
  }
  const float rinv = QuantInverse(rmax);
  for (int64_t i = 0; i < f; ++i) q2[i] = QuantCode(buf[i], rinv);
  *s1 = scale;
  *s2 = QuantScale(rmax);
}

template <typename T>
void GluRows2(ffi::ThreadPool& pool, const RowReader<T>& in, Activation act, Digits out) {
  const int64_t m = in.m, f = in.f;
  const int64_t per_item = std::max<int64_t>(1, kElementsPerItem / std::max<int64_t>(f, 1));
  ParallelFor(pool, (m + per_item - 1) / per_item, [&](int64_t item) {
    std::vector<float> buf(f);
    const int64_t end = std::min(m, (item + 1) * per_item);
    for (int64_t r = item * per_item; r < end; ++r) {
      GluRow2(in, r, act, buf.data(), out.q1 + r * f, out.s1 + r, out.q2 + r * f, out.s2 + r);
    }
  });
}

ffi::Error GluQuant2Cpu(ffi::ThreadPool pool, ffi::AnyBuffer gate_up, ffi::AnyBuffer extra,
                        ffi::Result<ffi::BufferR2<ffi::S8>> q1,
                        ffi::Result<ffi::BufferR1<ffi::F32>> s1,
                        ffi::Result<ffi::BufferR2<ffi::S8>> q2,
                        ffi::Result<ffi::BufferR1<ffi::F32>> s2, int32_t activation,
                        int32_t stacked) {
  GluParts parts;
  if (ffi::Error e = CheckGluParts("prism_glu_quant2", gate_up, extra, activation, stacked, &parts);
      e.failure()) {
    return e;
  }
  const auto act = static_cast<Activation>(activation);
  const Digits out{q1->typed_data(), s1->typed_data(), q2->typed_data(), s2->typed_data()};
  const float* extra_rows = parts.extra ? extra.reinterpret_data<float>() : nullptr;
  if (gate_up.element_type() == ffi::DataType::F32) {
    const RowReader<float> in{gate_up.reinterpret_data<float>(), extra_rows, parts.m, parts.f,
                              parts.stacked};
    GluRows2(pool, in, act, out);
  } else {
    const RowReader<uint16_t> in{gate_up.reinterpret_data<uint16_t>(), nullptr, parts.m, parts.f,
                                 false};
    GluRows2(pool, in, act, out);
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace prism

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismGluQuant2Cpu, prism::GluQuant2Cpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // gate_up [M or 2M, 2F] f32|bf16
                                  .Arg<ffi::AnyBuffer>()  // extra [M or 0, 2F] f32 partial
                                  .Ret<ffi::BufferR2<ffi::S8>>()   // q1 [M, F]
                                  .Ret<ffi::BufferR1<ffi::F32>>()  // s1 [M]
                                  .Ret<ffi::BufferR2<ffi::S8>>()   // q2 [M, F]
                                  .Ret<ffi::BufferR1<ffi::F32>>()  // s2 [M]
                                  .Attr<int32_t>("activation")
                                  .Attr<int32_t>("stacked"));  // 1: rows M..2M are a partial
