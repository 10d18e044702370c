// A persistent thread pool for the decode loop.
//
// Decode runs a few hundred short parallel regions per token, so dispatch
// must cost well under a microsecond and must never allocate: the pool hands
// workers a function pointer and a context pointer, workers spin briefly on a
// generation counter before sleeping on it with a futex. (Not std::atomic::wait:
// GCC 12's libstdc++ loses wake-ups on 64-bit atomics, seen here as a hang.)
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace k3 {

class ThreadPool {
 public:
  // n_threads >= 1 counts the calling thread; n_threads - 1 workers start.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs f(thread_index, n_threads) on every thread (the caller is index 0)
  // and returns when all have finished.
  template <typename F>
  void run(F&& f) {
    if (n_threads_ == 1) {
      f(0, 1);
      return;
    }
    using Fn = std::remove_reference_t<F>;
    run_raw([](void* ctx, int t, int n) { (*static_cast<Fn*>(ctx))(t, n); }, const_cast<void*>(static_cast<const void*>(&f)));
  }

  // Splits [0, n) into one contiguous chunk per thread, boundaries rounded to
  // multiples of `align`, and calls f(begin, end) for each non-empty chunk.
  template <typename F>
  void parallel_for(int64_t n, int64_t align, F&& f) {
    if (n <= 0) return;
    run([&](int t, int nt) {
      int64_t begin, end;
      split_range(n, align, t, nt, begin, end);
      if (begin < end) f(begin, end);
    });
  }

  static void split_range(int64_t n, int64_t align, int t, int nt, int64_t& begin, int64_t& end) {
    const int64_t blocks = (n + align - 1) / align;
    begin = std::min(n, blocks * t / nt * align);
    end = std::min(n, blocks * (t + 1) / nt * align);
  }

 private:
  using RawFn = void (*)(void*, int, int);
  void run_raw(RawFn fn, void* ctx);
  void worker_loop(int index);
  void wake_all();

  int n_threads_;
  std::vector<std::thread> workers_;
  RawFn fn_ = nullptr;
  void* ctx_ = nullptr;
  std::atomic<uint32_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<int> sleepers_{0};  // workers in (or entering) futex wait
  std::atomic<bool> stop_{false};
};

}  // namespace k3
