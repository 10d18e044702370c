// ThreadPool: spin-then-sleep workers driven by a generation counter.
#include "runtime/thread_pool.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>

namespace k3 {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Spin iterations before a worker sleeps. Between two regions of one decode
// step the gap is microseconds, so workers should still be spinning; between
// steps or requests they go to sleep and stop burning the core.
constexpr int kSpinIterations = 1 << 16;

void futex_wait(std::atomic<uint32_t>* addr, uint32_t expected) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}

void futex_wake(std::atomic<uint32_t>* addr) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

void ThreadPool::wake_all() {
  // seq_cst on both sides (generation bump here, sleepers_ increment then
  // generation re-check in the worker) means a worker either sees the new
  // generation or is counted here and woken.
  if (sleepers_.load(std::memory_order_seq_cst) > 0) futex_wake(&generation_);
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  workers_.reserve(static_cast<size_t>(n_threads_ - 1));
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  futex_wake(&generation_);
  for (auto& w : workers_) w.join();
}

void ThreadPool::run_raw(RawFn fn, void* ctx) {
  fn_ = fn;
  ctx_ = ctx;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  wake_all();
  fn(ctx, 0, n_threads_);
  int spins = 0;
  while (pending_.load(std::memory_order_acquire) != 0) {
    if (++spins < kSpinIterations) cpu_relax();
    else std::this_thread::yield();
  }
}

void ThreadPool::worker_loop(int index) {
  // Generation 0 is the value at construction: a worker that starts late
  // must still see every bump since then (including the destructor's).
  uint32_t seen = 0;
  for (;;) {
    int spins = 0;
    uint32_t g;
    while ((g = generation_.load(std::memory_order_acquire)) == seen) {
      if (++spins < kSpinIterations) {
        cpu_relax();
      } else {
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        if (generation_.load(std::memory_order_seq_cst) == seen) futex_wait(&generation_, seen);
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
        spins = 0;
      }
    }
    seen = g;
    if (stop_.load(std::memory_order_acquire)) return;
    fn_(ctx_, index, n_threads_);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace k3
