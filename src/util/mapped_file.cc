// MappedFile: a whole file in read-only memory, mapped or read into
// huge-page-backed anonymous memory (mapped_file.h says when each pays).
#include "util/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace k3 {

MappedFile::~MappedFile() {
  reset();
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(other.data_),
      size_(other.size_),
      region_(other.region_),
      region_bytes_(other.region_bytes_),
      load_(other.load_),
      path_(std::move(other.path_)) {
  other.data_ = nullptr;
  other.size_ = 0;
  other.region_ = nullptr;
  other.region_bytes_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = other.data_;
    size_ = other.size_;
    region_ = other.region_;
    region_bytes_ = other.region_bytes_;
    load_ = other.load_;
    path_ = std::move(other.path_);
    other.data_ = nullptr;
    other.size_ = 0;
    other.region_ = nullptr;
    other.region_bytes_ = 0;
  }
  return *this;
}

void MappedFile::reset() {
  if (region_ != nullptr && region_bytes_ > 0) munmap(region_, region_bytes_);
  data_ = nullptr;
  size_ = 0;
  region_ = nullptr;
  region_bytes_ = 0;
}

namespace {

constexpr size_t kHugePage = size_t{2} << 20;

// Anonymous memory of `bytes` rounded up to whole 2 MiB pages, starting on a
// 2 MiB boundary (transparent huge pages need both), advised MADV_HUGEPAGE.
// Returns nullptr (errno set) when the memory is not there.
void* map_huge_aligned(size_t bytes, size_t& region_bytes) {
  if (bytes > SIZE_MAX - 2 * kHugePage) {  // rounding up and the slack would overflow
    errno = ENOMEM;
    return nullptr;
  }
  const size_t rounded = (bytes + (kHugePage - 1)) / kHugePage * kHugePage;
  void* raw = mmap(nullptr, rounded + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + (kHugePage - 1)) & ~uintptr_t{kHugePage - 1};
  // Give back the slack on either side, so the region is exactly what munmap gets.
  if (const size_t head = aligned - start; head > 0) munmap(raw, head);
  if (const size_t tail = kHugePage - (aligned - start); tail > 0)
    munmap(reinterpret_cast<void*>(aligned + rounded), tail);
  // Advice only: where it is refused the memory is still there, in 4 KiB pages.
  madvise(reinterpret_cast<void*>(aligned), rounded, MADV_HUGEPAGE);
  region_bytes = rounded;
  return reinterpret_cast<void*>(aligned);
}

// Reads all `size` bytes of fd into dst (pread: retries EINTR and short reads).
Status read_all(int fd, uint8_t* dst, size_t size, const std::string& path) {
  size_t off = 0;
  while (off < size) {
    const ssize_t n = pread(fd, dst + off, std::min<size_t>(size - off, size_t{1} << 30), static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return io_error("cannot read " + path + ": " + std::strerror(errno));
    if (n == 0)
      return io_error(path + ": ended after " + std::to_string(off) + " of " + std::to_string(size) +
                      " bytes while being read (changed on disk?)");
    off += static_cast<size_t>(n);
  }
  return Status();
}

}  // namespace

bool huge_pages_enabled() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(in, line)) return false;
  return line.find("[always]") != std::string::npos || line.find("[madvise]") != std::string::npos;
}

uint64_t MappedFile::huge_page_bytes() const {
  if (load_ != FileLoad::kRead || region_ == nullptr) return 0;
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool ours = false;
  while (std::getline(in, line)) {
    uintptr_t lo = 0, hi = 0;
    // A mapping's header line: "lo-hi perms offset dev inode [path]".
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " ", &lo, &hi) == 2 && line.find(' ') > line.find('-')) {
      ours = lo == reinterpret_cast<uintptr_t>(region_);
      continue;
    }
    unsigned long long kb = 0;
    if (ours && std::sscanf(line.c_str(), "AnonHugePages: %llu kB", &kb) == 1) return uint64_t{kb} * 1024;
  }
  return 0;
}

StatusOr<MappedFile> MappedFile::open(const std::string& path, FileLoad load) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io_error("cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return io_error("cannot stat " + path + ": " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return io_error(path + " is not a regular file");
  }
  MappedFile f;
  f.path_ = path;
  f.size_ = static_cast<size_t>(st.st_size);
  f.load_ = load;
  if (f.size_ > 0 && load == FileLoad::kRead) {
    size_t region_bytes = 0;
    void* p = map_huge_aligned(f.size_, region_bytes);
    if (p == nullptr) {
      const int e = errno;
      ::close(fd);
      return io_error("cannot allocate " + std::to_string(f.size_) + " bytes to read " + path +
                      " into: " + std::strerror(e));
    }
    f.region_ = p;
    f.region_bytes_ = region_bytes;
    f.data_ = static_cast<const uint8_t*>(p);
    const Status read = read_all(fd, static_cast<uint8_t*>(p), f.size_, path);
    ::close(fd);
    if (!read.ok()) return read;           // f's destructor unmaps the region
    mprotect(p, region_bytes, PROT_READ);  // weights are read-only, as when mapped
    return f;
  }
  if (f.size_ > 0) {
    void* p = mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      f.size_ = 0;
      return io_error("cannot mmap " + path + ": " + std::strerror(e));
    }
    f.data_ = static_cast<const uint8_t*>(p);
    f.region_ = p;
    f.region_bytes_ = f.size_;
  }
  ::close(fd);
  return f;
}

StatusOr<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return io_error("error reading " + path);
  return ss.str();
}

}  // namespace k3
