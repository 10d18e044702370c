// The .k3m file: a compiled model that loads by mapping, not parsing weights.
//
//   offset 0     Header (128 bytes, little-endian, below)
//   meta_offset  metadata: UTF-8 JSON (config, compiled shapes, compile
//                flags and report summary, tensor table, graphs)
//   data_offset  weights (multiple of 4096 from the file start, so the
//                mapping is page aligned); each tensor at a multiple of 64
//                bytes from data_offset (SIMD loads, cache lines)
//   file_bytes   end of file
//
// The loader checks, before it uses anything: the magic and version, that
// the header's sizes add up (overflow-checked) and match the file's size,
// the XXH3-64 checksums of the metadata and of the weights, every tensor's
// dtype, shape, bytes (= numel x dtype size), alignment and range, that no
// two tensors overlap, that every graph value/node/attribute is well formed,
// and the graphs' shape rules (ir::Graph::verify). See docs/k3m-format.md.
#pragma once

#include <cstdint>

namespace k3::k3m {

inline constexpr char kMagic[8] = {'K', '3', 'M', 'O', 'D', 'E', 'L', '\0'};
// 2: kQ8 rows interleave their int8 values across 16-block groups (util/quant.h).
// 3: kQ8 block scales are f16 (1.0625 bytes per weight, llama.cpp's Q8_0 size).
// 4: kQ8 rows keep each 16-block group's scales after its values, not all
//    scales after all values (read front to back).
inline constexpr uint32_t kVersion = 4;
inline constexpr uint64_t kHeaderBytes = 128;
inline constexpr uint64_t kDataAlign = 4096;  // data section start
inline constexpr uint64_t kTensorAlign = 64;  // each tensor within it

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t header_bytes;
  uint64_t file_bytes;
  uint64_t meta_offset;
  uint64_t meta_bytes;
  uint64_t data_offset;
  uint64_t data_bytes;
  uint64_t meta_hash;  // XXH3-64 of the metadata bytes
  uint64_t data_hash;  // XXH3-64 of the whole data section, padding included
  uint8_t reserved[128 - 72];
};
static_assert(sizeof(Header) == kHeaderBytes);

}  // namespace k3::k3m
