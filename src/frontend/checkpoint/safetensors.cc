// safetensors reader and writer; see safetensors.h for the format.
#include "frontend/checkpoint/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "util/checked.h"

namespace k3 {
namespace {

using nlohmann::json;

// A header larger than this is certainly corrupt (real ones are kilobytes).
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

StatusOr<ir::DType> parse_dtype(const std::string& s, const std::string& tensor) {
  if (s == "F32") return ir::DType::kF32;
  if (s == "BF16") return ir::DType::kBF16;
  if (s == "F16") return ir::DType::kF16;
  if (s == "I32") return ir::DType::kI32;
  if (s == "I64") return ir::DType::kI64;
  return unimplemented("tensor " + tensor + ": unsupported dtype " + s);
}

const char* dtype_tag(ir::DType t) {
  switch (t) {
    case ir::DType::kF32: return "F32";
    case ir::DType::kBF16: return "BF16";
    case ir::DType::kF16: return "F16";
    case ir::DType::kI32: return "I32";
    case ir::DType::kI64: return "I64";
    case ir::DType::kF64: return "F64";
    case ir::DType::kI8: return "I8";
    case ir::DType::kU8: return "U8";
    case ir::DType::kBool: return "BOOL";
    case ir::DType::kQ8:  // compiler weight formats, never in a safetensors file
    case ir::DType::kF32P16:
    case ir::DType::kBF16P16:
    case ir::DType::kBF16Dot:
    case ir::DType::kBF16DotT16:
    case ir::DType::kQ8P16:
    case ir::DType::kQ8CP16:
    case ir::DType::kBF16DotP16:
      return "?";
  }
  return "?";
}

}  // namespace

StatusOr<std::shared_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  K3_ASSIGN_OR_RETURN(MappedFile f, MappedFile::open(path));
  auto r = parse(std::move(f));
  if (!r.ok()) return r.status().with_context(path);
  return r;
}

StatusOr<std::shared_ptr<SafetensorsFile>> SafetensorsFile::parse(MappedFile file) {
  const uint64_t file_size = file.size();
  if (file_size < 8) return data_loss("file too small for a safetensors header (" + std::to_string(file_size) + " bytes)");
  uint64_t header_len = 0;
  std::memcpy(&header_len, file.data(), 8);  // little-endian on x86-64
  if (header_len > file_size - 8)
    return data_loss("header length " + std::to_string(header_len) + " exceeds file size " + std::to_string(file_size));
  if (header_len > kMaxHeaderBytes) return data_loss("header length " + std::to_string(header_len) + " is implausibly large");
  const char* hdr = reinterpret_cast<const char*>(file.data() + 8);
  json j = json::parse(hdr, hdr + header_len, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return data_loss("header is not a JSON object");

  auto out = std::shared_ptr<SafetensorsFile>(new SafetensorsFile());
  const uint64_t data_size = file_size - 8 - header_len;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") continue;
    const json& e = it.value();
    if (!e.is_object()) return data_loss("tensor " + name + ": entry is not an object");
    auto dt = e.find("dtype");
    auto sh = e.find("shape");
    auto off = e.find("data_offsets");
    if (dt == e.end() || !dt->is_string()) return data_loss("tensor " + name + ": missing dtype");
    if (sh == e.end() || !sh->is_array()) return data_loss("tensor " + name + ": missing shape");
    if (off == e.end() || !off->is_array() || off->size() != 2) return data_loss("tensor " + name + ": data_offsets must be [begin, end]");
    TensorInfo t;
    t.name = name;
    K3_ASSIGN_OR_RETURN(t.dtype, parse_dtype(dt->get<std::string>(), name));
    for (const json& d : *sh) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) return data_loss("tensor " + name + ": shape entries must be non-negative integers");
      t.shape.push_back(d.get<int64_t>());
    }
    if (!(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned())
      return data_loss("tensor " + name + ": data_offsets must be non-negative integers");
    const uint64_t begin = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
    if (begin > end || end > data_size)
      return data_loss("tensor " + name + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                       "] outside the data section of " + std::to_string(data_size) + " bytes");
    auto bytes = checked_numel_bytes(t.shape, ir::dtype_size(t.dtype));
    if (!bytes) return data_loss("tensor " + name + ": shape overflows");
    if (*bytes != end - begin)
      return data_loss("tensor " + name + ": shape needs " + std::to_string(*bytes) + " bytes but data_offsets span " +
                       std::to_string(end - begin));
    t.begin = begin;
    t.size = end - begin;
    ranges.emplace_back(begin, end);
    out->tensors_.emplace(name, std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second) return data_loss("tensor data ranges overlap");
  out->file_ = std::move(file);
  out->data_start_ = out->file_.data() + 8 + header_len;
  return out;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    auto bytes = checked_numel_bytes(t.shape, ir::dtype_size(t.dtype));
    if (!bytes || *bytes != t.bytes.size()) return invalid_argument("tensor " + t.name + ": byte count does not match its shape");
    header[t.name] = {{"dtype", dtype_tag(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  text.resize(align_up(8 + text.size(), 64) - 8, ' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return io_error("cannot create " + path);
  const uint64_t len = text.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const TensorToWrite& t : tensors) out.write(reinterpret_cast<const char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()));
  out.close();
  if (!out) return io_error("error writing " + path);
  return Status();
}

}  // namespace k3
