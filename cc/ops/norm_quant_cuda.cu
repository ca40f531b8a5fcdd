// RMSNorm custom calls on CUDA; the specification is norm_quant_cpu.cc and the results are
// bit-identical to it. Shapes: M rows, D model dim.
//   prism_rmsnorm            x [M, D], gamma [D]            -> y [M, D] (x's dtype)
//   prism_rmsnorm_quant      x [M, D], gamma [D]            -> x_q s8 [M, D], s_x f32 [M]
//   prism_add_rmsnorm_quant  x, residual [M, D], gamma [D]  -> x_q, s_x, h = x + residual
// Rows of D <= kMaxRegChunks * kStride (5376 included) take NormRegRowsKernel: one warp per row,
// the row in registers, one read and one write of every element. Longer rows (or
// PRISM_RMSNORM_KERNEL=block) take NormRowsKernel, one block per row (width: RowBlockThreads):
// the block stages the row's h in shared memory (f32, D <= kMaxStagedD); warp 0 then takes the
// sum of squares in the canonical order (the only order-sensitive step) from shared memory; the
// whole block normalises, takes the (exact) amax and quantises, recomputing y rather than
// keeping it. Longer rows skip the staging: warp 0 streams the row from global memory and later
// passes read h back. Both compute the same bits.
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>

#include "cc/common.h"
#include "cc/cuda_common.cuh"
#include "cc/numerics.h"

namespace prism {
namespace {

constexpr int kMaxThreads = 1024;
constexpr int kStreamThreads = 256;  // unstaged rows: fewer, fatter threads leave registers for
                                     // the unrolled sum of warp 0
// Longest row staged in (dynamic) shared memory: f32, within the 48 KiB needing no opt-in.
constexpr int64_t kMaxStagedD = 12032;  // a multiple of kVec

// One launch's pointers; null pointers switch parts off, as in the CPU's NormRows. h may alias
// x or residual, and y may alias x (in-place updates): each element is read, then written, by
// one thread, and later passes read only shared memory or h, so no __restrict__ here.
template <typename T>
struct NormArgs {
  const T* x;
  const T* residual;
  const float* gamma;
  T* h;
  T* y;
  int8_t* q;
  float* s;
  int64_t d;
  float eps;
  float weight_offset;
};

// The value the CPU normalises when there is a residual: x + residual rounded to T.
template <typename T>
__device__ __forceinline__ float RoundToStorage(float v) {
  T stored;
  FromF32(v, &stored);
  return ToF32(stored);
}

// The value the row normalises, for elements i0 .. i0 + cnt - 1 of the whole [M, D] array: x,
// or x + residual rounded to T, which is also written to h.
template <typename T>
__device__ __forceinline__ void LoadH(const NormArgs<T>& a, int64_t i0, int cnt,
                                      float (&v)[kVec]) {
  LoadChunk(a.x + i0, cnt, v);
  if (a.residual == nullptr) return;
  float rv[kVec];
  LoadChunk(a.residual + i0, cnt, rv);
#pragma unroll
  for (int i = 0; i < kVec; ++i) v[i] = RoundToStorage<T>(__fadd_rn(v[i], rv[i]));
  StoreChunk(a.h + i0, cnt, v);
}

// Whole block: the row's h into shared memory (f32; exact for both dtypes). The row is padded
// to whole chunks and the tail chunk is stored whole (zeros past D): the compiler may widen a
// partial chunk's guarded loads into a vector load, which must stay inside the allocation.
template <typename T>
__device__ void StageRow(const NormArgs<T>& a, int64_t off, float* row) {
  for (int64_t d0 = static_cast<int64_t>(threadIdx.x) * kVec; d0 < a.d;
       d0 += static_cast<int64_t>(blockDim.x) * kVec) {
    float v[kVec];
    LoadH(a, off + d0, ChunkCount(d0, a.d), v);  // v[i] = 0 past the row's end
#pragma unroll
    for (int i = 0; i < kVec; ++i) row[d0 + i] = v[i];
  }
}

// Warp 0: canonical sum of h^2, from the staged row or streamed from global memory.
template <typename T, bool kStaged>
__device__ float SumSquares(const NormArgs<T>& a, const float* row, int64_t off, int lane) {
  return WarpCanonicalSum(a.d, lane, [&](int64_t d0, int cnt, float (&t)[kVec]) {
    if constexpr (kStaged) {
      LoadChunk(row + d0, cnt, t);
    } else {
      LoadH(a, off + d0, cnt, t);
    }
#pragma unroll
    for (int i = 0; i < kVec; ++i) t[i] = __fmul_rn(t[i], t[i]);
  });
}

// y = (h * inv) * (weight_offset + gamma) for one chunk, as NormRow does.
template <typename T, typename S>
__device__ __forceinline__ void NormChunk(const S* src, const NormArgs<T>& a, int64_t d0,
                                          int cnt, float inv, float (&y)[kVec]) {
  float g[kVec];
  LoadChunk(src + d0, cnt, y);
  LoadChunk(a.gamma + d0, cnt, g);
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    y[i] = __fmul_rn(__fmul_rn(y[i], inv), __fadd_rn(a.weight_offset, g[i]));
  }
}

// Passes after the sum: write y, or amax then codes. src is the row's h (shared f32 or global
// T); outputs start at element off of the [M, D] arrays. stage (the shared row, or null) keeps
// y between the amax and code passes so gamma is read once; each thread owns the same chunks
// in every pass, so overwriting h there races with nothing.
template <typename T, typename S>
__device__ void NormalizeRow(const NormArgs<T>& a, const S* src, int64_t off, float inv,
                             float* stage, float* scratch) {
  const int64_t first = static_cast<int64_t>(threadIdx.x) * kVec;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * kVec;
  float y[kVec];
  if (a.y != nullptr) {
    for (int64_t d0 = first; d0 < a.d; d0 += stride) {
      const int cnt = ChunkCount(d0, a.d);
      NormChunk(src, a, d0, cnt, inv, y);
      StoreChunk(a.y + off + d0, cnt, y);
    }
  }
  if (a.q == nullptr) return;
  float amax = 0.0f;
  for (int64_t d0 = first; d0 < a.d; d0 += stride) {
    const int cnt = ChunkCount(d0, a.d);
    NormChunk(src, a, d0, cnt, inv, y);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {  // unrolled: keeps y in registers
      if (i < cnt) amax = fmaxf(amax, fabsf(y[i]));
      if (stage != nullptr) stage[d0 + i] = y[i];  // whole chunk: zeros past D
    }
  }
  amax = BlockMax(amax, scratch);
  const float qinv = QuantInverse(amax);
  for (int64_t d0 = first; d0 < a.d; d0 += stride) {
    const int cnt = ChunkCount(d0, a.d);
    if (stage != nullptr) {
      LoadChunk(stage + d0, cnt, y);
    } else {
      NormChunk(src, a, d0, cnt, inv, y);
    }
    int8_t codes[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) codes[i] = QuantCode(y[i], qinv);
    StoreCodes(a.q + off + d0, cnt, codes);
  }
  if (threadIdx.x == 0) a.s[blockIdx.x] = QuantScale(amax);
}

template <typename T, bool kStaged>
__global__ void __launch_bounds__(kStaged ? kMaxThreads : kStreamThreads)
    NormRowsKernel(NormArgs<T> a) {
  extern __shared__ __align__(16) float row[];  // kStaged: the row's h, D rounded up to kVec
  __shared__ float inv_shared;
  __shared__ float scratch[kMaxThreads / kWarpSize];
  const int64_t off = static_cast<int64_t>(blockIdx.x) * a.d;
  if constexpr (kStaged) {
    StageRow(a, off, row);
    __syncthreads();
  }
  if (threadIdx.x < kWarpSize) {
    const float ss = SumSquares<T, kStaged>(a, row, off, static_cast<int>(threadIdx.x));
    if (threadIdx.x == 0) inv_shared = InverseRms(ss, a.d, a.eps);
  }
  __syncthreads();  // publishes inv and, unstaged add_rmsnorm, warp 0's writes of h
  if constexpr (kStaged) {
    NormalizeRow(a, static_cast<const float*>(row), off, inv_shared, row, scratch);
  } else {  // h holds the rounded sum when there is a residual
    NormalizeRow(a, (a.residual != nullptr ? a.h : a.x) + off, off, inv_shared, nullptr, scratch);
  }
}

// The fast path, rows of D <= kMaxRegChunks * kStride (Gemma-3 27B's 5376 included): one warp
// per row, the whole row in registers. Lane l holds its canonical chunks d0 = l * kVec + c *
// kStride, c < kChunks, so the sum of squares is each lane's chunks in increasing d and then the
// butterfly: exactly WarpCanonicalSum, hence the CPU's bits and NormRowsKernel's. Every input
// element is read once and every output written once, with no shared memory and no barrier
// (the old kernel's dependent passes over global or shared memory, each behind __syncthreads,
// left a 5376-long row latency-bound at ~17 us). Phases keep loads and stores apart, so the
// compiler can issue all of a phase's loads at once (h may alias x, so a store would pin every
// later load behind it): x (and residual) -> h; store h; sum; y and amax (gamma loads); store.
constexpr int kMaxRegChunks = 21;  // 168 f32 of y per lane (255 registers; kFull spills a few)
constexpr int kRegWarps = 4;       // rows per block when the grid has rows to spare

// Full, 16-byte-aligned chunks (kFull rows): unconditional vector accesses. No branch or
// select waits on a load, so all of a phase's loads are in flight together (a guarded load
// whose result is merged at a join stalls there: one round trip per chunk).
__device__ __forceinline__ void LoadVec(const float* p, float (&v)[kVec]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0];
  const float4 b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
  v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

__device__ __forceinline__ void StoreVec(float* p, const float (&v)[kVec]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

__device__ __forceinline__ void StoreVec(uint16_t* p, const float (&v)[kVec]) {
  uint32_t w[kVec / 2];
#pragma unroll
  for (int i = 0; i < kVec / 2; ++i) {  // FromF32's rounding; element 2i in the low half
    w[i] = static_cast<uint32_t>(F32ToBf16(v[2 * i])) |
           (static_cast<uint32_t>(F32ToBf16(v[2 * i + 1])) << 16);
  }
  *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
}

// One chunk of h in registers in T's storage format (bf16: two per register, so a row's h takes
// half the registers until y replaces it). Elements past the row's end hold +0.
template <typename T>
struct RegChunk;

template <>
struct RegChunk<float> {
  float v[kVec];
  __device__ __forceinline__ void Load(const float* p, int cnt) { LoadChunk(p, cnt, v); }
  __device__ __forceinline__ void LoadFull(const float* p) { LoadVec(p, v); }
  __device__ __forceinline__ float Get(int i) const { return v[i]; }
  __device__ __forceinline__ void SetRounded(int i, float f) { v[i] = f; }  // f32: exact
};

template <>
struct RegChunk<uint16_t> {
  uint32_t w[kVec / 2];  // little-endian pairs: element 2i is the low half, as in LoadChunk
  __device__ __forceinline__ void Load(const uint16_t* p, int cnt) {
    if (cnt == kVec && Aligned16(p)) {
      const uint4 u = *reinterpret_cast<const uint4*>(p);
      w[0] = u.x, w[1] = u.y, w[2] = u.z, w[3] = u.w;
      return;
    }
#pragma unroll
    for (int i = 0; i < kVec / 2; ++i) {
      const uint32_t lo = 2 * i < cnt ? p[2 * i] : 0u, hi = 2 * i + 1 < cnt ? p[2 * i + 1] : 0u;
      w[i] = lo | (hi << 16);
    }
  }
  __device__ __forceinline__ void LoadFull(const uint16_t* p) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    w[0] = u.x, w[1] = u.y, w[2] = u.z, w[3] = u.w;
  }
  __device__ __forceinline__ float Get(int i) const {
    return Bf16ToF32(static_cast<uint16_t>(w[i / 2] >> (16 * (i % 2))));
  }
  // Stores f rounded to bf16 (F32ToBf16, so Get returns RoundToStorage<uint16_t>(f)).
  __device__ __forceinline__ void SetRounded(int i, float f) {
    const uint32_t b = F32ToBf16(f), shift = 16 * (i % 2);
    w[i / 2] = (w[i / 2] & ~(0xffffu << shift)) | (b << shift);
  }
};

// kFull: D % kVec == 0 and every pointer 16-byte aligned, so a chunk is whole or absent; an
// absent chunk loads the row's first chunk instead (valid memory, never used: sums, amax and
// stores skip it), which keeps the loads unconditional. Otherwise guarded loads (odd rows).
template <typename T, int kChunks, bool kFull>
__global__ void __launch_bounds__(kRegWarps * kWarpSize)
    NormRegRowsKernel(NormArgs<T> a, int64_t m) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) +
                    threadIdx.x / kWarpSize;
  if (r >= m) return;  // uniform per warp; no block barrier follows
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const int64_t first = static_cast<int64_t>(lane) * kVec;  // chunk c starts at first + c*kStride
  const int64_t off = r * a.d;
  int cnt[kChunks];     // elements of chunk c present in the row (0 past its end)
  int64_t at[kChunks];  // where chunk c is read (kFull: 0 for an absent chunk)
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t d0 = first + static_cast<int64_t>(c) * kStride;
    cnt[c] = d0 < a.d ? ChunkCount(d0, a.d) : 0;
    at[c] = kFull && cnt[c] == 0 ? 0 : d0;
  }
  // Loads only until every x and residual chunk is in flight.
  RegChunk<T> h[kChunks] = {};
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    if constexpr (kFull) {
      h[c].LoadFull(a.x + off + at[c]);
    } else if (cnt[c] > 0) {
      h[c].Load(a.x + off + at[c], cnt[c]);
    }
  }
  if (a.residual != nullptr) {  // h = x + residual rounded to T, as LoadH
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      RegChunk<T> rv = {};
      if constexpr (kFull) {
        rv.LoadFull(a.residual + off + at[c]);
      } else if (cnt[c] > 0) {
        rv.Load(a.residual + off + at[c], cnt[c]);
      }
#pragma unroll
      for (int i = 0; i < kVec; ++i) h[c].SetRounded(i, __fadd_rn(h[c].Get(i), rv.Get(i)));
    }
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      float v[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) v[i] = h[c].Get(i);
      if (cnt[c] == 0) continue;
      if constexpr (kFull) {
        StoreVec(a.h + off + at[c], v);
      } else {
        StoreChunk(a.h + off + at[c], cnt[c], v);
      }
    }
  }
  float acc = 0.0f;  // the lane's canonical partial: its elements in increasing d
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      if (i < cnt[c]) acc = __fadd_rn(acc, __fmul_rn(h[c].Get(i), h[c].Get(i)));
    }
  }
  const float inv = InverseRms(WarpButterflySum(acc), a.d, a.eps);
  float y[kChunks][kVec];  // y = (h * inv) * (weight_offset + gamma), as NormChunk
  float amax = 0.0f;       // exact, so any order; only elements of the row
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    float g[kVec] = {};
    if constexpr (kFull) {
      LoadVec(a.gamma + at[c], g);
    } else if (cnt[c] > 0) {
      LoadChunk(a.gamma + at[c], cnt[c], g);
    }
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      y[c][i] = __fmul_rn(__fmul_rn(h[c].Get(i), inv), __fadd_rn(a.weight_offset, g[i]));
      if (i < cnt[c]) amax = fmaxf(amax, fabsf(y[c][i]));
    }
  }
  if (a.y != nullptr) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      if (cnt[c] == 0) continue;
      if constexpr (kFull) {
        StoreVec(a.y + off + at[c], y[c]);
      } else {
        StoreChunk(a.y + off + at[c], cnt[c], y[c]);
      }
    }
  }
  if (a.q == nullptr) return;
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o /= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, o));
  }
  const float qinv = QuantInverse(amax);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    int8_t codes[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) codes[i] = QuantCode(y[c][i], qinv);
    if (cnt[c] > 0) StoreCodes(a.q + off + at[c], cnt[c], codes);
  }
  if (lane == 0) a.s[r] = QuantScale(amax);
}

// Whether every chunk of every row is whole and 16-byte aligned (int8 codes: 8-byte).
template <typename T>
bool FullChunks(const NormArgs<T>& a) {
  auto ok = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  return a.d % kVec == 0 && ok(a.x) && ok(a.residual) && ok(a.gamma) && ok(a.h) && ok(a.y) &&
         ok(a.q);
}

template <typename T, int kChunks>
void LaunchRegRows(cudaStream_t stream, int64_t m, const NormArgs<T>& a) {
  // Up to ~2 rows per SM (132 on an H200) one warp per block, so the rows spread over every SM
  // (M = 256 in 64 blocks of 4 would leave half of them idle); more rows, kRegWarps per block.
  constexpr int64_t kFewRows = 512;
  const int warps = m <= kFewRows ? 1 : kRegWarps;
  const unsigned grid = static_cast<unsigned>(CeilDiv(m, warps));
  if (FullChunks(a)) {
    NormRegRowsKernel<T, kChunks, true><<<grid, warps * kWarpSize, 0, stream>>>(a, m);
  } else {
    NormRegRowsKernel<T, kChunks, false><<<grid, warps * kWarpSize, 0, stream>>>(a, m);
  }
}

// Register chunks per lane for a row of d (<= kMaxRegChunks * kStride): the smallest
// instantiated count that holds it. Absent chunks cost registers, never memory traffic.
template <typename T>
void LaunchRegRowsFor(cudaStream_t stream, int64_t m, const NormArgs<T>& a) {
  const int64_t chunks = CeilDiv(a.d, kStride);
  if (chunks <= 1) return LaunchRegRows<T, 1>(stream, m, a);
  if (chunks <= 2) return LaunchRegRows<T, 2>(stream, m, a);
  if (chunks <= 3) return LaunchRegRows<T, 3>(stream, m, a);
  if (chunks <= 4) return LaunchRegRows<T, 4>(stream, m, a);
  if (chunks <= 6) return LaunchRegRows<T, 6>(stream, m, a);
  if (chunks <= 8) return LaunchRegRows<T, 8>(stream, m, a);
  if (chunks <= 12) return LaunchRegRows<T, 12>(stream, m, a);
  if (chunks <= 16) return LaunchRegRows<T, 16>(stream, m, a);
  return LaunchRegRows<T, kMaxRegChunks>(stream, m, a);
}

// PRISM_RMSNORM_KERNEL=block (tests and benchmarks) forces the one-block-per-row kernel for
// D > kStride, the only path before the register kernel; shorter rows always take the latter.
bool BlockKernelForced() {
  const char* name = std::getenv("PRISM_RMSNORM_KERNEL");
  return name != nullptr && std::string(name) == "block";
}

template <typename T>
ffi::Error Launch(cudaStream_t stream, int64_t m, const NormArgs<T>& a, const char* op) {
  if (m == 0) return ffi::Error::Success();
  PRISM_REQUIRE(m <= 0x7fffffff, std::string(op) + ": too many rows for one grid");
  const unsigned grid = static_cast<unsigned>(m);
  if (a.d <= kStride || (a.d <= kMaxRegChunks * kStride && !BlockKernelForced())) {
    LaunchRegRowsFor(stream, m, a);
  } else if (a.d <= kMaxStagedD) {
    const int threads = RowBlockThreads(m, a.d);
    const size_t smem = static_cast<size_t>(CeilDiv(a.d, kVec) * kVec) * sizeof(float);
    NormRowsKernel<T, true><<<grid, threads, smem, stream>>>(a);
  } else {
    NormRowsKernel<T, false><<<grid, kStreamThreads, 0, stream>>>(a);
  }
  return LaunchStatus(op);
}

ffi::Error CheckRows(const ffi::AnyBuffer& x, const ffi::BufferR1<ffi::F32>& gamma,
                     const char* op) {
  const std::string name(op);
  PRISM_REQUIRE(x.dimensions().size() == 2, name + ": x must be [M, D]");
  PRISM_REQUIRE(IsFloatActivation(x.element_type()), name + ": x must be float32 or bfloat16");
  PRISM_REQUIRE(gamma.dimensions()[0] == x.dimensions()[1], name + ": gamma must be [D]");
  return ffi::Error::Success();
}

// Builds NormArgs<T> from raw buffers; absent parts are null.
template <typename T>
NormArgs<T> MakeArgs(const ffi::AnyBuffer& x, const ffi::AnyBuffer* residual,
                     const ffi::BufferR1<ffi::F32>& gamma, void* h, void* y, int8_t* q,
                     float* s, float eps, float weight_offset) {
  return NormArgs<T>{x.reinterpret_data<T>(),
                     residual != nullptr ? residual->reinterpret_data<T>() : nullptr,
                     gamma.typed_data(),
                     static_cast<T*>(h),
                     static_cast<T*>(y),
                     q,
                     s,
                     x.dimensions()[1],
                     eps,
                     weight_offset};
}

// Dispatches on x's dtype (f32 or bf16 stored as uint16_t).
ffi::Error Run(cudaStream_t stream, const ffi::AnyBuffer& x, const ffi::AnyBuffer* residual,
               const ffi::BufferR1<ffi::F32>& gamma, void* h, void* y, int8_t* q, float* s,
               float eps, float weight_offset, const char* op) {
  const int64_t m = x.dimensions()[0];
  if (x.element_type() == ffi::DataType::F32) {
    return Launch(stream, m, MakeArgs<float>(x, residual, gamma, h, y, q, s, eps, weight_offset),
                  op);
  }
  return Launch(stream, m, MakeArgs<uint16_t>(x, residual, gamma, h, y, q, s, eps, weight_offset),
                op);
}

ffi::Error RmsNormCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::BufferR1<ffi::F32> gamma,
                       ffi::Result<ffi::AnyBuffer> y, float eps, float weight_offset) {
  if (auto e = CheckRows(x, gamma, "prism_rmsnorm"); e.failure()) return e;
  PRISM_REQUIRE(y->element_type() == x.element_type(), "prism_rmsnorm: y must have x's dtype");
  return Run(stream, x, nullptr, gamma, nullptr, y->untyped_data(), nullptr, nullptr, eps,
             weight_offset, "prism_rmsnorm");
}

ffi::Error RmsNormQuantCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::BufferR1<ffi::F32> gamma,
                            ffi::Result<ffi::BufferR2<ffi::S8>> x_q,
                            ffi::Result<ffi::BufferR1<ffi::F32>> s_x, float eps,
                            float weight_offset) {
  if (auto e = CheckRows(x, gamma, "prism_rmsnorm_quant"); e.failure()) return e;
  return Run(stream, x, nullptr, gamma, nullptr, nullptr, x_q->typed_data(), s_x->typed_data(),
             eps, weight_offset, "prism_rmsnorm_quant");
}

ffi::Error AddRmsNormQuantCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer residual,
                               ffi::BufferR1<ffi::F32> gamma,
                               ffi::Result<ffi::BufferR2<ffi::S8>> x_q,
                               ffi::Result<ffi::BufferR1<ffi::F32>> s_x,
                               ffi::Result<ffi::AnyBuffer> h, float eps, float weight_offset) {
  if (auto e = CheckRows(x, gamma, "prism_add_rmsnorm_quant"); e.failure()) return e;
  PRISM_REQUIRE(residual.element_type() == x.element_type() &&
                    residual.element_count() == x.element_count(),
                "prism_add_rmsnorm_quant: residual must match x in shape and dtype");
  return Run(stream, x, &residual, gamma, h->untyped_data(), nullptr, x_q->typed_data(),
             s_x->typed_data(), eps, weight_offset, "prism_add_rmsnorm_quant");
}

}  // namespace
}  // namespace prism

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismRmsNormCuda, prism::RmsNormCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()              // x [M, D] f32|bf16
                                  .Arg<ffi::BufferR1<ffi::F32>>()    // gamma [D]
                                  .Ret<ffi::AnyBuffer>()              // y [M, D] x's dtype
                                  .Attr<float>("eps")
                                  .Attr<float>("weight_offset"),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismRmsNormQuantCuda, prism::RmsNormQuantCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()              // x [M, D] f32|bf16
                                  .Arg<ffi::BufferR1<ffi::F32>>()    // gamma [D]
                                  .Ret<ffi::BufferR2<ffi::S8>>()     // x_q [M, D]
                                  .Ret<ffi::BufferR1<ffi::F32>>()    // s_x [M]
                                  .Attr<float>("eps")
                                  .Attr<float>("weight_offset"),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismAddRmsNormQuantCuda, prism::AddRmsNormQuantCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()              // x [M, D] f32|bf16
                                  .Arg<ffi::AnyBuffer>()              // residual [M, D]
                                  .Arg<ffi::BufferR1<ffi::F32>>()    // gamma [D]
                                  .Ret<ffi::BufferR2<ffi::S8>>()     // x_q [M, D]
                                  .Ret<ffi::BufferR1<ffi::F32>>()    // s_x [M]
                                  .Ret<ffi::AnyBuffer>()              // h = x + residual
                                  .Attr<float>("eps")
                                  .Attr<float>("weight_offset"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
