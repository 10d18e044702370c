// Replacement global operator new for the k3 tool: counts allocations so
// `k3 bench` can report allocations per decode step (expected: 0). The cost
// is one relaxed atomic increment per allocation.
#include <cstdlib>
#include <new>

#include "util/alloc_counter.h"

void* operator new(std::size_t n) {
  k3::note_heap_allocation();
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  k3::note_heap_allocation();
  return std::malloc(n == 0 ? 1 : n);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return operator new(n, std::nothrow); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
