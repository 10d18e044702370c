// Tests for src/frontend/checkpoint/safetensors.{h,cc}: write/open round
// trip and layout, and that every kind of malformed file gives a non-OK
// status naming the problem (never a crash; also run under ASan/UBSan),
// including a small randomized header-corruption test.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "frontend/checkpoint/safetensors.h"
#include "util/half.h"
#include "util/rng.h"

#include "support/temp_files.h"

namespace {

using k3::testing::read_bytes;
using k3::testing::TempDir;
using k3::testing::write_bytes;
using k3::testing::write_text;

namespace fs = std::filesystem;
using k3::ir::DType;
using ::testing::HasSubstr;

std::string u64_le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

uint64_t read_u64_le(const std::string& s) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(s[static_cast<size_t>(i)]);
  return v;
}

// Raw safetensors bytes: u64 LE header length, header text, data.
std::string raw_file(const std::string& header, const std::string& data) { return u64_le(header.size()) + header + data; }

std::vector<uint8_t> pattern_bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(seed + 31 * i);
  return b;
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// A representative set of tensors covering every dtype, a scalar and an empty tensor.
std::vector<k3::TensorToWrite> sample_tensors() {
  std::vector<k3::TensorToWrite> t;
  t.push_back({"layers.0.attn.wq.weight", DType::kF32, {2, 3}, f32_bytes({1.5f, -2.0f, 0.25f, 3.0f, -0.0f, 1e-30f})});
  t.push_back({"b16", DType::kBF16, {4}, pattern_bytes(8, 1)});
  t.push_back({"h16", DType::kF16, {1, 2, 2}, pattern_bytes(8, 2)});
  t.push_back({"ids", DType::kI32, {3}, pattern_bytes(12, 3)});
  t.push_back({"big_ids", DType::kI64, {2, 1}, pattern_bytes(16, 4)});
  t.push_back({"empty", DType::kF32, {0, 5}, {}});
  t.push_back({"scalar", DType::kF32, {}, f32_bytes({42.0f})});
  t.push_back({"last", DType::kF32, {5}, f32_bytes({1, 2, 3, 4, 5})});  // non-empty last, for truncation tests
  return t;
}

// Writes a file with raw bytes and opens it; returns the status (OK or not).
k3::Status open_raw(const TempDir& dir, const std::string& bytes, const std::string& name = "bad.safetensors") {
  const std::string path = dir.file(name);
  write_bytes(path, bytes);
  auto r = k3::SafetensorsFile::open(path);
  return r.ok() ? k3::Status() : r.status();
}

// Opens raw bytes and expects failure whose message contains every needle.
void expect_bad(const std::string& bytes, const std::vector<std::string>& needles) {
  TempDir dir;
  k3::Status s = open_raw(dir, bytes);
  ASSERT_FALSE(s.ok()) << "accepted a bad file";
  for (const std::string& n : needles) EXPECT_THAT(s.message(), HasSubstr(n));
}

// Checks the invariants every successfully opened file must satisfy, and
// touches every byte of every tensor (so ASan sees any out-of-range view).
void check_opened_invariants(const k3::SafetensorsFile& f, uint64_t file_size) {
  const std::string raw = read_bytes(f.path());
  ASSERT_EQ(raw.size(), file_size);
  const uint64_t header_len = read_u64_le(raw);
  ASSERT_LE(header_len, file_size - 8);
  const uint64_t data_size = file_size - 8 - header_len;
  uint64_t checksum = 0;
  for (const auto& [name, t] : f.tensors()) {
    EXPECT_EQ(name, t.name);
    EXPECT_LE(t.begin, data_size);
    EXPECT_LE(t.size, data_size - t.begin);
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      EXPECT_GE(d, 0);
      numel *= static_cast<uint64_t>(d);
    }
    EXPECT_EQ(numel * k3::ir::dtype_size(t.dtype), t.size);
    const uint8_t* p = f.data(t);
    for (uint64_t i = 0; i < t.size; ++i) checksum += p[i];
    // The view is the bytes at that place in the file.
    if (t.size > 0) {
      EXPECT_EQ(std::memcmp(p, raw.data() + 8 + header_len + t.begin, t.size), 0);
    }
  }
  (void)checksum;
}

// ---------------------------------------------------------------------------
// Round trip and layout

TEST(Safetensors, RoundTrip) {
  TempDir dir;
  const std::vector<k3::TensorToWrite> tensors = sample_tensors();
  const std::string path = dir.file("m.safetensors");
  ASSERT_TRUE(k3::write_safetensors(path, tensors, {{"format", "pt"}, {"note", "round trip"}}).ok());
  auto r = k3::SafetensorsFile::open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const k3::SafetensorsFile& f = **r;
  EXPECT_EQ(f.path(), path);
  ASSERT_EQ(f.tensors().size(), tensors.size()) << "__metadata__ must not appear as a tensor";
  EXPECT_EQ(f.find("__metadata__"), nullptr);
  EXPECT_EQ(f.find("no.such.tensor"), nullptr);
  for (const k3::TensorToWrite& w : tensors) {
    SCOPED_TRACE(w.name);
    const k3::TensorInfo* t = f.find(w.name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->name, w.name);
    EXPECT_EQ(t->dtype, w.dtype);
    EXPECT_EQ(t->shape, w.shape);
    ASSERT_EQ(t->size, w.bytes.size());
    if (!w.bytes.empty()) {
      EXPECT_EQ(std::memcmp(f.data(*t), w.bytes.data(), w.bytes.size()), 0);
    }
  }
  check_opened_invariants(f, fs::file_size(path));
}

TEST(Safetensors, DataSectionIs64ByteAligned) {
  TempDir dir;
  // Different header lengths (name lengths) must all give aligned data.
  for (int len = 1; len <= 70; len += 3) {
    SCOPED_TRACE(len);
    const std::string path = dir.file("a.safetensors");
    std::vector<k3::TensorToWrite> t = {{std::string(static_cast<size_t>(len), 'x'), DType::kF32, {3}, f32_bytes({1, 2, 3})}};
    ASSERT_TRUE(k3::write_safetensors(path, t).ok());
    const std::string raw = read_bytes(path);
    ASSERT_GE(raw.size(), 8u);
    const uint64_t header_len = read_u64_le(raw);
    EXPECT_EQ((8 + header_len) % 64, 0u);
    EXPECT_EQ(raw.size(), 8 + header_len + 12);
    auto r = k3::SafetensorsFile::open(path);
    ASSERT_TRUE(r.ok()) << r.status().message();
    const k3::TensorInfo* ti = (*r)->find(t[0].name);
    ASSERT_NE(ti, nullptr);
    EXPECT_EQ(ti->begin, 0u);
    // The mapping is page aligned, so the first tensor is 64-byte aligned in memory too.
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*r)->data(*ti)) % 64, 0u);
  }
}

TEST(Safetensors, OffsetsArePackedInWriteOrder) {
  TempDir dir;
  const std::vector<k3::TensorToWrite> tensors = sample_tensors();
  const std::string path = dir.file("m.safetensors");
  ASSERT_TRUE(k3::write_safetensors(path, tensors).ok());
  auto r = k3::SafetensorsFile::open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  uint64_t offset = 0;
  for (const k3::TensorToWrite& w : tensors) {
    const k3::TensorInfo* t = (*r)->find(w.name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->begin, offset) << w.name;
    offset += w.bytes.size();
  }
  const std::string raw = read_bytes(path);
  EXPECT_EQ(raw.size(), 8 + read_u64_le(raw) + offset) << "no bytes after the last tensor";
}

TEST(Safetensors, EmptyFileOfTensors) {
  TempDir dir;
  const std::string path = dir.file("e.safetensors");
  ASSERT_TRUE(k3::write_safetensors(path, {}).ok());
  auto r = k3::SafetensorsFile::open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE((*r)->tensors().empty());
}

TEST(Safetensors, HandWrittenFileWithUnalignedDataParses) {
  // The format does not require padding: a minimal header is valid too.
  TempDir dir;
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"I64","shape":[1],"data_offsets":[8,16]}})";
  std::string data(16, '\0');
  const float fa[2] = {3.5f, -1.0f};
  const int64_t ib = -77;
  std::memcpy(data.data(), fa, 8);
  std::memcpy(data.data() + 8, &ib, 8);
  ASSERT_TRUE(open_raw(dir, raw_file(header, data), "ok.safetensors").ok());
  auto r = k3::SafetensorsFile::open(dir.file("ok.safetensors"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  const k3::TensorInfo* a = (*r)->find("a");
  const k3::TensorInfo* b = (*r)->find("b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  float got[2];
  std::memcpy(got, (*r)->data(*a), 8);
  EXPECT_EQ(got[0], 3.5f);
  EXPECT_EQ(got[1], -1.0f);
  int64_t gi;
  std::memcpy(&gi, (*r)->data(*b), 8);
  EXPECT_EQ(gi, -77);
}

TEST(Safetensors, WriteRejectsByteCountMismatch) {
  TempDir dir;
  std::vector<k3::TensorToWrite> t = {{"w.bad", DType::kF32, {2, 2}, pattern_bytes(12, 0)}};
  k3::Status s = k3::write_safetensors(dir.file("x.safetensors"), t);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("w.bad"));
}

TEST(Safetensors, WriteToMissingDirectoryFails) {
  TempDir dir;
  k3::Status s = k3::write_safetensors(dir.file("no/dir/x.safetensors"), sample_tensors());
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("x.safetensors"));
}

// ---------------------------------------------------------------------------
// Bad files

TEST(SafetensorsBad, MissingFile) {
  TempDir dir;
  auto r = k3::SafetensorsFile::open(dir.file("absent.safetensors"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("absent.safetensors"));
}

TEST(SafetensorsBad, ErrorsNameTheFile) {
  TempDir dir;
  const std::string path = dir.file("named.safetensors");
  write_bytes(path, "abc");
  auto r = k3::SafetensorsFile::open(path);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("named.safetensors"));
}

TEST(SafetensorsBad, ShorterThan8Bytes) {
  for (size_t n : {0u, 1u, 7u}) {
    SCOPED_TRACE(n);
    expect_bad(std::string(n, '\x01'), {"too small"});
  }
}

TEST(SafetensorsBad, HeaderLengthLargerThanFile) {
  expect_bad(u64_le(1000) + "{}", {"header length", "exceeds"});
  expect_bad(u64_le(3), {"exceeds"});
  expect_bad(u64_le(UINT64_MAX) + std::string(64, ' '), {"exceeds"});
  expect_bad(u64_le(uint64_t{1} << 63) + "{}", {"exceeds"});
}

TEST(SafetensorsBad, HeaderNotJson) {
  expect_bad(raw_file("{\"a\": ", ""), {"JSON"});
  expect_bad(raw_file("hello", ""), {"JSON"});
  expect_bad(raw_file("", ""), {"JSON"});  // zero-length header
  expect_bad(raw_file(std::string("{\"\xff\xfe\": {}}"), ""), {"JSON"});  // invalid UTF-8
}

TEST(SafetensorsBad, HeaderNotAnObject) {
  expect_bad(raw_file("[1, 2, 3]", ""), {"JSON object"});
  expect_bad(raw_file("42", ""), {"JSON object"});
  expect_bad(raw_file("\"text\"", ""), {"JSON object"});
  expect_bad(raw_file("null", ""), {"JSON object"});
}

TEST(SafetensorsBad, DeeplyNestedHeader) {
  const int depth = 20000;
  expect_bad(raw_file(std::string(depth, '[') + std::string(depth, ']'), ""), {"JSON object"});
  expect_bad(raw_file("{\"t\": " + std::string(depth, '[') + std::string(depth, ']') + "}", ""), {"t"});
}

TEST(SafetensorsBad, EntryNotAnObject) {
  expect_bad(raw_file(R"({"w": [1, 2]})", ""), {"w", "not an object"});
}

TEST(SafetensorsBad, MissingDtype) {
  expect_bad(raw_file(R"({"w.q": {"shape": [1], "data_offsets": [0, 4]}})", std::string(4, '\0')), {"w.q", "dtype"});
  expect_bad(raw_file(R"({"w.q": {"dtype": 5, "shape": [1], "data_offsets": [0, 4]}})", std::string(4, '\0')), {"w.q", "dtype"});
}

TEST(SafetensorsBad, MissingShape) {
  expect_bad(raw_file(R"({"w.q": {"dtype": "F32", "data_offsets": [0, 4]}})", std::string(4, '\0')), {"w.q", "shape"});
  expect_bad(raw_file(R"({"w.q": {"dtype": "F32", "shape": 1, "data_offsets": [0, 4]}})", std::string(4, '\0')), {"w.q", "shape"});
}

TEST(SafetensorsBad, MissingDataOffsets) {
  expect_bad(raw_file(R"({"w.q": {"dtype": "F32", "shape": [1]}})", std::string(4, '\0')), {"w.q", "data_offsets"});
  expect_bad(raw_file(R"({"w.q": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", std::string(4, '\0')),
             {"w.q", "data_offsets"});
  expect_bad(raw_file(R"({"w.q": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}})", std::string(8, '\0')),
             {"w.q", "data_offsets"});
  expect_bad(raw_file(R"({"w.q": {"dtype": "F32", "shape": [1], "data_offsets": ["0", "4"]}})", std::string(4, '\0')),
             {"w.q", "data_offsets"});
}

TEST(SafetensorsBad, UnsupportedDtype) {
  expect_bad(raw_file(R"({"w.f64": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})", std::string(8, '\0')),
             {"w.f64", "F64", "dtype"});
  expect_bad(raw_file(R"({"w": {"dtype": "f32", "shape": [1], "data_offsets": [0, 4]}})", std::string(4, '\0')), {"w", "f32"});
}

TEST(SafetensorsBad, NegativeShapeEntry) {
  expect_bad(raw_file(R"({"w.neg": {"dtype": "F32", "shape": [-1, 4], "data_offsets": [0, 0]}})", ""), {"w.neg", "shape"});
  expect_bad(raw_file(R"({"w.neg": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]}})", std::string(8, '\0')),
             {"w.neg", "shape"});
  // 2^64 - 1 as a shape entry does not fit in int64.
  expect_bad(raw_file(R"({"w.neg": {"dtype": "F32", "shape": [18446744073709551615], "data_offsets": [0, 4]}})", std::string(4, '\0')),
             {"w.neg", "shape"});
}

TEST(SafetensorsBad, NegativeOffsets) {
  expect_bad(raw_file(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", std::string(4, '\0')),
             {"w", "data_offsets"});
}

TEST(SafetensorsBad, OffsetsBeginAfterEnd) {
  expect_bad(raw_file(R"({"w.rev": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", std::string(8, '\0')),
             {"w.rev", "data_offsets"});
}

TEST(SafetensorsBad, OffsetsEndBeyondData) {
  expect_bad(raw_file(R"({"w.far": {"dtype": "F32", "shape": [16], "data_offsets": [0, 64]}})", std::string(16, '\0')),
             {"w.far", "data_offsets", "outside the data section"});
  // begin + size wrapping around 2^64 must not sneak past the check.
  expect_bad(raw_file(R"({"w.far": {"dtype": "F32", "shape": [1], "data_offsets": [18446744073709551614, 18446744073709551615]}})",
                      std::string(16, '\0')),
             {"w.far"});
}

TEST(SafetensorsBad, ShapeBytesDifferFromOffsetSpan) {
  expect_bad(raw_file(R"({"w.sz": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}})", std::string(16, '\0')),
             {"w.sz", "16", "12"});
  expect_bad(raw_file(R"({"w.sz": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 16]}})", std::string(16, '\0')),
             {"w.sz", "8", "16"});
}

TEST(SafetensorsBad, ShapeProductOverflows) {
  expect_bad(raw_file(R"({"w.huge": {"dtype": "F32", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 16]}})",
                      std::string(16, '\0')),
             {"w.huge", "overflow"});
  // Product of elements fits but bytes do not.
  expect_bad(raw_file(R"({"w.huge": {"dtype": "I64", "shape": [2305843009213693952, 2], "data_offsets": [0, 0]}})", ""),
             {"w.huge", "overflow"});
}

TEST(SafetensorsBad, OverlappingRanges) {
  expect_bad(raw_file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                      R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                      std::string(12, '\0')),
             {"overlap"});
  // Identical ranges, and one range inside another.
  expect_bad(raw_file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                      R"( "b": {"dtype": "I32", "shape": [2], "data_offsets": [0, 8]}})",
                      std::string(8, '\0')),
             {"overlap"});
  expect_bad(raw_file(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},)"
                      R"( "c": {"dtype": "F32", "shape": [1], "data_offsets": [20, 24]},)"
                      R"( "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                      std::string(24, '\0')),
             {"overlap"});
}

TEST(SafetensorsBad, AdjacentRangesAreFine) {
  TempDir dir;
  k3::Status s = open_raw(dir, raw_file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                                        R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
                                        std::string(16, '\0')));
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST(SafetensorsBad, TruncatedValidFile) {
  TempDir dir;
  const std::string path = dir.file("full.safetensors");
  ASSERT_TRUE(k3::write_safetensors(path, sample_tensors()).ok());
  const std::string full = read_bytes(path);
  const uint64_t header_len = read_u64_le(full);
  const size_t data_start = 8 + static_cast<size_t>(header_len);
  ASSERT_GT(full.size(), data_start + 8);
  // Cut in the middle of the data.
  {
    k3::Status s = open_raw(dir, full.substr(0, data_start + (full.size() - data_start) / 2), "cut.safetensors");
    ASSERT_FALSE(s.ok());
    EXPECT_THAT(s.message(), HasSubstr("outside the data section"));
  }
  // Every shorter prefix must be rejected too (the last tensor is non-empty and ends the file).
  for (size_t n = 0; n < full.size(); ++n) {
    k3::Status s = open_raw(dir, full.substr(0, n), "prefix.safetensors");
    ASSERT_FALSE(s.ok()) << "prefix of " << n << " of " << full.size() << " bytes accepted";
  }
}

TEST(SafetensorsBad, RandomHeaderCorruptionNeverCrashes) {
  TempDir dir;
  const std::string path = dir.file("valid.safetensors");
  ASSERT_TRUE(k3::write_safetensors(path, sample_tensors(), {{"format", "pt"}}).ok());
  const std::string valid = read_bytes(path);
  const uint64_t header_len = read_u64_le(valid);
  ASSERT_GT(header_len, 0u);
  k3::Rng rng(20240611);
  int accepted = 0, rejected = 0;
  for (int iter = 0; iter < 200; ++iter) {
    std::string bytes = valid;
    const int flips = 1 + static_cast<int>(rng.next_u64() % 4);
    for (int k = 0; k < flips; ++k) {
      uint64_t r = rng.next_u64();
      // Mostly the JSON text; sometimes the length prefix.
      const size_t pos = (r % 10 == 0) ? static_cast<size_t>((r >> 8) % 8) : 8 + static_cast<size_t>((r >> 8) % header_len);
      const uint64_t mode = (r >> 40) % 3;
      char& c = bytes[pos];
      if (mode == 0) c = static_cast<char>(c ^ (1 << ((r >> 48) % 8)));  // flip one bit
      else if (mode == 1) c = static_cast<char>(r >> 52);                  // random byte
      else c = "0123456789[]{}\",:-"[(r >> 52) % 18];                     // a JSON-significant character
    }
    const std::string p = dir.file("fuzz.safetensors");
    write_bytes(p, bytes);
    auto f = k3::SafetensorsFile::open(p);
    if (f.ok()) {
      ++accepted;
      check_opened_invariants(**f, bytes.size());
    } else {
      ++rejected;
      EXPECT_FALSE(f.status().message().empty());
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_EQ(accepted + rejected, 200);
}

}  // namespace
