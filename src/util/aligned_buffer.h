// A 64-byte aligned, zero-initialized heap buffer (arena, KV cache, weights).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "util/checked.h"

namespace k3 {

class AlignedBuffer {
 public:
  static constexpr uint64_t kAlign = 64;
  AlignedBuffer() = default;
  // Returns false if the allocation failed.
  bool allocate(uint64_t bytes) {
    size_ = bytes;
    if (bytes == 0) {
      data_.reset();
      return true;
    }
    void* p = std::aligned_alloc(kAlign, align_up(bytes, kAlign));
    if (p == nullptr) return false;
    std::memset(p, 0, align_up(bytes, kAlign));
    data_.reset(static_cast<uint8_t*>(p));
    return true;
  }
  uint8_t* data() const { return data_.get(); }
  uint64_t size() const { return size_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> data_;
  uint64_t size_ = 0;
};

}  // namespace k3
