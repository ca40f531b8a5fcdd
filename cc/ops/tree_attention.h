// Tree attention over a paged KV pool: the semantics shared by the CPU and CUDA handlers, so the
// two cannot disagree on which key a query sees or on the softmax arithmetic.
//
// Letters: T tokens of the step, N query heads, K kv heads (query head n uses kv head n / G,
// G = N / K), H head dim, P pages, L page size, C chains, S segments per chain (padded),
// Pt entries of the flat page list.
//   prism_tree_attention
//     q               [T, N, H]     f32|bf16   queries (already roped/normed, not scaled)
//     k_new, v_new    [T, K, H]     pool dtype this step's keys and values, or both
//                     [0, K, H]                already in the pools (prism_qkv_rope_kv)
//     k_pages,v_pages [P, L, K, H]  f32|bf16   KV pool, aliased to results 1 and 2
//     slot            s32 [T]       page * L + offset receiving token t's k/v;
//                                   outside [0, P * L): nothing is written
//     positions       s32 [T]       absolute position of token t; < 0: padding (zero output)
//     chain_of        s32 [T]       chain of token t; outside [0, C): padding (zero output)
//     chain_segments  s32 [C, S, 3] (start, length, first) per segment, ancestors first;
//                                   length <= 0: unused. Segment position p (start <= p <
//                                   start + length) lives in page pages_flat[first + (p -
//                                   start) / L] at offset (p - start) % L.
//     pages_flat      s32 [Pt]      physical page ids, each segment's pages consecutive
//   -> out [T, N, H] q's dtype, k_pages, v_pages (with this step's k/v written)
//   attrs: scale f32 (score = dot(q, k) * scale), window s32 (> 0: sliding window)
//
// Token t first writes its k/v, then query t attends every key position p of its chain with
// 0 <= p <= positions[t] and, if window > 0, p > positions[t] - window. A position covered by
// several segments of a chain belongs to the first of them; a page id outside [0, P) or a page
// index outside [0, Pt) makes its keys absent. Absent keys are never read. The op writes where
// slot says and reads where the chain says: slot[t] must address positions[t] in chain_of[t]'s
// segments, and real tokens' slots must be distinct (padding tokens may share page 0).
//
// Numerics (DESIGN.md "Numerics contract"): scores are attention dots times scale: the
// canonical order of numerics.h (lane partials, then the butterfly), where each lane partial
// accumulates from +0 by fused multiply-add on CUDA (one rounding per element: half the
// instructions of the two-op form, and attention is bound by them) and by multiply then add on
// the CPU. Keys are processed in tiles of kAttnTile ABSOLUTE positions, [0, 64), [64, 128), ...
// Tile j of a query gives a partial (mt = max score, lt = sum_i e_i, acct = sum_i e_i * v_i)
// with e_i = expf(s_i - mt), summed over the tile's visible keys in increasing position from
// +0 (acct fused on CUDA, mul then add on the CPU; the two agree to ulps). Tiles without a
// visible key are skipped; every CUDA kernel gives the same bits. Partials are merged in increasing
// tile order by MergeFactors; out = acc / l (zero if no key was visible). So a query's bits
// depend only on its q and the k/v at the positions it sees: not on T, its index, the pages,
// the segment split, the step its prefix was written in, or other queries. (Tile partials do
// not depend on earlier tiles, so tree_attention_split.cuh computes them in parallel and keeps
// the bits by merging them in the same order.)
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "cc/common.h"
#include "cc/numerics.h"

namespace prism {

constexpr int kAttnTile = 64;     // keys per softmax tile, on absolute positions
constexpr int kSegFields = 3;     // chain_segments[c, s] = (start, length, first)
constexpr int kMaxAttnHeadDim = 2 * kStride;  // the CUDA kernel keeps H in two lane chunks

struct Dims {
  int64_t t, n, k, h, p, l, c, s, pt;
  int64_t g() const { return n / k; }
  int64_t hp() const { return (h + kStride - 1) / kStride * kStride; }  // lane-major length
};

struct Tables {
  const int32_t *slot, *positions, *chain_of, *segs, *pages_flat;
};

// Row of the pool ([P * L, K, H] viewed as rows of K * H) holding position p of the chain whose
// segment table is seg [S, 3], or -1 when the chain does not hold p.
PRISM_HD int64_t KeyRow(const int32_t* seg, int64_t s_count, const int32_t* pages_flat,
                        int64_t pt, int64_t p_count, int64_t l, int64_t p) {
  if (p < 0) return -1;
  for (int64_t s = 0; s < s_count; ++s) {
    const int64_t start = seg[s * kSegFields], len = seg[s * kSegFields + 1];
    if (len <= 0 || p < start || p >= start + len) continue;
    const int64_t idx = seg[s * kSegFields + 2] + (p - start) / l;
    if (idx < 0 || idx >= pt) return -1;
    const int64_t page = pages_flat[idx];
    if (page < 0 || page >= p_count) return -1;
    return page * l + (p - start) % l;
  }
  return -1;
}

// Whether key position p (held by the chain) is visible to a query at position pos.
PRISM_HD bool KeyVisible(int64_t p, int64_t pos, int32_t window) {
  return p <= pos && (window <= 0 || p > pos - window);
}

// First and last tile a query at pos >= 0 can see keys in.
PRISM_HD int64_t FirstTile(int64_t pos, int32_t window) {
  const int64_t lo = window > 0 ? pos - window + 1 : 0;
  return (lo < 0 ? 0 : lo) / kAttnTile;
}
PRISM_HD int64_t LastTile(int64_t pos) { return pos / kAttnTile; }

// Merging a tile partial (mt, lt, acct) into the running (m, l, acc), both non-empty:
//   m' = max(m, mt); l' = l * a + lt * b; acc' = acc * a + acct * b.
// The first non-empty tile is copied instead (a = 0, b = 1 without evaluating expf).
struct MergeWeights {
  float m, a, b;
};
PRISM_HD MergeWeights MergeFactors(float m, float mt) {
  const float mn = m < mt ? mt : m;
  return {mn, expf(m - mn), expf(mt - mn)};
}
PRISM_HD float Merged(float x, float a, float xt, float b) { return x * a + xt * b; }

// Final normalisation; a query that saw no key outputs exact zeros.
PRISM_HD float Normalised(float acc, float l) { return l == 0.0f ? 0.0f : acc / l; }

// Whether the call writes the step's k/v (k_new has rows) or finds them in the pools already.
inline bool WritesNewRows(const ffi::AnyBuffer& k_new) {
  return k_new.dimensions().size() == 3 && k_new.dimensions()[0] > 0;
}

// Shapes and dtypes of the handler's buffers (a hand-written ffi_call must fail, never read
// out of bounds); fills dm on success.
inline ffi::Error CheckTreeAttentionShapes(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k_new,
                       const ffi::AnyBuffer& v_new, const ffi::AnyBuffer& k_pages,
                       const ffi::AnyBuffer& v_pages, int64_t slot_n, int64_t pos_n,
                       int64_t chain_n, ffi::AnyBuffer::Dimensions seg, int64_t pt, Dims* dm) {
  const std::string op = "prism_tree_attention: ";
  PRISM_REQUIRE(q.dimensions().size() == 3, op + "q must be [T, N, H]");
  PRISM_REQUIRE(k_pages.dimensions().size() == 4, op + "k_pages must be [P, L, K, H]");
  const auto qd = q.dimensions(), pd = k_pages.dimensions();
  *dm = {qd[0], qd[1], pd[2], qd[2], pd[0], pd[1], seg[0], seg[1], pt};
  PRISM_REQUIRE(IsFloatActivation(q.element_type()), op + "q must be float32 or bfloat16");
  PRISM_REQUIRE(IsFloatActivation(k_pages.element_type()),
                op + "k_pages must be float32 or bfloat16");
  PRISM_REQUIRE(pd[3] == dm->h, op + "k_pages must be [P, L, K, H] with q's H");
  PRISM_REQUIRE(dm->h <= kMaxAttnHeadDim, op + "head dim H above 512 is not supported");
  PRISM_REQUIRE(dm->k > 0 && dm->n % dm->k == 0, op + "N must be a multiple of K");
  PRISM_REQUIRE(dm->l > 0, op + "page size L must be positive");
  PRISM_REQUIRE(v_pages.element_type() == k_pages.element_type() &&
                    DimsToString(v_pages.dimensions()) == DimsToString(pd),
                op + "v_pages must match k_pages");
  // k_new and v_new hold the step's T rows, or none when qkv_rope wrote them (WritesNewRows).
  const std::string kv = "[" + std::to_string(dm->t) + ", " + std::to_string(dm->k) + ", " +
                         std::to_string(dm->h) + "]";
  const std::string none = "[0, " + std::to_string(dm->k) + ", " + std::to_string(dm->h) + "]";
  const std::string got = DimsToString(k_new.dimensions());
  for (const ffi::AnyBuffer* b : {&k_new, &v_new}) {
    PRISM_REQUIRE(b->element_type() == k_pages.element_type() &&
                      DimsToString(b->dimensions()) == got && (got == kv || got == none),
                  op + "k_new and v_new must both be " + kv + " (or " + none +
                      ": already in the pools) in the pool's dtype");
  }
  PRISM_REQUIRE(slot_n == dm->t && pos_n == dm->t && chain_n == dm->t,
                op + "slot, positions and chain_of must be [T]");
  PRISM_REQUIRE(seg.size() == 3 && seg[2] == kSegFields, op + "chain_segments must be [C, S, 3]");
  return ffi::Error::Success();
}

}  // namespace prism
