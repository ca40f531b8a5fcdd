// prism_quantize_rows on the CPU: per-row symmetric INT8 quantisation of float32 rows, with an
// optional second digit (the remainder y - q1 * s1 quantised with its own scale; glu_quant.h's
// QuantRemainder), the digits stacked along the rows so the two-digit GEMM takes them as one
// [2M, D] operand:
//   y [M, D] f32 -> q s8 [digits * M, D], s f32 [digits * M]; attr digits (1 or 2).
// Rows 0 .. M-1 hold the first digit, M .. 2M-1 the second. The formulas are numerics.h's, so
// the result is ops.quantize_rows (and quantize_remainder) of the same rows, bit for bit; rows
// are spread over XLA's thread pool and a row's bits never depend on which thread ran it.
#include <algorithm>
#include <vector>

#include "cc/common.h"
#include "cc/cpu_parallel.h"
#include "cc/ops/quantize_rows.h"

namespace prism {
namespace {

constexpr int64_t kElementsPerItem = 1 << 16;  // enough work per item to amortise scheduling

ffi::Error QuantizeRowsCpu(ffi::ThreadPool pool, ffi::BufferR2<ffi::F32> y,
                           ffi::Result<ffi::BufferR2<ffi::S8>> q,
                           ffi::Result<ffi::BufferR1<ffi::F32>> s, int32_t digits) {
  if (ffi::Error e = CheckQuantizeRows(y.dimensions(), q->dimensions(), s->dimensions(), digits);
      e.failure()) {
    return e;
  }
  const int64_t m = y.dimensions()[0], d = y.dimensions()[1];
  const bool two = digits == 2;
  const float* src = y.typed_data();
  int8_t* codes = q->typed_data();
  float* scales = s->typed_data();
  const int64_t per_item = std::max<int64_t>(1, kElementsPerItem / std::max<int64_t>(d, 1));
  ParallelFor(pool, (m + per_item - 1) / per_item, [&](int64_t item) {
    std::vector<float> buf(two ? d : 0);
    const int64_t end = std::min(m, (item + 1) * per_item);
    for (int64_t r = item * per_item; r < end; ++r) {
      QuantizeRowDigits(src + r * d, d, buf.data(), codes + r * d, scales + r,
                        two ? codes + (m + r) * d : nullptr, two ? scales + m + r : nullptr);
    }
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace prism

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismQuantizeRowsCpu, prism::QuantizeRowsCpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::BufferR2<ffi::F32>>()  // y [M, D]
                                  .Ret<ffi::BufferR2<ffi::S8>>()   // q [digits * M, D]
                                  .Ret<ffi::BufferR1<ffi::F32>>()  // s [digits * M]
                                  .Attr<int32_t>("digits"));
