// ThreadPool: spin-then-sleep workers, chunks claimed with generation-tagged
// tickets.
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

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  workers_.reserve(static_cast<size_t>(n_threads_ - 1));
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_seq_cst);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  futex_wake(&generation_);
  for (auto& w : workers_) w.join();
}

void ThreadPool::wake_all() {
  // seq_cst on both sides (generation bump here; sleepers_ increment, then
  // generation re-check in the worker) means a worker either sees the new
  // generation or is counted here and woken.
  if (sleepers_.load(std::memory_order_seq_cst) > 0) futex_wake(&generation_);
}

void ThreadPool::drain(uint32_t gen) {
  for (;;) {
    uint64_t t = ticket_.load(std::memory_order_acquire);
    if (static_cast<uint32_t>(t >> 32) != gen) return;  // a later region: not ours
    const int64_t chunk = static_cast<int64_t>(t & 0xffffffffu);
    const int64_t n = n_chunks_.load(std::memory_order_relaxed);
    if (chunk >= n) return;
    if (!ticket_.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    // The claim succeeded for this generation, so the region is still open
    // (its caller waits for this chunk) and fn_/ctx_ are the region's.
    const bool one = one_per_thread_.load(std::memory_order_relaxed);
    fn_.load(std::memory_order_relaxed)(ctx_.load(std::memory_order_relaxed), chunk, n);
    done_.fetch_add(1, std::memory_order_acq_rel);
    if (one) return;
  }
}

void ThreadPool::run_raw(RawFn fn, void* ctx, int64_t n_chunks, bool one_per_thread) {
  const uint32_t gen = generation_.load(std::memory_order_relaxed) + 1;
  fn_.store(fn, std::memory_order_relaxed);
  ctx_.store(ctx, std::memory_order_relaxed);
  n_chunks_.store(n_chunks, std::memory_order_relaxed);
  one_per_thread_.store(one_per_thread, std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  ticket_.store(static_cast<uint64_t>(gen) << 32, std::memory_order_release);
  generation_.store(gen, std::memory_order_seq_cst);
  wake_all();
  drain(gen);
  int spins = 0;
  while (done_.load(std::memory_order_acquire) != n_chunks) {
    if (++spins < kSpinIterations) cpu_relax();
    else std::this_thread::yield();
  }
}

void ThreadPool::worker_loop() {
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
    drain(g);
  }
}

}  // namespace k3
