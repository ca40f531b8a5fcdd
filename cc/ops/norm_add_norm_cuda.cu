// Gemma's post-norm fused in front of the next residual add and norm, on CUDA; the
// specification is norm_quant_cpu.cc (bit-identical):
//   prism_norm_add_rmsnorm_quant  x, residual [M, D], x_gamma, gamma [D]
//                                   -> x_q s8 [M, D], s_x f32 [M],
//                                      h = rmsnorm(x, x_gamma) + residual
//   prism_norm_add_rmsnorm        x, residual [M, D], x_gamma, gamma [D]  -> y, h
//   prism_norm_add_rmsnorm_quant_sum  the _quant form of a two-digit projection's partial
//                                 products (norm_digits.h): x2 [2M, D], x_w2, residual [M, D]
// The _quant form takes `digits` (norm_digits.h): 2 (f32) also writes the second digit.
// What prism_rmsnorm(x, x_gamma) followed by prism_add_rmsnorm(_quant) computes, in one launch
// where the split register kernel serves the row (NormSplitRowsKernel's kPre form: x's inverse
// RMS chained over the same warps first); otherwise (rows of <= 768 or > 5376 elements, or a
// forced one-warp or block kernel) as those two launches, the first writing rmsnorm(x) into h
// and the second adding the residual into h in place. Either way the same bits.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cc/common.h"
#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/norm_args.cuh"
#include "cc/ops/norm_digits.h"
#include "cc/ops/norm_launch.cuh"
#include "cc/ops/norm_reg_rows.cuh"
#include "cc/ops/norm_split_rows.cuh"
#include "cc/ops/norm_sum_parts.cuh"

namespace prism {
namespace {

template <typename T>
ffi::Error LaunchPreNorm(cudaStream_t stream, int64_t m, const NormArgs<T>& a, const char* op) {
  if (m == 0) return ffi::Error::Success();
  PRISM_REQUIRE(m <= 0x7fffffff, std::string(op) + ": too many rows for one grid");
  int forced = 0;
  if (auto e = ForcedNormKernel(&forced); e.failure()) return e;
  const bool lean = forced > kForceLean || (forced == 0 && m >= kLeanRows);
  const int warps = forced > 0 ? forced % kForceLean : SplitWarps(m, a.d, lean);
  if (forced != -1 && a.d <= kMaxRegChunks * kStride && warps >= 2) {
    LaunchSplitRowsFor<T, true>(stream, m, warps, lean, a);
    return LaunchStatus(op);
  }
  NormArgs<T> src = a;  // the partial-product form: their sum into h, then h is x
  if (a.x_hi != nullptr) {
    if (auto e = SumPartsIntoH(stream, m, &src, op); e.failure()) return e;
  }
  NormArgs<T> norm_x = src;  // y = rmsnorm(x, x_gamma) into h
  norm_x.residual = nullptr, norm_x.gamma = a.x_gamma, norm_x.x_gamma = nullptr;
  norm_x.h = nullptr, norm_x.y = a.h, norm_x.q = nullptr, norm_x.s = nullptr;
  norm_x.q2 = nullptr, norm_x.s2 = nullptr;
  if (auto e = LaunchNorm(stream, m, norm_x, op); e.failure()) return e;
  NormArgs<T> add = src;  // h = h + residual in place, then the norm
  add.x = a.h, add.x_gamma = nullptr;
  return LaunchNorm(stream, m, add, op);
}

ffi::Error Check(const ffi::AnyBuffer& x, const ffi::AnyBuffer& residual,
                 const ffi::BufferR1<ffi::F32>& x_gamma, const ffi::BufferR1<ffi::F32>& gamma,
                 const std::string& op) {
  PRISM_REQUIRE(x.dimensions().size() == 2, op + ": x must be [M, D]");
  PRISM_REQUIRE(IsFloatActivation(x.element_type()), op + ": x must be float32 or bfloat16");
  PRISM_REQUIRE(residual.element_type() == x.element_type() &&
                    residual.element_count() == x.element_count(),
                op + ": residual must match x in shape and dtype");
  PRISM_REQUIRE(gamma.dimensions()[0] == x.dimensions()[1] &&
                    x_gamma.dimensions()[0] == x.dimensions()[1],
                op + ": x_gamma and gamma must be [D]");
  return ffi::Error::Success();
}

template <typename T>
NormArgs<T> Args(const ffi::AnyBuffer& x, const ffi::AnyBuffer& residual,
                 const ffi::BufferR1<ffi::F32>& x_gamma, const ffi::BufferR1<ffi::F32>& gamma,
                 void* h, void* y, int8_t* q, float* s, float eps, float weight_offset) {
  NormArgs<T> a{x.reinterpret_data<T>(), residual.reinterpret_data<T>(), gamma.typed_data(),
                static_cast<T*>(h), static_cast<T*>(y), q, s, x.dimensions()[1], eps,
                weight_offset};
  a.x_gamma = x_gamma.typed_data();
  return a;
}

// digits = 2 (f32 only, checked by the caller): q and s hold 2M rows, the second digit's
// after the first's (NormArgs::q2 / s2; the unfused fallback passes them to its second launch).
ffi::Error Run(cudaStream_t stream, const ffi::AnyBuffer& x, const ffi::AnyBuffer& residual,
               const ffi::BufferR1<ffi::F32>& x_gamma, const ffi::BufferR1<ffi::F32>& gamma,
               void* h, void* y, int8_t* q, float* s, float eps, float weight_offset,
               const char* op, int32_t digits = 1) {
  if (auto e = Check(x, residual, x_gamma, gamma, op); e.failure()) return e;
  const int64_t m = x.dimensions()[0];
  if (x.element_type() == ffi::DataType::F32) {
    NormArgs<float> a = Args<float>(x, residual, x_gamma, gamma, h, y, q, s, eps, weight_offset);
    if (digits == 2) a.q2 = q + m * a.d, a.s2 = s + m;
    return LaunchPreNorm(stream, m, a, op);
  }
  return LaunchPreNorm(
      stream, m, Args<uint16_t>(x, residual, x_gamma, gamma, h, y, q, s, eps, weight_offset), op);
}

ffi::Error NormAddRmsNormQuantCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer residual,
                                   ffi::BufferR1<ffi::F32> x_gamma,
                                   ffi::BufferR1<ffi::F32> gamma,
                                   ffi::Result<ffi::BufferR2<ffi::S8>> x_q,
                                   ffi::Result<ffi::BufferR1<ffi::F32>> s_x,
                                   ffi::Result<ffi::AnyBuffer> h, float eps,
                                   float weight_offset, int32_t digits) {
  const char* op = "prism_norm_add_rmsnorm_quant";
  if (auto e = CheckNormDigits(x, x_q->dimensions(), s_x->dimensions(), digits, op);
      e.failure()) {
    return e;
  }
  return Run(stream, x, residual, x_gamma, gamma, h->untyped_data(), nullptr, x_q->typed_data(),
             s_x->typed_data(), eps, weight_offset, op, digits);
}

// x = x2[:M] + (x2[M:] + x_w2) (norm_digits.h), added in the split kernel's loads.
ffi::Error NormAddRmsNormQuantSumCuda(cudaStream_t stream, ffi::AnyBuffer x2,
                                      ffi::AnyBuffer x_w2, ffi::AnyBuffer residual,
                                      ffi::BufferR1<ffi::F32> x_gamma,
                                      ffi::BufferR1<ffi::F32> gamma,
                                      ffi::Result<ffi::BufferR2<ffi::S8>> x_q,
                                      ffi::Result<ffi::BufferR1<ffi::F32>> s_x,
                                      ffi::Result<ffi::AnyBuffer> h, float eps,
                                      float weight_offset, int32_t digits) {
  const char* op = "prism_norm_add_rmsnorm_quant_sum";
  if (auto e = CheckNormSumParts(x2, x_w2, op); e.failure()) return e;
  if (auto e = CheckNormDigits(x_w2, x_q->dimensions(), s_x->dimensions(), digits, op);
      e.failure()) {
    return e;
  }
  if (auto e = Check(x_w2, residual, x_gamma, gamma, op); e.failure()) return e;
  const int64_t m = x_w2.dimensions()[0];
  NormArgs<float> a = Args<float>(x_w2, residual, x_gamma, gamma, h->untyped_data(), nullptr,
                                  x_q->typed_data(), s_x->typed_data(), eps, weight_offset);
  a.x = x2.reinterpret_data<float>();
  a.x_hi = a.x + m * a.d;
  a.x_w2 = x_w2.reinterpret_data<float>();
  if (digits == 2) a.q2 = a.q + m * a.d, a.s2 = a.s + m;
  return LaunchPreNorm(stream, m, a, op);
}

ffi::Error NormAddRmsNormCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer residual,
                              ffi::BufferR1<ffi::F32> x_gamma, ffi::BufferR1<ffi::F32> gamma,
                              ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> h,
                              float eps, float weight_offset) {
  PRISM_REQUIRE(y->element_type() == x.element_type() && h->element_type() == x.element_type(),
                "prism_norm_add_rmsnorm: y and h must have x's dtype");
  return Run(stream, x, residual, x_gamma, gamma, h->untyped_data(), y->untyped_data(), nullptr,
             nullptr, eps, weight_offset, "prism_norm_add_rmsnorm");
}

}  // namespace
}  // namespace prism

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismNormAddRmsNormQuantCuda, prism::NormAddRmsNormQuantCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()            // x [M, D] f32|bf16
                                  .Arg<ffi::AnyBuffer>()            // residual [M, D]
                                  .Arg<ffi::BufferR1<ffi::F32>>()  // x_gamma [D]
                                  .Arg<ffi::BufferR1<ffi::F32>>()  // gamma [D]
                                  .Ret<ffi::BufferR2<ffi::S8>>()   // x_q [M, D]
                                  .Ret<ffi::BufferR1<ffi::F32>>()  // s_x [M]
                                  .Ret<ffi::AnyBuffer>()            // h
                                  .Attr<float>("eps")
                                  .Attr<float>("weight_offset")
                                  .Attr<int32_t>("digits"),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismNormAddRmsNormQuantSumCuda, prism::NormAddRmsNormQuantSumCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()            // x2 [2M, D] f32
                                  .Arg<ffi::AnyBuffer>()            // x_w2 [M, D] f32
                                  .Arg<ffi::AnyBuffer>()            // residual [M, D] f32
                                  .Arg<ffi::BufferR1<ffi::F32>>()  // x_gamma [D]
                                  .Arg<ffi::BufferR1<ffi::F32>>()  // gamma [D]
                                  .Ret<ffi::BufferR2<ffi::S8>>()   // x_q [digits * M, D]
                                  .Ret<ffi::BufferR1<ffi::F32>>()  // s_x [digits * M]
                                  .Ret<ffi::AnyBuffer>()            // h
                                  .Attr<float>("eps")
                                  .Attr<float>("weight_offset")
                                  .Attr<int32_t>("digits"),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismNormAddRmsNormCuda, prism::NormAddRmsNormCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()            // x [M, D] f32|bf16
                                  .Arg<ffi::AnyBuffer>()            // residual [M, D]
                                  .Arg<ffi::BufferR1<ffi::F32>>()  // x_gamma [D]
                                  .Arg<ffi::BufferR1<ffi::F32>>()  // gamma [D]
                                  .Ret<ffi::AnyBuffer>()            // y [M, D] x's dtype
                                  .Ret<ffi::AnyBuffer>()            // h
                                  .Attr<float>("eps")
                                  .Attr<float>("weight_offset"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
