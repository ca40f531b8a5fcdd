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
//
// prism_qkv_rope_kv and prism_qkv_rope_sum_kv store k and v straight into the layer's pools
// instead of returning them, so prism_tree_attention (called with no new rows) skips its own
// write kernel and the k/v round trip through memory:
//   ... q_gamma, k_gamma, k_pages, v_pages f32 [P, L, K, H], slot s32 [T]
//   -> q f32 [T, K * G, H], k_pages, v_pages (aliased to the operands)
// Token t's k and v land at pool row slot[t] (tree_attention.h's write: a slot outside
// [0, P * L) writes nothing; when tokens share a slot the CPU keeps the last one's, as
// tree_attention's CPU write does, and CUDA, like its write kernel, any one's).
#pragma once

#include <cstdint>
#include <string>

#include "cc/common.h"

namespace prism {

struct QkvRopeDims {
  int64_t t, k, g, h;  // tokens, kv heads, query heads per kv head, head dim
};

// Where the (token t, kv head h) rows of k and v go: row t * K + h of the k and v results, or,
// with a slot table (the _kv variants), row slot[t] * K + h of the pools, none when slot[t]
// lies outside [0, pool_rows).
struct KvDest {
  float* k;
  float* v;
  const int32_t* slot;  // null: the results
  int64_t pool_rows;    // P * L
};

// The operands every variant shares, and q.
inline ffi::Error CheckQkvRope(ffi::AnyBuffer::Dimensions qkv, ffi::AnyBuffer::Dimensions cos,
                               ffi::AnyBuffer::Dimensions sin, ffi::AnyBuffer::Dimensions qg,
                               ffi::AnyBuffer::Dimensions kg, ffi::AnyBuffer::Dimensions q,
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
  return ffi::Error::Success();
}

// prism_qkv_rope(_sum)'s k and v results.
inline ffi::Error CheckKvRows(ffi::AnyBuffer::Dimensions k, ffi::AnyBuffer::Dimensions v,
                              const QkvRopeDims& dm) {
  for (const auto& kv : {k, v}) {
    PRISM_REQUIRE(kv.size() == 3 && kv[0] == dm.t && kv[1] == dm.k && kv[2] == dm.h,
                  "prism_qkv_rope: k and v must be [T, K, H] = [" + std::to_string(dm.t) + ", " +
                      std::to_string(dm.k) + ", " + std::to_string(dm.h) + "], got " +
                      DimsToString(kv));
  }
  return ffi::Error::Success();
}

// The _kv variants' pools and slot; *pool_rows = P * L.
inline ffi::Error CheckKvPools(ffi::AnyBuffer::Dimensions kp, ffi::AnyBuffer::Dimensions vp,
                               ffi::AnyBuffer::Dimensions slot, const QkvRopeDims& dm,
                               int64_t* pool_rows) {
  const std::string op = "prism_qkv_rope_kv: ";
  PRISM_REQUIRE(kp.size() == 4 && kp[2] == dm.k && kp[3] == dm.h,
                op + "k_pages must be [P, L, K, H] with K = " + std::to_string(dm.k) +
                    " and H = " + std::to_string(dm.h) + ", got " + DimsToString(kp));
  PRISM_REQUIRE(DimsToString(vp) == DimsToString(kp), op + "v_pages must match k_pages");
  PRISM_REQUIRE(slot.size() == 1 && slot[0] == dm.t,
                op + "slot must be [T] with T = " + std::to_string(dm.t));
  *pool_rows = kp[0] * kp[1];
  return ffi::Error::Success();
}

// prism_qkv_rope_sum's shapes: y2 stacks two of y_w2's rows, and y_w2 has qkv's layout.
inline ffi::Error CheckQkvRopeSum(ffi::AnyBuffer::Dimensions y2, ffi::AnyBuffer::Dimensions y_w2,
                                  ffi::AnyBuffer::Dimensions cos, ffi::AnyBuffer::Dimensions sin,
                                  ffi::AnyBuffer::Dimensions qg, ffi::AnyBuffer::Dimensions kg,
                                  ffi::AnyBuffer::Dimensions q, QkvRopeDims* dm) {
  PRISM_REQUIRE(y2.size() == 4 && y_w2.size() == 4 && y2[0] == 2 * y_w2[0] &&
                    y2[1] == y_w2[1] && y2[2] == y_w2[2] && y2[3] == y_w2[3],
                "prism_qkv_rope_sum: y2 must be [2T, K, G + 2, H] for y_w2 [T, K, G + 2, H], "
                "got " + DimsToString(y2) + " and " + DimsToString(y_w2));
  return CheckQkvRope(y_w2, cos, sin, qg, kg, q, dm);
}

}  // namespace prism

// The handlers' bindings after qkv (or y2, y_w2), shared by the CPU and CUDA files: the
// tables, then the k/v results or the pools and slot with the pool results, and the attributes.
#define PRISM_F32(rank) ::xla::ffi::BufferR##rank<::xla::ffi::F32>
#define PRISM_ROPE_TABLES                                       \
  .Arg<PRISM_F32(2)>()     /* cos [T, H / 2] */                \
      .Arg<PRISM_F32(2)>() /* sin [T, H / 2] */                \
      .Arg<PRISM_F32(1)>() /* q_gamma [H] */                   \
      .Arg<PRISM_F32(1)>() /* k_gamma [H] */
#define PRISM_ROPE_ATTRS \
  .Attr<float>("eps").Attr<float>("weight_offset").Attr<int32_t>("qk_norm")
#define PRISM_ROPE_KV_ROWS                                      \
  .Ret<PRISM_F32(3)>()     /* q [T, K * G, H] */               \
      .Ret<PRISM_F32(3)>() /* k [T, K, H] */                   \
      .Ret<PRISM_F32(3)>() /* v [T, K, H] */
#define PRISM_ROPE_KV_POOLS                                                  \
  .Arg<PRISM_F32(4)>()                                   /* k_pages [P, L, K, H] */ \
      .Arg<PRISM_F32(4)>()                               /* v_pages [P, L, K, H] */ \
      .Arg<::xla::ffi::BufferR1<::xla::ffi::S32>>()      /* slot [T] */             \
      .Ret<PRISM_F32(3)>()                               /* q [T, K * G, H] */      \
      .Ret<PRISM_F32(4)>()                               /* k_pages (aliased) */    \
      .Ret<PRISM_F32(4)>()                               /* v_pages (aliased) */
