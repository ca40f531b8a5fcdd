// The gated activations' shared pieces (CPU and CUDA handlers of both ops):
//   prism_glu_quant   gate_up [M, 2F] f32|bf16 -> a_q s8 [M, F], s_a f32 [M]
//   prism_glu_quant2  gate_up [M, 2F] f32|bf16 -> q1 s8 [M, F], s1 f32 [M], q2 s8, s2 f32 (same)
//   prism_glu_quant2_sum  y2 [2M, 2F] f32, yw2 [M, 2F] f32 -> glu_quant2 of
//                     gate_up = y2[:M] + (y2[M:] + yw2) (two-digit projection partials), its
//                     digits stacked: q s8 [2M, F] (q1's rows, then q2's), s f32 [2M]
// Row r of gate_up is gate (its first F elements) then up: the fused gate/up projection's own
// layout [M, 2, F], so neither half is ever copied out by XLA. a = Activate(gate) * up.
// glu_quant2's (q1, s1) is prism_glu_quant's result, bit for bit; the
// remainder r = a - q1 * s1 is quantised per row with the same rule (numerics.h), so that
// q1 * s1 + q2 * s2 reproduces a to about 1 / (127 * 254) of the row's max.
#pragma once

#include <cstdint>
#include <string>

#include "cc/common.h"
#include "cc/numerics.h"

namespace prism {

// r = a - float(code) * scale as two correctly rounded operations, never one FMA: a contracted
// remainder would round differently from the reference (and from the other device). The CPU
// build passes -ffp-contract=off; CUDA's intrinsics are never contracted whatever -fmad says.
PRISM_HD float QuantRemainder(float a, int8_t code, float scale) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, __fmul_rn(static_cast<float>(code), scale));
#else
  const float first = static_cast<float>(code) * scale;
  return a - first;
#endif
}

// The handlers' argument checks (the Python wrapper checks first, with friendlier words).
inline ffi::Error CheckGluArgs(const std::string& op, const ffi::AnyBuffer& gate_up,
                               int32_t activation) {
  PRISM_REQUIRE(gate_up.dimensions().size() == 2 && gate_up.dimensions()[1] % 2 == 0,
                op + ": gate_up must be [M, 2F] (each row: gate, then up)");
  PRISM_REQUIRE(IsFloatActivation(gate_up.element_type()),
                op + ": gate_up must be float32 or bfloat16");
  PRISM_REQUIRE(activation == 0 || activation == 1,
                op + ": activation must be 0 (gelu_tanh) or 1 (silu)");
  return ffi::Error::Success();
}

inline ffi::Error CheckGluSumArgs(ffi::AnyBuffer::Dimensions y2,
                                  ffi::AnyBuffer::Dimensions yw2, ffi::AnyBuffer::Dimensions q,
                                  ffi::AnyBuffer::Dimensions s, int32_t activation) {
  PRISM_REQUIRE(yw2.size() == 2 && yw2[1] % 2 == 0,
                "prism_glu_quant2_sum: yw2 must be [M, 2F] (each row: gate, then up)");
  PRISM_REQUIRE(y2.size() == 2 && y2[0] == 2 * yw2[0] && y2[1] == yw2[1],
                "prism_glu_quant2_sum: y2 must be [2M, 2F] for yw2 [M, 2F], got " +
                    DimsToString(y2) + " and " + DimsToString(yw2));
  PRISM_REQUIRE(activation == 0 || activation == 1,
                "prism_glu_quant2_sum: activation must be 0 (gelu_tanh) or 1 (silu)");
  PRISM_REQUIRE(q.size() == 2 && q[0] == 2 * yw2[0] && 2 * q[1] == yw2[1] && s.size() == 1 &&
                    s[0] == 2 * yw2[0],
                "prism_glu_quant2_sum: q must be [2M, F] and s [2M] for yw2 " + DimsToString(yw2));
  return ffi::Error::Success();
}

}  // namespace prism
