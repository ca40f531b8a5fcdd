// prism_qkv_rope, shared by the CPU and CUDA handlers: the fused q/k/v projection's output
// split into q, k and v, q and k normalised per head (qk-norm: Gemma 3, Qwen3) and rotated
// (rotate-half rope, HF's layout), v copied. One custom call for what was two norm calls, the
// slices feeding them and XLA's rope fusions: ~6 launches a layer at ~2-3 us each on the H200.
//
//   qkv f32 [T, K, G + 2, H] (per kv head: its G query heads, then k, then v),
//   cos, sin f32 [T, H / 2], q_gamma, k_gamma f32 [H]
//   -> q f32 [T, K * G, H], k f32 [T, K, H], v f32 [T, K, H]
//   attrs eps, weight_offset (f32), qk_norm (int32; 0: no norms, the gammas are not read)
//
// Per q or k row x of H elements at token t: y = qk_norm ? NormRow(x) : x (norm_row.h, the
// canonical sum, so rmsnorm's bits), then with half = H / 2 and i = d mod half:
//   out[d] = y[d] * cos[t, i] - y[d + half] * sin[t, i]   (d <  half)
//   out[d] = y[d] * cos[t, i] + y[d - half] * sin[t, i]   (d >= half)
// each product and the sum rounded to f32 separately (no FMA): ops.qkv_rope's reference.
//
// prism_qkv_rope_sum takes the two-digit projection's partial products instead of qkv:
//   y2 f32 [2T, K, G + 2, H] (x1 W1 stacked over x2 W1), y_w2 f32 [T, K, G + 2, H] (x1 W2)
// and reads qkv[t] = y2[t] + (y2[T + t] + y_w2[t]), each add rounded, in Int8Linear's order:
// the same bits as the XLA sum it replaces, without writing that sum out.
#pragma once

#include <cstdint>
#include <string>

#include "cc/common.h"

namespace prism {

struct QkvRopeDims {
  int64_t t, k, g, h;  // tokens, kv heads, query heads per kv head, head dim
};

inline ffi::Error CheckQkvRope(ffi::AnyBuffer::Dimensions qkv, ffi::AnyBuffer::Dimensions cos,
                               ffi::AnyBuffer::Dimensions sin, ffi::AnyBuffer::Dimensions qg,
                               ffi::AnyBuffer::Dimensions kg, ffi::AnyBuffer::Dimensions q,
                               ffi::AnyBuffer::Dimensions k, ffi::AnyBuffer::Dimensions v,
                               QkvRopeDims* dm) {
  const std::string op = "prism_qkv_rope: ";
  PRISM_REQUIRE(qkv.size() == 4 && qkv[2] >= 3,
                op + "qkv must be [T, K, G + 2, H] with G >= 1, got " + DimsToString(qkv));
  *dm = {qkv[0], qkv[1], qkv[2] - 2, qkv[3]};
  const int64_t half = dm->h / 2;
  PRISM_REQUIRE(dm->h % 2 == 0, op + "rope needs an even head dim, got " + DimsToString(qkv));
  PRISM_REQUIRE(cos.size() == 2 && cos[0] == dm->t && cos[1] == half && sin.size() == 2 &&
                    sin[0] == dm->t && sin[1] == half,
                op + "cos and sin must be [T, H / 2] for qkv " + DimsToString(qkv));
  PRISM_REQUIRE(qg.size() == 1 && qg[0] == dm->h && kg.size() == 1 && kg[0] == dm->h,
                op + "q_gamma and k_gamma must be [H] for qkv " + DimsToString(qkv));
  PRISM_REQUIRE(q.size() == 3 && q[0] == dm->t && q[1] == dm->k * dm->g && q[2] == dm->h,
                op + "q must be [T, K * G, H] for qkv " + DimsToString(qkv));
  for (const auto& kv : {k, v}) {
    PRISM_REQUIRE(kv.size() == 3 && kv[0] == dm->t && kv[1] == dm->k && kv[2] == dm->h,
                  op + "k and v must be [T, K, H] for qkv " + DimsToString(qkv));
  }
  return ffi::Error::Success();
}

// prism_qkv_rope_sum's shapes: y2 stacks two of y_w2's rows, and y_w2 has qkv's layout.
inline ffi::Error CheckQkvRopeSum(ffi::AnyBuffer::Dimensions y2, ffi::AnyBuffer::Dimensions y_w2,
                                  ffi::AnyBuffer::Dimensions cos, ffi::AnyBuffer::Dimensions sin,
                                  ffi::AnyBuffer::Dimensions qg, ffi::AnyBuffer::Dimensions kg,
                                  ffi::AnyBuffer::Dimensions q, ffi::AnyBuffer::Dimensions k,
                                  ffi::AnyBuffer::Dimensions v, QkvRopeDims* dm) {
  PRISM_REQUIRE(y2.size() == 4 && y_w2.size() == 4 && y2[0] == 2 * y_w2[0] &&
                    y2[1] == y_w2[1] && y2[2] == y_w2[2] && y2[3] == y_w2[3],
                "prism_qkv_rope_sum: y2 must be [2T, K, G + 2, H] for y_w2 [T, K, G + 2, H], "
                "got " + DimsToString(y2) + " and " + DimsToString(y_w2));
  return CheckQkvRope(y_w2, cos, sin, qg, kg, q, k, v, dm);
}

}  // namespace prism
