// safetensors reading (validating, zero-copy) and writing.
//
// Format: u64 little-endian header length N, N bytes of JSON mapping tensor
// names to {dtype, shape, data_offsets: [begin, end]} (offsets relative to
// the byte after the header), then the data. The reader checks every count,
// size and offset with overflow-safe arithmetic before anything is used.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ir/dtype.h"
#include "util/mapped_file.h"
#include "util/status.h"

namespace k3 {

struct TensorInfo {
  std::string name;
  ir::DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offset into the data section
  uint64_t size = 0;   // bytes
};

class SafetensorsFile {
 public:
  static StatusOr<std::shared_ptr<SafetensorsFile>> open(const std::string& path);
  // Validates a buffer already in memory (also used by the fuzz-style tests).
  static StatusOr<std::shared_ptr<SafetensorsFile>> parse(MappedFile file);

  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;
  const uint8_t* data(const TensorInfo& t) const { return data_start_ + t.begin; }
  const std::string& path() const { return file_.path(); }

 private:
  MappedFile file_;
  const uint8_t* data_start_ = nullptr;
  std::map<std::string, TensorInfo> tensors_;
};

// A tensor to write: name, dtype, shape and its raw little-endian bytes.
struct TensorToWrite {
  std::string name;
  ir::DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// Writes a safetensors file; the header is padded with spaces so the data
// section starts 64-byte aligned (allowed by the format), which keeps f32
// tensors usable in place when the file is mapped.
Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace k3
