// Heap allocation counting, for reports that prove the hot path allocates
// nothing. A binary opts in by linking a replacement operator new that calls
// note_heap_allocation() (the k3 tool does: tools/k3/alloc_counter.cc).
#pragma once

#include <atomic>
#include <cstdint>

namespace k3 {

inline std::atomic<int64_t>& heap_allocation_counter() {
  static std::atomic<int64_t> counter{-1};  // -1: nobody counts in this binary
  return counter;
}

inline void note_heap_allocation() {
  auto& c = heap_allocation_counter();
  int64_t v = c.load(std::memory_order_relaxed);
  if (v < 0) c.store(1, std::memory_order_relaxed);
  else c.fetch_add(1, std::memory_order_relaxed);
}

// Allocations so far, or -1 if this binary does not count them.
inline int64_t heap_allocations() { return heap_allocation_counter().load(std::memory_order_relaxed); }

}  // namespace k3
