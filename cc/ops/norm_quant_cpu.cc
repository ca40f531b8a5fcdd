// RMSNorm custom calls on the CPU, one row at a time (D model dim, M rows):
//   prism_rmsnorm            x [M, D], gamma [D]            -> y [M, D] (x's dtype)
//   prism_rmsnorm_quant      x [M, D], gamma [D]            -> x_q s8 [M, D], s_x f32 [M]
//   prism_add_rmsnorm_quant  x, residual [M, D], gamma [D]  -> x_q, s_x, h = x + residual
//   prism_add_rmsnorm        x, residual [M, D], gamma [D]  -> y, h = x + residual
//   prism_norm_add_rmsnorm_quant, prism_norm_add_rmsnorm: the two above with x_gamma [D] after
//                            residual: h = rmsnorm(x, x_gamma) (rounded to x's dtype) + residual
//                            (Gemma's post-norm fused in front of the next norm)
//   prism_add_rmsnorm_quant_sum, prism_norm_add_rmsnorm_quant_sum: the _quant forms of a
//                            two-digit projection's partial products (norm_digits.h)
// y = (h * inverse_rms) * (weight_offset + gamma); weight_offset is 1 for Gemma's (1 + γ).
// The quantising ones take `digits` (norm_digits.h): 2 writes y's second digit too, x_q
// [2M, D] and s_x [2M], as prism_quantize_rows(y, digits=2).
#include <algorithm>
#include <cmath>
#include <vector>

#include "cc/common.h"
#include "cc/numerics.h"
#include "cc/ops/norm_digits.h"
#include "cc/ops/norm_row.h"
#include "cc/ops/quantize_rows.h"

namespace prism {
namespace {

// Runs the whole family for one activation dtype T; null pointers switch parts off. x_gamma
// (the fused post-norm, with residual): x is first normalised with it and rounded to T, as
// prism_rmsnorm stores it, and that is what the residual is added to.
// digits = 2 (q_out, s_out [2M]): the second digit's rows follow the first's.
template <typename T>
void NormRows(const T* x, const T* residual, const float* gamma, int64_t m, int64_t d,
              NormAttrs a, T* h_out, T* y_out, int8_t* q_out, float* s_out,
              const float* x_gamma = nullptr, int32_t digits = 1) {
  std::vector<float> scratch(2 * d);  // host scratch: CPU handlers may allocate, CUDA ones not
  float* h = scratch.data();
  float* y = h + d;
  for (int64_t r = 0; r < m; ++r) {
    if (x_gamma != nullptr) {  // y = rmsnorm(x, x_gamma) stored as T, then added below
      for (int64_t i = 0; i < d; ++i) h[i] = ToF32(x[r * d + i]);
      NormRow(h, x_gamma, d, a, y);
      for (int64_t i = 0; i < d; ++i) {
        T stored;
        FromF32(y[i], &stored);
        y[i] = ToF32(stored);
      }
    }
    for (int64_t i = 0; i < d; ++i) {
      float v = x_gamma != nullptr ? y[i] : ToF32(x[r * d + i]);
      if (residual != nullptr) {
        // The residual stream is stored in T; normalise the stored (rounded) value.
        T stored;
        FromF32(v + ToF32(residual[r * d + i]), &stored);
        if (h_out != nullptr) h_out[r * d + i] = stored;
        v = ToF32(stored);
      }
      h[i] = v;
    }
    NormRow(h, gamma, d, a, y);
    if (y_out != nullptr) {
      for (int64_t i = 0; i < d; ++i) FromF32(y[i], y_out + r * d + i);
    }
    if (q_out != nullptr) {
      const bool two = digits == 2;
      QuantizeRowDigits(y, d, y, q_out + r * d, s_out + r, two ? q_out + (m + r) * d : nullptr,
                        two ? s_out + m + r : nullptr);
    }
  }
}

ffi::Error CheckRows(const ffi::AnyBuffer& x, const ffi::BufferR1<ffi::F32>& gamma,
                     const char* op) {
  const std::string name(op);
  PRISM_REQUIRE(x.dimensions().size() == 2, name + ": x must be [M, D]");
  PRISM_REQUIRE(IsFloatActivation(x.element_type()), name + ": x must be float32 or bfloat16");
  PRISM_REQUIRE(gamma.dimensions()[0] == x.dimensions()[1], name + ": gamma must be [D]");
  return ffi::Error::Success();
}

template <typename T>
const T* Data(const ffi::AnyBuffer& b) { return b.reinterpret_data<T>(); }

ffi::Error RmsNormCpu(ffi::AnyBuffer x, ffi::BufferR1<ffi::F32> gamma,
                      ffi::Result<ffi::AnyBuffer> y, float eps, float weight_offset) {
  if (auto e = CheckRows(x, gamma, "prism_rmsnorm"); e.failure()) return e;
  PRISM_REQUIRE(y->element_type() == x.element_type(), "prism_rmsnorm: y must have x's dtype");
  const int64_t m = x.dimensions()[0], d = x.dimensions()[1];
  const NormAttrs a{eps, weight_offset};
  if (x.element_type() == ffi::DataType::F32) {
    NormRows<float>(Data<float>(x), nullptr, gamma.typed_data(), m, d, a, nullptr,
                    y->reinterpret_data<float>(), nullptr, nullptr);
  } else {
    NormRows<uint16_t>(Data<uint16_t>(x), nullptr, gamma.typed_data(), m, d, a, nullptr,
                       y->reinterpret_data<uint16_t>(), nullptr, nullptr);
  }
  return ffi::Error::Success();
}

ffi::Error RmsNormQuantCpu(ffi::AnyBuffer x, ffi::BufferR1<ffi::F32> gamma,
                           ffi::Result<ffi::BufferR2<ffi::S8>> x_q,
                           ffi::Result<ffi::BufferR1<ffi::F32>> s_x, float eps,
                           float weight_offset, int32_t digits) {
  if (auto e = CheckRows(x, gamma, "prism_rmsnorm_quant"); e.failure()) return e;
  if (auto e = CheckNormDigits(x, x_q->dimensions(), s_x->dimensions(), digits,
                               "prism_rmsnorm_quant");
      e.failure()) {
    return e;
  }
  const int64_t m = x.dimensions()[0], d = x.dimensions()[1];
  const NormAttrs a{eps, weight_offset};
  if (x.element_type() == ffi::DataType::F32) {
    NormRows<float>(Data<float>(x), nullptr, gamma.typed_data(), m, d, a, nullptr, nullptr,
                    x_q->typed_data(), s_x->typed_data(), nullptr, digits);
  } else {
    NormRows<uint16_t>(Data<uint16_t>(x), nullptr, gamma.typed_data(), m, d, a, nullptr,
                       nullptr, x_q->typed_data(), s_x->typed_data());
  }
  return ffi::Error::Success();
}

// add_rmsnorm(_quant) and their fused-post-norm forms (x_gamma not null): h = [rmsnorm](x) +
// residual, then y or (q, s) of h's norm; null outputs are not written.
ffi::Error AddNorm(const ffi::AnyBuffer& x, const ffi::AnyBuffer& residual,
                   const ffi::BufferR1<ffi::F32>* x_gamma_buffer,
                   const ffi::BufferR1<ffi::F32>& gamma, ffi::AnyBuffer* y, ffi::AnyBuffer* h,
                   int8_t* q, float* s, float eps, float weight_offset, const char* op,
                   int32_t digits = 1) {
  if (auto e = CheckRows(x, gamma, op); e.failure()) return e;
  const std::string name(op);
  PRISM_REQUIRE(x_gamma_buffer == nullptr ||
                    x_gamma_buffer->dimensions()[0] == x.dimensions()[1],
                name + ": x_gamma must be [D]");
  const float* x_gamma = x_gamma_buffer != nullptr ? x_gamma_buffer->typed_data() : nullptr;
  PRISM_REQUIRE(residual.element_type() == x.element_type() &&
                    residual.element_count() == x.element_count(),
                name + ": residual must match x in shape and dtype");
  PRISM_REQUIRE(h->element_type() == x.element_type() &&
                    (y == nullptr || y->element_type() == x.element_type()),
                name + ": y and h must have x's dtype");
  const int64_t m = x.dimensions()[0], d = x.dimensions()[1];
  const NormAttrs a{eps, weight_offset};
  if (x.element_type() == ffi::DataType::F32) {
    NormRows<float>(Data<float>(x), Data<float>(residual), gamma.typed_data(), m, d, a,
                    h->reinterpret_data<float>(),
                    y != nullptr ? y->reinterpret_data<float>() : nullptr, q, s, x_gamma,
                    digits);
  } else {
    NormRows<uint16_t>(Data<uint16_t>(x), Data<uint16_t>(residual), gamma.typed_data(), m, d,
                       a, h->reinterpret_data<uint16_t>(),
                       y != nullptr ? y->reinterpret_data<uint16_t>() : nullptr, q, s, x_gamma);
  }
  return ffi::Error::Success();
}

ffi::Error AddRmsNormQuantCpu(ffi::AnyBuffer x, ffi::AnyBuffer residual,
                              ffi::BufferR1<ffi::F32> gamma,
                              ffi::Result<ffi::BufferR2<ffi::S8>> x_q,
                              ffi::Result<ffi::BufferR1<ffi::F32>> s_x,
                              ffi::Result<ffi::AnyBuffer> h, float eps, float weight_offset,
                              int32_t digits) {
  if (auto e = CheckNormDigits(x, x_q->dimensions(), s_x->dimensions(), digits,
                               "prism_add_rmsnorm_quant");
      e.failure()) {
    return e;
  }
  return AddNorm(x, residual, nullptr, gamma, nullptr, &*h, x_q->typed_data(), s_x->typed_data(),
                 eps, weight_offset, "prism_add_rmsnorm_quant", digits);
}

ffi::Error AddRmsNormCpu(ffi::AnyBuffer x, ffi::AnyBuffer residual,
                         ffi::BufferR1<ffi::F32> gamma, ffi::Result<ffi::AnyBuffer> y,
                         ffi::Result<ffi::AnyBuffer> h, float eps, float weight_offset) {
  return AddNorm(x, residual, nullptr, gamma, &*y, &*h, nullptr, nullptr, eps, weight_offset,
                 "prism_add_rmsnorm");
}

ffi::Error NormAddRmsNormQuantCpu(ffi::AnyBuffer x, ffi::AnyBuffer residual,
                                  ffi::BufferR1<ffi::F32> x_gamma,
                                  ffi::BufferR1<ffi::F32> gamma,
                                  ffi::Result<ffi::BufferR2<ffi::S8>> x_q,
                                  ffi::Result<ffi::BufferR1<ffi::F32>> s_x,
                                  ffi::Result<ffi::AnyBuffer> h, float eps,
                                  float weight_offset, int32_t digits) {
  if (auto e = CheckNormDigits(x, x_q->dimensions(), s_x->dimensions(), digits,
                               "prism_norm_add_rmsnorm_quant");
      e.failure()) {
    return e;
  }
  return AddNorm(x, residual, &x_gamma, gamma, nullptr, &*h, x_q->typed_data(),
                 s_x->typed_data(), eps, weight_offset, "prism_norm_add_rmsnorm_quant", digits);
}

ffi::Error NormAddRmsNormCpu(ffi::AnyBuffer x, ffi::AnyBuffer residual,
                             ffi::BufferR1<ffi::F32> x_gamma, ffi::BufferR1<ffi::F32> gamma,
                             ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> h,
                             float eps, float weight_offset) {
  return AddNorm(x, residual, &x_gamma, gamma, &*y, &*h, nullptr, nullptr, eps, weight_offset,
                 "prism_norm_add_rmsnorm");
}

// The _sum forms (norm_digits.h): x = x2[:M] + (x2[M:] + x_w2), rounded add by add as XLA
// adds Int8Linear's partial products, then the add_* form on it; x_gamma may be null.
ffi::Error AddNormSum(const ffi::AnyBuffer& x2, const ffi::AnyBuffer& x_w2,
                      const ffi::AnyBuffer& residual, const ffi::BufferR1<ffi::F32>* x_gamma,
                      const ffi::BufferR1<ffi::F32>& gamma, ffi::Result<ffi::BufferR2<ffi::S8>> q,
                      ffi::Result<ffi::BufferR1<ffi::F32>> s, ffi::Result<ffi::AnyBuffer> h,
                      float eps, float weight_offset, int32_t digits, const char* op) {
  if (auto e = CheckNormSumParts(x2, x_w2, op); e.failure()) return e;
  if (auto e = CheckRows(x_w2, gamma, op); e.failure()) return e;
  if (auto e = CheckNormDigits(x_w2, q->dimensions(), s->dimensions(), digits, op);
      e.failure()) {
    return e;
  }
  const std::string name(op);
  PRISM_REQUIRE(residual.element_type() == ffi::DataType::F32 &&
                    residual.element_count() == x_w2.element_count(),
                name + ": residual must match x_w2 in shape and dtype");
  PRISM_REQUIRE(h->element_type() == ffi::DataType::F32 &&
                    h->element_count() == x_w2.element_count(),
                name + ": h must match x_w2 in shape and dtype");
  PRISM_REQUIRE(x_gamma == nullptr || x_gamma->dimensions()[0] == x_w2.dimensions()[1],
                name + ": x_gamma must be [D]");
  const int64_t m = x_w2.dimensions()[0], d = x_w2.dimensions()[1];
  const float* lo = Data<float>(x2);
  const float* hi = lo + m * d;
  const float* w2 = Data<float>(x_w2);
  std::vector<float> x(static_cast<size_t>(m * d));
  for (int64_t i = 0; i < m * d; ++i) x[i] = lo[i] + (hi[i] + w2[i]);
  NormRows<float>(x.data(), Data<float>(residual), gamma.typed_data(), m, d,
                  NormAttrs{eps, weight_offset}, h->reinterpret_data<float>(), nullptr,
                  q->typed_data(), s->typed_data(),
                  x_gamma != nullptr ? x_gamma->typed_data() : nullptr, digits);
  return ffi::Error::Success();
}

ffi::Error AddRmsNormQuantSumCpu(ffi::AnyBuffer x2, ffi::AnyBuffer x_w2, ffi::AnyBuffer residual,
                                 ffi::BufferR1<ffi::F32> gamma,
                                 ffi::Result<ffi::BufferR2<ffi::S8>> x_q,
                                 ffi::Result<ffi::BufferR1<ffi::F32>> s_x,
                                 ffi::Result<ffi::AnyBuffer> h, float eps, float weight_offset,
                                 int32_t digits) {
  return AddNormSum(x2, x_w2, residual, nullptr, gamma, x_q, s_x, h, eps, weight_offset, digits,
                    "prism_add_rmsnorm_quant_sum");
}

ffi::Error NormAddRmsNormQuantSumCpu(ffi::AnyBuffer x2, ffi::AnyBuffer x_w2,
                                     ffi::AnyBuffer residual, ffi::BufferR1<ffi::F32> x_gamma,
                                     ffi::BufferR1<ffi::F32> gamma,
                                     ffi::Result<ffi::BufferR2<ffi::S8>> x_q,
                                     ffi::Result<ffi::BufferR1<ffi::F32>> s_x,
                                     ffi::Result<ffi::AnyBuffer> h, float eps,
                                     float weight_offset, int32_t digits) {
  return AddNormSum(x2, x_w2, residual, &x_gamma, gamma, x_q, s_x, h, eps, weight_offset, digits,
                    "prism_norm_add_rmsnorm_quant_sum");
}

}  // namespace
}  // namespace prism

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismAddRmsNormQuantSumCpu, prism::AddRmsNormQuantSumCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()              // x2 [2M, D] f32
                                  .Arg<ffi::AnyBuffer>()              // x_w2 [M, D] f32
                                  .Arg<ffi::AnyBuffer>()              // residual [M, D] f32
                                  .Arg<ffi::BufferR1<ffi::F32>>()    // gamma [D]
                                  .Ret<ffi::BufferR2<ffi::S8>>()     // x_q [digits * M, D]
                                  .Ret<ffi::BufferR1<ffi::F32>>()    // s_x [digits * M]
                                  .Ret<ffi::AnyBuffer>()              // h = x + residual
                                  .Attr<float>("eps")
                                  .Attr<float>("weight_offset")
                                  .Attr<int32_t>("digits"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismNormAddRmsNormQuantSumCpu, prism::NormAddRmsNormQuantSumCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()              // x2 [2M, D] f32
                                  .Arg<ffi::AnyBuffer>()              // x_w2 [M, D] f32
                                  .Arg<ffi::AnyBuffer>()              // residual [M, D] f32
                                  .Arg<ffi::BufferR1<ffi::F32>>()    // x_gamma [D]
                                  .Arg<ffi::BufferR1<ffi::F32>>()    // gamma [D]
                                  .Ret<ffi::BufferR2<ffi::S8>>()     // x_q [digits * M, D]
                                  .Ret<ffi::BufferR1<ffi::F32>>()    // s_x [digits * M]
                                  .Ret<ffi::AnyBuffer>()              // h
                                  .Attr<float>("eps")
                                  .Attr<float>("weight_offset")
                                  .Attr<int32_t>("digits"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismAddRmsNormCpu, prism::AddRmsNormCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()              // x [M, D] f32|bf16
                                  .Arg<ffi::AnyBuffer>()              // residual [M, D]
                                  .Arg<ffi::BufferR1<ffi::F32>>()    // gamma [D]
                                  .Ret<ffi::AnyBuffer>()              // y [M, D] x's dtype
                                  .Ret<ffi::AnyBuffer>()              // h = x + residual
                                  .Attr<float>("eps")
                                  .Attr<float>("weight_offset"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismRmsNormCpu, prism::RmsNormCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()              // x [M, D] f32|bf16
                                  .Arg<ffi::BufferR1<ffi::F32>>()    // gamma [D]
                                  .Ret<ffi::AnyBuffer>()              // y [M, D] x's dtype
                                  .Attr<float>("eps")
                                  .Attr<float>("weight_offset"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismRmsNormQuantCpu, prism::RmsNormQuantCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()              // x [M, D] f32|bf16
                                  .Arg<ffi::BufferR1<ffi::F32>>()    // gamma [D]
                                  .Ret<ffi::BufferR2<ffi::S8>>()     // x_q [M, D]
                                  .Ret<ffi::BufferR1<ffi::F32>>()    // s_x [M]
                                  .Attr<float>("eps")
                                  .Attr<float>("weight_offset")
                                  .Attr<int32_t>("digits"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismAddRmsNormQuantCpu, prism::AddRmsNormQuantCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()              // x [M, D] f32|bf16
                                  .Arg<ffi::AnyBuffer>()              // residual [M, D]
                                  .Arg<ffi::BufferR1<ffi::F32>>()    // gamma [D]
                                  .Ret<ffi::BufferR2<ffi::S8>>()     // x_q [M, D]
                                  .Ret<ffi::BufferR1<ffi::F32>>()    // s_x [M]
                                  .Ret<ffi::AnyBuffer>()              // h = x + residual
                                  .Attr<float>("eps")
                                  .Attr<float>("weight_offset")
                                  .Attr<int32_t>("digits"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismNormAddRmsNormQuantCpu, prism::NormAddRmsNormQuantCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()              // x [M, D] f32|bf16
                                  .Arg<ffi::AnyBuffer>()              // residual [M, D]
                                  .Arg<ffi::BufferR1<ffi::F32>>()    // x_gamma [D]
                                  .Arg<ffi::BufferR1<ffi::F32>>()    // gamma [D]
                                  .Ret<ffi::BufferR2<ffi::S8>>()     // x_q [M, D]
                                  .Ret<ffi::BufferR1<ffi::F32>>()    // s_x [M]
                                  .Ret<ffi::AnyBuffer>()              // h
                                  .Attr<float>("eps")
                                  .Attr<float>("weight_offset")
                                  .Attr<int32_t>("digits"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismNormAddRmsNormCpu, prism::NormAddRmsNormCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()              // x [M, D] f32|bf16
                                  .Arg<ffi::AnyBuffer>()              // residual [M, D]
                                  .Arg<ffi::BufferR1<ffi::F32>>()    // x_gamma [D]
                                  .Arg<ffi::BufferR1<ffi::F32>>()    // gamma [D]
                                  .Ret<ffi::AnyBuffer>()              // y [M, D] x's dtype
                                  .Ret<ffi::AnyBuffer>()              // h
                                  .Attr<float>("eps")
                                  .Attr<float>("weight_offset"));
