// Tests for src/util/npy.{h,cc}: float32 .npy writing and reading, round
// trips, header layout, and the errors the reader gives on bad files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "util/npy.h"

#include "support/temp_files.h"

namespace {

using k3::testing::read_bytes;
using k3::testing::TempDir;
using k3::testing::write_bytes;
using k3::testing::write_text;

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A version 1.0 .npy file with the given header dict text (padded to 64 bytes
// like NumPy does) followed by raw data bytes.
std::string make_npy(const std::string& dict, const std::string& data) {
  std::string header = dict;
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(header.size());
  out += static_cast<char>(len & 0xff);
  out += static_cast<char>(len >> 8);
  return out + header + data;
}

std::string float_bytes(const std::vector<float>& v) {
  std::string s(v.size() * 4, '\0');
  if (!v.empty()) std::memcpy(s.data(), v.data(), s.size());
  return s;
}

std::vector<float> iota_floats(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) * 0.5f - 3.25f;
  return v;
}

void expect_round_trip(const std::vector<int64_t>& shape) {
  TempDir dir;
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  const std::vector<float> data = iota_floats(n);
  const std::string path = dir.file("a.npy");
  ASSERT_TRUE(k3::write_npy_f32(path, data.data(), shape).ok());
  auto r = k3::read_npy_f32(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->shape, shape);
  EXPECT_EQ(r->data, data);
  // NumPy layout: magic, version 1.0, header padded so the data starts 64-byte aligned, ending in '\n'.
  const std::string bytes = read_bytes(path);
  ASSERT_GE(bytes.size(), 10u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  const size_t hlen = static_cast<uint8_t>(bytes[8]) | (static_cast<size_t>(static_cast<uint8_t>(bytes[9])) << 8);
  EXPECT_EQ((10 + hlen) % 64, 0u);
  ASSERT_LE(10 + hlen, bytes.size());
  EXPECT_EQ(bytes[10 + hlen - 1], '\n');
  EXPECT_EQ(bytes.size(), 10 + hlen + 4 * n);
  const std::string header = bytes.substr(10, hlen);
  EXPECT_THAT(header, HasSubstr("'descr': '<f4'"));
  EXPECT_THAT(header, HasSubstr("'fortran_order': False"));
}

TEST(Npy, RoundTrip1D) { expect_round_trip({7}); }
TEST(Npy, RoundTrip3D) { expect_round_trip({2, 3, 4}); }
// Arrays with no elements (a copy of zero bytes must not touch a null pointer).
TEST(Npy, RoundTripEmptyDim) { expect_round_trip({0}); }
TEST(Npy, RoundTripEmptyInnerDim) { expect_round_trip({3, 0, 2}); }
TEST(Npy, RoundTripScalar) { expect_round_trip({}); }

TEST(Npy, OneDimShapeIsATuple) {
  // Python needs the trailing comma: (7,) is a tuple, (7) is an int.
  TempDir dir;
  const std::vector<float> data = iota_floats(7);
  ASSERT_TRUE(k3::write_npy_f32(dir.file("a.npy"), data.data(), {7}).ok());
  EXPECT_THAT(read_bytes(dir.file("a.npy")), HasSubstr("'shape': (7,)"));
}

TEST(Npy, RoundTripSpecialValues) {
  TempDir dir;
  const std::vector<float> data = {0.0f, -0.0f, 1e-45f, -3.4e38f, std::numeric_limits<float>::infinity(), 1.0f / 3.0f};
  ASSERT_TRUE(k3::write_npy_f32(dir.file("s.npy"), data.data(), {2, 3}).ok());
  auto r = k3::read_npy_f32(dir.file("s.npy"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->data.size(), data.size());
  EXPECT_EQ(std::memcmp(r->data.data(), data.data(), 4 * data.size()), 0);
}

TEST(Npy, ReadsNumpyStyleHeader) {
  // The header NumPy itself writes (spaces after commas).
  TempDir dir;
  const std::vector<float> data = iota_floats(6);
  write_bytes(dir.file("np.npy"), make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", float_bytes(data)));
  auto r = k3::read_npy_f32(dir.file("np.npy"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(r->data, data);
}

TEST(Npy, WriteToMissingDirectoryFails) {
  TempDir dir;
  const float x = 1.0f;
  k3::Status s = k3::write_npy_f32(dir.file("no/such/dir/a.npy"), &x, {1});
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("a.npy"));
}

TEST(Npy, MissingFile) {
  TempDir dir;
  auto r = k3::read_npy_f32(dir.file("absent.npy"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("absent.npy"));
}

TEST(Npy, NotNpyMagic) {
  TempDir dir;
  write_bytes(dir.file("x.npy"), "this is certainly not a numpy file, it is text\n");
  auto r = k3::read_npy_f32(dir.file("x.npy"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("not a .npy file"));
  EXPECT_THAT(r.status().message(), HasSubstr("x.npy"));
}

TEST(Npy, EmptyAndTinyFiles) {
  TempDir dir;
  for (const std::string& bytes : {std::string(), std::string("\x93NUM", 4), std::string("\x93NUMPY\x01\x00", 8)}) {
    write_bytes(dir.file("t.npy"), bytes);
    auto r = k3::read_npy_f32(dir.file("t.npy"));
    EXPECT_FALSE(r.ok()) << "file of " << bytes.size() << " bytes";
  }
}

TEST(Npy, TruncatedHeader) {
  TempDir dir;
  std::string bytes = make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", float_bytes({1, 2}));
  bytes.resize(40);  // cut inside the header
  write_bytes(dir.file("t.npy"), bytes);
  auto r = k3::read_npy_f32(dir.file("t.npy"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("truncated header"));
}

TEST(Npy, TruncatedData) {
  TempDir dir;
  const std::vector<float> data = iota_floats(24);
  const std::string path = dir.file("t.npy");
  ASSERT_TRUE(k3::write_npy_f32(path, data.data(), {2, 3, 4}).ok());
  fs::resize_file(path, fs::file_size(path) - 6);  // cut in the middle of a float
  auto r = k3::read_npy_f32(path);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("data size does not match the shape"));
}

TEST(Npy, WrongDtype) {
  TempDir dir;
  const std::vector<double> data = {1.0, 2.0, 3.0};
  std::string raw(sizeof(double) * data.size(), '\0');
  std::memcpy(raw.data(), data.data(), raw.size());
  write_bytes(dir.file("f8.npy"), make_npy("{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", raw));
  auto r = k3::read_npy_f32(dir.file("f8.npy"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("dtype"));
  EXPECT_THAT(r.status().message(), HasSubstr("float32"));
}

TEST(Npy, BigEndianRejected) {
  TempDir dir;
  write_bytes(dir.file("be.npy"), make_npy("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", float_bytes({1, 2})));
  auto r = k3::read_npy_f32(dir.file("be.npy"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("dtype"));
}

TEST(Npy, FortranOrderRejected) {
  TempDir dir;
  write_bytes(dir.file("f.npy"), make_npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", float_bytes({1, 2, 3, 4})));
  auto r = k3::read_npy_f32(dir.file("f.npy"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("Fortran"));
}

TEST(Npy, SizeMismatch) {
  TempDir dir;
  // Shape says 3 floats, data has 4 (too much) or 2 (too little).
  for (const std::vector<float>& data : {std::vector<float>{1, 2, 3, 4}, std::vector<float>{1, 2}}) {
    write_bytes(dir.file("m.npy"), make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", float_bytes(data)));
    auto r = k3::read_npy_f32(dir.file("m.npy"));
    ASSERT_FALSE(r.ok()) << data.size() << " floats";
    EXPECT_THAT(r.status().message(), HasSubstr("data size does not match the shape"));
  }
}

TEST(Npy, MalformedShapeRejected) {
  TempDir dir;
  for (const char* shape : {"(-3,)", "(3a,)", "(99999999999999999999,)", "3,"}) {
    write_bytes(dir.file("s.npy"), make_npy(std::string("{'descr': '<f4', 'fortran_order': False, 'shape': ") + shape + ", }", float_bytes({1, 2, 3})));
    auto r = k3::read_npy_f32(dir.file("s.npy"));
    EXPECT_FALSE(r.ok()) << "shape " << shape;
    if (!r.ok()) {
      EXPECT_THAT(r.status().message(), HasSubstr("shape")) << "shape " << shape;
    }
  }
}

TEST(Npy, OverflowingShapeRejected) {
  TempDir dir;
  write_bytes(dir.file("o.npy"),
              make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16), }", float_bytes({1})));
  auto r = k3::read_npy_f32(dir.file("o.npy"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("shape"));
}

TEST(Npy, UnsupportedVersion) {
  TempDir dir;
  std::string bytes = make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", float_bytes({1}));
  bytes[6] = 3;
  write_bytes(dir.file("v.npy"), bytes);
  auto r = k3::read_npy_f32(dir.file("v.npy"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("version"));
}

}  // namespace
