// ThreadPool: spin-then-sleep workers, chunks claimed with generation-tagged
// tickets.
#include "runtime/thread_pool.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>

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

// Pins the calling thread to `cpu`. Failure is not fatal (the pool still
// works, only unpinned), but it is reported: a user asked for it.
void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (const int err = pthread_setaffinity_np(pthread_self(), sizeof set, &set); err != 0)
    std::fprintf(stderr, "k3: warning: cannot pin a thread to CPU %d (error %d)\n", cpu, err);
}

}  // namespace

std::vector<int> allowed_cpus() {
  // Read once, at start-up: a pool pins its caller, after which the calling
  // thread's mask is that one CPU, not what the process may use (a second
  // engine in the same process, as k3 bench --compare loads, must still be
  // able to name the other CPUs).
  static const std::vector<int> cpus = [] {
    std::vector<int> out;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) return out;
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) out.push_back(c);
    return out;
  }();
  return cpus;
}

namespace {
// Runs allowed_cpus() during static initialisation, before any pinning.
[[maybe_unused]] const bool g_cpus_read = !allowed_cpus().empty();
}  // namespace

StatusOr<std::vector<int>> parse_cpu_list(const std::string& text) {
  const std::vector<int> allowed = allowed_cpus();
  auto allowed_text = [&] {
    std::string a;
    for (int c : allowed) a += (a.empty() ? "" : ",") + std::to_string(c);
    return a;
  };
  auto number = [](const std::string& s, int& v) {
    if (s.empty() || s.size() > 6 || s.find_first_not_of("0123456789") != std::string::npos) return false;
    v = std::atoi(s.c_str());
    return true;
  };
  std::vector<int> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    const size_t dash = item.find('-');
    int lo = 0, hi = 0;
    if (!(dash == std::string::npos ? number(item, lo) && number(item, hi)
                                    : number(item.substr(0, dash), lo) && number(item.substr(dash + 1), hi)) ||
        hi < lo)
      return invalid_argument("--cpus: '" + item + "' is not a CPU number or a range lo-hi (e.g. 0,1 or 0-3)");
    for (int c = lo; c <= hi; ++c) {
      if (std::find(allowed.begin(), allowed.end(), c) == allowed.end())
        return invalid_argument("--cpus: CPU " + std::to_string(c) + " is not one this process may run on (" +
                                allowed_text() + ")");
      if (std::find(out.begin(), out.end(), c) != out.end())
        return invalid_argument("--cpus: CPU " + std::to_string(c) + " is listed twice");
      out.push_back(c);
    }
    pos = comma + 1;
  }
  return out;
}

ThreadPool::ThreadPool(int n_threads, const std::vector<int>& cpus) : n_threads_(std::max(1, n_threads)), cpus_(cpus) {
  if (!cpus_.empty()) {
    cpus_.resize(static_cast<size_t>(n_threads_), cpus_.back());  // callers pass n_threads entries
    pin_to(cpus_[0]);
  }
  workers_.reserve(static_cast<size_t>(n_threads_ - 1));
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
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

void ThreadPool::drain(uint32_t gen, int self) {
  for (;;) {
    uint64_t t = ticket_.load(std::memory_order_acquire);
    if (static_cast<uint32_t>(t >> 32) != gen) return;  // a later region: not ours
    const int64_t chunk = static_cast<int64_t>(t & 0xffffffffu);
    // Acquire: if this is already the next region's count, the caller's
    // closing store of our ticket (see run_raw) happens-before the CAS
    // below, so a stale ticket cannot be claimed against the wrong count.
    const int64_t n = n_chunks_.load(std::memory_order_acquire);
    if (chunk >= n) return;
    if (!ticket_.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    // The claim succeeded for this generation, so the region is still open
    // (its caller waits for this chunk) and fn_/ctx_ are the region's.
    // run_on_each_thread promises f(t) on thread t, whichever ticket t took.
    const bool one = one_per_thread_.load(std::memory_order_relaxed);
    fn_.load(std::memory_order_relaxed)(ctx_.load(std::memory_order_relaxed), one ? self : chunk, n);
    done_.fetch_add(1, std::memory_order_acq_rel);
    if (one) return;
  }
}

void ThreadPool::run_raw(RawFn fn, void* ctx, int64_t n_chunks, bool one_per_thread) {
  K3_CHECK(n_chunks > 0 && n_chunks < int64_t{kClosed});  // a chunk index fits the ticket's low half
  const uint32_t gen = generation_.load(std::memory_order_relaxed) + 1;
  fn_.store(fn, std::memory_order_relaxed);
  ctx_.store(ctx, std::memory_order_relaxed);
  n_chunks_.store(n_chunks, std::memory_order_release);
  one_per_thread_.store(one_per_thread, std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  ticket_.store(static_cast<uint64_t>(gen) << 32, std::memory_order_release);
  generation_.store(gen, std::memory_order_seq_cst);
  wake_all();
  drain(gen, 0);
  int spins = 0;
  while (done_.load(std::memory_order_acquire) != n_chunks) {
    if (++spins < kSpinIterations)
      cpu_relax();
    else
      std::this_thread::yield();
  }
  // Close the region: its ticket now names no chunk under any count. Without
  // this, a worker still holding the ticket (gen, n) from its last look could
  // read the next region's larger n_chunks_ and claim chunk n of this
  // finished region before the next ticket is published: a chunk that does
  // not exist, run against whatever fn_/ctx_ are by then, counted in the next
  // region's done_ (which then never equals its chunk count: a hang).
  ticket_.store(static_cast<uint64_t>(gen) << 32 | kClosed, std::memory_order_relaxed);
}

void ThreadPool::worker_loop(int index) {
  if (!cpus_.empty()) pin_to(cpus_[static_cast<size_t>(index)]);
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
    drain(g, index);
  }
}

}  // namespace k3
