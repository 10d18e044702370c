// A whole file in read-only memory (RAII), mapped or read.
//
// kMap: loading is O(header), the kernel pages the file in on first touch
// and several processes share the page cache; but page-cache pages are 4 KiB,
// so a decode step that streams hundreds of MB of weights takes a TLB miss
// every 4 KiB.
// kRead: the file is read into anonymous memory aligned to 2 MiB with
// MADV_HUGEPAGE, so transparent huge pages back it (where the kernel allows
// them: huge_pages_enabled()), then made read-only. Loading costs one copy;
// decode then streams weights with 512x fewer TLB entries (docs/runtime.md
// has the measurement).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "util/status.h"

namespace k3 {

enum class FileLoad : uint8_t { kMap, kRead };

class MappedFile {
 public:
  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  static StatusOr<MappedFile> open(const std::string& path, FileLoad load = FileLoad::kMap);

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  FileLoad load() const { return load_; }
  // Bytes of this file's memory that the kernel backs with huge pages now
  // (AnonHugePages of its region in /proc/self/smaps); 0 for kMap, or when
  // that cannot be read.
  uint64_t huge_page_bytes() const;

 private:
  void reset();
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  void* region_ = nullptr;  // what munmap gets: the mapping, or the aligned anonymous region
  size_t region_bytes_ = 0;
  FileLoad load_ = FileLoad::kMap;
  std::string path_;
};

// Whether transparent huge pages can back MADV_HUGEPAGE memory here
// (/sys/kernel/mm/transparent_hugepage/enabled is [always] or [madvise]).
bool huge_pages_enabled();

// Whole file into a string (for small text files such as config.json).
StatusOr<std::string> read_text_file(const std::string& path);

}  // namespace k3
