// ThreadPool: every index covered exactly once, many dispatches in a row
// (spinning workers) and dispatches after idle gaps (sleeping workers).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "runtime/thread_pool.h"

namespace k3 {
namespace {

TEST(ThreadPool, ParallelForCoversEachIndexOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 7, 16, 17, 100, 1001})
      for (int64_t align : {1, 4, 16}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        pool.parallel_for(n, align, [&](int64_t b, int64_t e) {
          EXPECT_EQ(b % align, 0);
          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << threads << " " << n << " " << align;
      }
  }
}

TEST(ThreadPool, ManyDispatchesAndIdleGaps) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  for (int round = 0; round < 20000; ++round) pool.run([&](int t, int) { sum.fetch_add(t + 1); });
  EXPECT_EQ(sum.load(), 20000 * 3);
  for (int round = 0; round < 5; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));  // workers go to sleep
    pool.run([&](int t, int) { sum.fetch_add(t + 1); });
  }
  EXPECT_EQ(sum.load(), 20005 * 3);
}

}  // namespace
}  // namespace k3
