// A persistent thread pool for the decode loop.
//
// Decode runs a few hundred short parallel regions per token, so dispatch
// must cost well under a microsecond and must never allocate: the pool hands
// workers a function pointer and a context pointer; workers spin briefly on a
// generation counter before sleeping on it with a futex. (Not
// std::atomic::wait: GCC 12's libstdc++ loses wake-ups on 64-bit atomics.)
//
// Work is split into chunks that threads claim one at a time, so a thread
// the OS has descheduled (the machine is shared) delays a region by at most
// the chunk it holds: the others, the caller included, take the rest. A claim
// carries the region's generation, so a worker that wakes late can never run
// a chunk of a region that has already finished.
//
// Optionally each thread is pinned to one CPU (`k3 ... --cpus`): thread t
// (the caller is 0) to cpus[t]. Pinning keeps the scheduler from moving a
// worker onto the core the caller is using, which on a 2-core machine stalls
// every region until one of them is moved back.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "util/status.h"

namespace k3 {

// "0,2,4-7" -> {0, 2, 4, 5, 6, 7} (taskset -c syntax), each CPU one this
// process may run on, none twice; an error names the offending entry.
StatusOr<std::vector<int>> parse_cpu_list(const std::string& text);
// The CPUs this process may run on (sched_getaffinity at start-up), ascending.
std::vector<int> allowed_cpus();

class ThreadPool {
 public:
  // n_threads >= 1 counts the calling thread; n_threads - 1 workers start.
  // With `cpus` (n_threads entries, each allowed: see parse_cpu_list), thread
  // t runs only on cpus[t]; the calling thread is pinned here too, for good.
  explicit ThreadPool(int n_threads, const std::vector<int>& cpus = {});
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  const std::vector<int>& cpus() const { return cpus_; }

  // Calls f(chunk, n_chunks) once for every chunk in [0, n_chunks), on
  // whichever threads claim them, and returns when all have finished.
  template <typename F>
  void run_chunks(int64_t n_chunks, F&& f) {
    if (n_chunks <= 0) return;
    if (n_threads_ == 1 || n_chunks == 1) {
      for (int64_t c = 0; c < n_chunks; ++c) f(c, n_chunks);
      return;
    }
    using Fn = std::remove_reference_t<F>;
    run_raw([](void* ctx, int64_t c, int64_t n) { (*static_cast<Fn*>(ctx))(c, n); },
            const_cast<void*>(static_cast<const void*>(&f)), n_chunks, /*one_per_thread=*/false);
  }

  // f(t, size()) exactly once on each thread t (the caller is 0), all at the
  // same time: for measurements that need every thread busy at once (sysinfo).
  // Unlike run_chunks, this waits for every worker to be scheduled.
  template <typename F>
  void run_on_each_thread(F&& f) {
    if (n_threads_ == 1) {
      f(0, 1);
      return;
    }
    using Fn = std::remove_reference_t<F>;
    run_raw([](void* ctx, int64_t c, int64_t n) { (*static_cast<Fn*>(ctx))(static_cast<int>(c), static_cast<int>(n)); },
            const_cast<void*>(static_cast<const void*>(&f)), n_threads_, /*one_per_thread=*/true);
  }

  // Splits [0, n) into chunks with boundaries at multiples of `align` and
  // calls f(begin, end) for each non-empty chunk.
  template <typename F>
  void parallel_for(int64_t n, int64_t align, F&& f) {
    split_for(n, align, kChunksPerThread, f);
  }

  // As parallel_for, in one chunk per thread. The caller claims first, so
  // with two threads chunk t nearly always runs on thread t, and ops that
  // split the same rows this way read what the op before them wrote from
  // their own core's caches. (Where two cores share no L3, two-thread
  // prefill that handed every activation to the other core took about 40%
  // longer; docs/performance.md.) A late thread's chunk is still claimed by
  // whichever thread is free first.
  template <typename F>
  void parallel_for_even(int64_t n, int64_t align, F&& f) {
    split_for(n, align, 1, f);
  }

  static void split_range(int64_t n, int64_t align, int64_t part, int64_t parts, int64_t& begin, int64_t& end) {
    const int64_t blocks = (n + align - 1) / align;
    begin = std::min(n, blocks * part / parts * align);
    end = std::min(n, blocks * (part + 1) / parts * align);
  }

 private:
  // More chunks than threads lets the others absorb a delayed thread's share;
  // fewer make each thread's weight streams longer and its claims (an atomic
  // on a line both cores write) rarer. Two per thread, measured on int8
  // k3-base decode (docs/performance.md, "Chunks per thread"): 4 -> 2 took
  // the median step from 7.53 to 7.02 ms; 1 gave 6.68 ms but leaves a
  // descheduled thread's whole half to wait for.
  static constexpr int kChunksPerThread = 2;
  // The low half of a finished region's ticket: no region has this many chunks.
  static constexpr uint32_t kClosed = 0xffffffffu;
  using RawFn = void (*)(void*, int64_t, int64_t);
  // parallel_for with at most per_thread chunks per thread.
  template <typename F>
  void split_for(int64_t n, int64_t align, int per_thread, F& f) {
    if (n <= 0) return;
    const int64_t blocks = (n + align - 1) / align;
    run_chunks(std::min<int64_t>(blocks, int64_t{per_thread} * n_threads_), [&](int64_t c, int64_t nc) {
      int64_t begin, end;
      split_range(n, align, c, nc, begin, end);
      if (begin < end) f(begin, end);
    });
  }
  void run_raw(RawFn fn, void* ctx, int64_t n_chunks, bool one_per_thread);
  void worker_loop(int index);
  void wake_all();
  // Claims and runs chunks of the region with generation `gen` until none
  // are left (one, run as chunk `self`, in run_on_each_thread's regions);
  // self is the calling thread's index (the caller is 0).
  void drain(uint32_t gen, int self);

  int n_threads_;
  std::vector<int> cpus_;
  std::vector<std::thread> workers_;
  // Region state, published by the release store of ticket_. Each group
  // below has its own cache line, so that what the idle workers spin on
  // (generation_) is not the line the caller is writing the next region's
  // description into, nor the lines the claims and completions bounce
  // between the cores (bench_thread_pool, bm_empty_region).
  alignas(64) std::atomic<RawFn> fn_{nullptr};
  std::atomic<void*> ctx_{nullptr};
  std::atomic<int64_t> n_chunks_{0};
  std::atomic<bool> one_per_thread_{false};
  std::atomic<bool> stop_{false};
  alignas(64) std::atomic<uint32_t> generation_{0};  // futex word workers sleep on
  std::atomic<int> sleepers_{0};
  alignas(64) std::atomic<uint64_t> ticket_{0};  // generation << 32 | next chunk to claim
  alignas(64) std::atomic<int64_t> done_{0};     // chunks finished in the current region
};

}  // namespace k3
