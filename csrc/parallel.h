// A minimal fork-join parallel_for over the host cores for batch work.
//
// A small persistent pool rather than linking OpenMP: torch ships its own
// OpenMP runtime and two runtimes in one process oversubscribe the cores (a
// training process can hand the work to torch's runtime instead, below). Threads
// claim blocks from a shared counter, so a core that is busy with other work
// slows the call down by its own share only. Batches below `min_chunk`
// elements per thread run inline on the caller, and so does a call that finds
// the pool busy with another call.
#pragma once

#include <stdint.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <thread>
#include <vector>

namespace recstore {

int num_threads();
void set_num_threads(int n);  // n <= 0 restores the default (all hardware threads)

// Runs job on the caller and `helpers` pool threads at once; returns when all finish.
void run_on_pool(int helpers, const std::function<void()>& job);

// Starts the pool now if it is not running. Its threads keep the scheduling
// priority of the thread that started them, so a process that also runs
// work on lowered-priority threads starts it from a normal one first.
void start_pool();

// A training process: after each of torch's parallel ops its OpenMP threads
// spin for a while before they sleep, on the very cores this pool's helpers
// need, so a batch of engine work right after one (an update after backward's
// kernels) ran at about one core's speed. Shared, parallel_for hands its work
// to the calling thread's OpenMP team (the libgomp already loaded, found by
// name; never a second runtime), whose spinning threads take it at once.
// Returns whether it is shared now: false without a loaded libgomp, and after
// share=false. A process forked after sharing uses the pool again.
bool share_process_openmp(bool share);
bool shares_process_openmp();

// Calls fn(begin, end) on disjoint ranges covering [0, n). fn must not throw.
template <class Fn>
void parallel_for(int64_t n, int64_t min_chunk, Fn&& fn) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(1, min_chunk);
  int64_t t = std::min<int64_t>(num_threads(), std::max<int64_t>(1, n / min_chunk));
  if (t <= 1) {
    fn(int64_t{0}, n);
    return;
  }
  // About eight blocks per thread, none smaller than min_chunk.
  const int64_t block = std::max(min_chunk, (n + 8 * t - 1) / (8 * t));
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (;;) {
      int64_t b = next.fetch_add(block, std::memory_order_relaxed);
      if (b >= n) return;
      fn(b, std::min(n, b + block));
    }
  };
  run_on_pool(static_cast<int>(t - 1), work);
}

}  // namespace recstore
