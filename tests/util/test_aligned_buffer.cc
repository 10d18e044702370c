// Tests for src/util/aligned_buffer.{h,cc}: alignment (64 bytes; 2 MiB for
// buffers that large, for huge pages), zeroed contents, reallocation.
#include <gtest/gtest.h>

#include <cstdint>

#include "util/aligned_buffer.h"

namespace k3 {
namespace {

bool all_zero(const uint8_t* p, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i)
    if (p[i] != 0) return false;
  return true;
}

TEST(AlignedBuffer, AlignsAndZeroes) {
  AlignedBuffer small;
  ASSERT_TRUE(small.allocate(1000));
  EXPECT_EQ(small.size(), 1000u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data()) % AlignedBuffer::kAlign, 0u);
  EXPECT_TRUE(all_zero(small.data(), 1000));

  // Large enough for huge pages: starts on a 2 MiB boundary.
  const uint64_t big = AlignedBuffer::kHugePage * 3 + 5;
  AlignedBuffer large;
  ASSERT_TRUE(large.allocate(big));
  EXPECT_EQ(large.size(), big);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(large.data()) % AlignedBuffer::kHugePage, 0u);
  EXPECT_TRUE(all_zero(large.data(), big));
  large.data()[big - 1] = 7;  // the whole size is writable

  // Reallocating gives fresh zeroed memory of the new size; 0 bytes, none.
  ASSERT_TRUE(large.allocate(4096));
  EXPECT_TRUE(all_zero(large.data(), 4096));
  ASSERT_TRUE(large.allocate(0));
  EXPECT_EQ(large.data(), nullptr);
  EXPECT_EQ(large.size(), 0u);
}

TEST(AlignedBuffer, ImpossibleSizeFailsCleanly) {
  AlignedBuffer b;
  EXPECT_FALSE(b.allocate(UINT64_MAX - 10));
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(b.size(), 0u);  // a failed allocation holds nothing
}

}  // namespace
}  // namespace k3
