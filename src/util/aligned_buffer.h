// A 64-byte aligned, zero-initialized heap buffer (arena, KV cache). Buffers
// of 2 MiB or more start on a 2 MiB boundary and are advised MADV_HUGEPAGE,
// so transparent huge pages back them even where the kernel gives huge pages
// only on request (THP "madvise", the Debian and Ubuntu default): a decode
// step streams the KV cache like the weights (util/mapped_file.h).
#pragma once

#include <cstdint>
#include <memory>

namespace k3 {

class AlignedBuffer {
 public:
  static constexpr uint64_t kAlign = 64;
  static constexpr uint64_t kHugePage = uint64_t{2} << 20;
  AlignedBuffer() = default;
  // Returns false if the allocation failed.
  bool allocate(uint64_t bytes);
  uint8_t* data() const { return data_.get(); }
  uint64_t size() const { return size_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t, Free> data_;
  uint64_t size_ = 0;
};

}  // namespace k3
