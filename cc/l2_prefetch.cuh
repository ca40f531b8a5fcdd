// PrefetchL2: an L2 prefetch hint over a byte range, for kernels whose next loads are known
// before they are issued. Included only by .cu files (through the kernels' headers).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace prism {

// Asks the L2 to fetch the bytes [p, p + bytes) ahead of their loads (sm_90's bulk prefetch,
// one instruction per 64 KB): a hint with no result and no ordering, so it never changes a
// value, only when a later load finds its line. The range is rounded inward to 16 bytes, as
// the instruction requires; nothing is asked below sm_90.
constexpr int64_t kPrefetchPiece = 64 << 10;
__device__ __forceinline__ void PrefetchL2(const void* p, int64_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t lo = (a + 15) & ~uintptr_t{15};
  const uintptr_t hi = (a + static_cast<uintptr_t>(bytes > 0 ? bytes : 0)) & ~uintptr_t{15};
  for (uintptr_t x = lo; x < hi; x += kPrefetchPiece) {
    const uintptr_t piece = kPrefetchPiece, left = hi - x;
    const unsigned size = static_cast<unsigned>(left < piece ? left : piece);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(x), "r"(size) : "memory");
  }
#else
  (void)p;
  (void)bytes;
#endif
}

}  // namespace prism
