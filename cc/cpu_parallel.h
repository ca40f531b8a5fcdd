// ParallelFor over XLA's CPU thread pool, shared by CPU handlers. Work items must not depend
// on which thread runs them (each writes its own outputs), so results stay bit-identical.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "xla/ffi/api/ffi.h"

namespace prism {

// Runs fn(0 .. n-1) on the caller and up to num_threads helpers; returns when all are done.
// The caller drains items too, so it never waits on a helper that was not scheduled yet.
inline void ParallelFor(xla::ffi::ThreadPool& pool, int64_t n, std::function<void(int64_t)> fn) {
  struct Work {
    std::function<void(int64_t)> fn;
    int64_t n;
    std::atomic<int64_t> next{0}, done{0};
    std::mutex mu;
    std::condition_variable cv;
    void Drain() {
      for (int64_t i; (i = next.fetch_add(1)) < n;) {
        fn(i);
        if (done.fetch_add(1) + 1 == n) {
          std::lock_guard<std::mutex> lock(mu);
          cv.notify_all();
        }
      }
    }
  };
  if (n <= 0) return;
  auto work = std::make_shared<Work>();
  work->fn = std::move(fn);
  work->n = n;
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), n - 1);
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([work] { work->Drain(); });
  work->Drain();
  std::unique_lock<std::mutex> lock(work->mu);
  work->cv.wait(lock, [&] { return work->done.load() == n; });
}

}  // namespace prism
