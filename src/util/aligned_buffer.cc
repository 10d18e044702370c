// AlignedBuffer: aligned, zeroed heap memory; large buffers in huge pages.
#include "util/aligned_buffer.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

#include "util/checked.h"

namespace k3 {

void AlignedBuffer::Free::operator()(uint8_t* p) const {
  std::free(p);
}

bool AlignedBuffer::allocate(uint64_t bytes) {
  data_.reset();
  size_ = 0;
  if (bytes == 0) return true;
  const uint64_t align = bytes >= kHugePage ? kHugePage : kAlign;
  if (bytes > UINT64_MAX - align) return false;
  const uint64_t total = align_up(bytes, align);
  void* p = std::aligned_alloc(align, total);
  if (p == nullptr) return false;
  // Advice only, and before the first touch (the memset) so the pages it
  // faults in are huge ones; refused, the memory is still there in 4 KiB pages.
  if (align == kHugePage) madvise(p, total, MADV_HUGEPAGE);
  std::memset(p, 0, total);
  data_.reset(static_cast<uint8_t*>(p));
  size_ = bytes;
  return true;
}

}  // namespace k3
