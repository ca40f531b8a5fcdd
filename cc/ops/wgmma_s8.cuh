// Hopper warpgroup MMA (wgmma) on int8, both operands in shared memory, for the TMA-fed GEMM
// kernel (int8_gemm_tma.cu). sm_90a only; included only by .cu files.
//
// Both operands are K-major tiles exactly as the TMA writes them with the 128-byte swizzle: a
// row of 128 K bytes each, 8-row groups 1024 bytes apart, the group 1024-byte aligned. That is
// wgmma's canonical K-major SW128 layout, so a descriptor names a tile by its address; a k32
// step inside the 128-byte row advances the address by 32 bytes (the hardware applies the
// swizzle to the final address, as CUTLASS's descriptor iterator relies on).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace prism {

// Descriptor of a K-major, 128-byte-swizzled int8 tile at shared address `addr` (bits: start
// address >> 4 [0, 14), leading byte offset >> 4 [16, 30) (unused by swizzled K-major: 1),
// stride byte offset >> 4 [32, 46) (1024 bytes between 8-row groups), layout [62, 64): 1 =
// 128-byte swizzle).
__device__ __forceinline__ uint64_t WgmmaDescSw128(uint32_t addr) {
  return static_cast<uint64_t>((addr >> 4) & 0x3fffu) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

// Orders this thread's register accesses before the warpgroup's next wgmma.
__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}

__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

// Waits until at most kPending committed groups of this warpgroup are still running.
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// d (64 x N int32, the warpgroup's fragment) += A (64 x 32) . B (N x 32)^T, exact. Fragment:
// thread t of the warpgroup, warp v = t / 32, lane l: d[r] is row 16 v + l / 4 + 8 ((r / 2) % 2),
// column 8 (r / 4) + 2 (l % 4) + r % 2.
template <int kN>
__device__ __forceinline__ void WgmmaS8(int32_t (&d)[kN / 2], uint64_t a, uint64_t b);

template <>
__device__ __forceinline__ void WgmmaS8<16>(int32_t (&d)[8], uint64_t a, uint64_t b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n16k32.s32.s8.s8 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, 1;"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]),
        "+r"(d[7])
      : "l"(a), "l"(b));
}

template <>
__device__ __forceinline__ void WgmmaS8<32>(int32_t (&d)[16], uint64_t a, uint64_t b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n32k32.s32.s8.s8 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, 1;"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]),
        "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]),
        "+r"(d[14]), "+r"(d[15])
      : "l"(a), "l"(b));
}

template <>
__device__ __forceinline__ void WgmmaS8<64>(int32_t (&d)[32], uint64_t a, uint64_t b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, 1;"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]),
        "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]),
        "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]),
        "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]),
        "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
      : "l"(a), "l"(b));
}

}  // namespace prism
