// Tests for src/util/mapped_file.{h,cc}: a file mapped and a file read into
// 2 MiB-aligned memory hold the same bytes; errors name the file.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "support/temp_files.h"
#include "util/mapped_file.h"

namespace k3 {
namespace {

using k3::testing::TempDir;
using k3::testing::write_bytes;

// Bytes that differ at every offset, so a misplaced or short read shows.
std::vector<uint8_t> pattern(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  return v;
}

TEST(MappedFile, ReadAndMappedHoldTheSameBytes) {
  TempDir dir;
  // Not a multiple of 4 KiB or 2 MiB: the read region is rounded up, the
  // file's size is not.
  for (size_t n : {size_t{1}, size_t{4097}, (size_t{3} << 20) + 123}) {
    const std::string path = dir.file("f" + std::to_string(n));
    const auto bytes = pattern(n);
    write_bytes(path, std::string(bytes.begin(), bytes.end()));
    auto mapped = MappedFile::open(path, FileLoad::kMap);
    auto read = MappedFile::open(path, FileLoad::kRead);
    ASSERT_TRUE(mapped.ok()) << mapped.status().message();
    ASSERT_TRUE(read.ok()) << read.status().message();
    EXPECT_EQ(mapped->load(), FileLoad::kMap);
    EXPECT_EQ(read->load(), FileLoad::kRead);
    ASSERT_EQ(mapped->size(), n);
    ASSERT_EQ(read->size(), n);
    EXPECT_EQ(std::vector<uint8_t>(mapped->data(), mapped->data() + n), bytes);
    EXPECT_EQ(std::vector<uint8_t>(read->data(), read->data() + n), bytes);
    // Read memory starts on a 2 MiB boundary (what huge pages need).
    EXPECT_EQ(reinterpret_cast<uintptr_t>(read->data()) % (uintptr_t{2} << 20), 0u);
    EXPECT_EQ(mapped->huge_page_bytes(), 0u);  // page-cache pages are never counted
    // Moving keeps one owner of the memory (ASan would flag a double unmap
    // as a later fault; the moved-from file is empty).
    MappedFile moved = std::move(*read);
    EXPECT_EQ(read->data(), nullptr);
    EXPECT_EQ(moved.size(), n);
    EXPECT_EQ(moved.data()[n - 1], bytes[n - 1]);
  }
}

TEST(MappedFile, EmptyAndMissingFiles) {
  TempDir dir;
  const std::string empty = dir.file("empty");
  write_bytes(empty, "");
  for (FileLoad load : {FileLoad::kMap, FileLoad::kRead}) {
    auto f = MappedFile::open(empty, load);
    ASSERT_TRUE(f.ok()) << f.status().message();
    EXPECT_EQ(f->size(), 0u);
    auto missing = MappedFile::open(dir.file("missing"), load);
    ASSERT_FALSE(missing.ok());
    EXPECT_NE(missing.status().message().find("missing"), std::string::npos) << missing.status().message();
    auto directory = MappedFile::open(dir.path(), load);
    ASSERT_FALSE(directory.ok());
    EXPECT_NE(directory.status().message().find("not a regular file"), std::string::npos);
  }
}

}  // namespace
}  // namespace k3
