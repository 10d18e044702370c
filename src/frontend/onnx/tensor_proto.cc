// TensorProto decoding/encoding; see tensor_proto.h.
#include "frontend/onnx/tensor_proto.h"

#include <cstring>
#include <fstream>
#include <optional>

#include "frontend/onnx/onnx_model.h"
#include "ir/onnx_shape.h"
#include "util/mapped_file.h"

namespace k3::onnxfe {
namespace {

// Parses a non-negative decimal integer (external_data offset/length).
std::optional<uint64_t> parse_u64(const std::string& s) {
  if (s.empty() || s.size() > 19) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v;
}

Status read_external(const ::onnx::TensorProto& t, const std::string& what, const std::string& dir, ir::Tensor& out) {
  if (dir.empty()) return unimplemented(what + " keeps its data in an external file, which is not readable here");
  std::string location;
  uint64_t offset = 0;
  std::optional<uint64_t> length;
  for (const auto& kv : t.external_data()) {
    if (kv.key() == "location") {
      location = kv.value();
    } else if (kv.key() == "offset" || kv.key() == "length") {
      const auto v = parse_u64(kv.value());
      if (!v)
        return data_loss(what + ": external data " + kv.key() + " '" + printable(kv.value()) + "' is not a number");
      if (kv.key() == "offset")
        offset = *v;
      else
        length = *v;
    }
  }
  if (location.empty()) return data_loss(what + ": external data without a location");
  if (location.front() == '/' || location.find('\0') != std::string::npos ||
      ("/" + location + "/").find("/../") != std::string::npos)
    return data_loss(what + ": external data location '" + printable(location) +
                     "' must be a relative path inside the model's directory");
  const std::string path = dir + "/" + location;
  K3_ASSIGN_OR_RETURN(MappedFile file, MappedFile::open(path));
  const uint64_t want = out.nbytes();
  if (length && *length != want)
    return data_loss(what + ": external data length " + std::to_string(*length) + " does not match its dims (" +
                     std::to_string(want) + " bytes)");
  if (offset > file.size() || want > file.size() - offset)
    return data_loss(what + ": external data [" + std::to_string(offset) + ", +" + std::to_string(want) +
                     ") runs past the end of " + printable(location) + " (" + std::to_string(file.size()) + " bytes)");
  if (want > 0) std::memcpy(out.raw_mut(), static_cast<const uint8_t*>(file.data()) + offset, want);
  return Status();
}

}  // namespace

StatusOr<ir::Tensor> tensor_from_proto(const ::onnx::TensorProto& t, const std::string& what,
                                       const std::string& external_dir) {
  auto dtype = ir::dtype_from_onnx(t.data_type());
  if (!dtype)
    return unimplemented(what + " has data type " + onnx_type_name(t.data_type()) + ", which K3 does not support");
  std::vector<int64_t> shape(t.dims().begin(), t.dims().end());
  for (int64_t d : shape)
    if (d < 0) return data_loss(what + " has a negative dimension");
  auto tensor = ir::Tensor::zeros(*dtype, shape);
  if (!tensor) return data_loss(what + " is too large");
  if (t.data_location() == ::onnx::TensorProto::EXTERNAL) {
    K3_RETURN_IF_ERROR(read_external(t, what, external_dir, *tensor));
    return std::move(*tensor);
  }
  const uint64_t n = static_cast<uint64_t>(tensor->numel());
  const uint64_t es = ir::dtype_size(*dtype);
  void* dst = tensor->raw_mut();
  if (t.has_raw_data()) {
    if (t.raw_data().size() != tensor->nbytes())
      return data_loss(what + " holds " + std::to_string(t.raw_data().size()) + " bytes, its dims need " +
                       std::to_string(tensor->nbytes()));
    std::memcpy(dst, t.raw_data().data(), tensor->nbytes());
    return std::move(*tensor);
  }
  auto need = [&](uint64_t have) -> Status {
    if (have != n)
      return data_loss(what + " holds " + std::to_string(have) + " values, its dims need " + std::to_string(n));
    return Status();
  };
  switch (*dtype) {
    case ir::DType::kF32:
      K3_RETURN_IF_ERROR(need(static_cast<uint64_t>(t.float_data_size())));
      if (n) std::memcpy(dst, t.float_data().data(), n * 4);
      break;
    case ir::DType::kF64:
      K3_RETURN_IF_ERROR(need(static_cast<uint64_t>(t.double_data_size())));
      if (n) std::memcpy(dst, t.double_data().data(), n * 8);
      break;
    case ir::DType::kI64:
      K3_RETURN_IF_ERROR(need(static_cast<uint64_t>(t.int64_data_size())));
      if (n) std::memcpy(dst, t.int64_data().data(), n * 8);
      break;
    default: {
      // int32_data carries i32, i8, u8, bool and 16-bit float bit patterns.
      K3_RETURN_IF_ERROR(need(static_cast<uint64_t>(t.int32_data_size())));
      auto* p = static_cast<uint8_t*>(dst);
      for (uint64_t i = 0; i < n; ++i) {
        const int32_t v = t.int32_data(static_cast<int>(i));
        if (es == 4)
          std::memcpy(p + i * 4, &v, 4);
        else if (es == 2) {
          const uint16_t h = static_cast<uint16_t>(v);
          std::memcpy(p + i * 2, &h, 2);
        } else {
          p[i] = *dtype == ir::DType::kBool ? (v != 0) : static_cast<uint8_t>(v);
        }
      }
    }
  }
  return std::move(*tensor);
}

::onnx::TensorProto tensor_to_proto(const ir::Tensor& t, const std::string& name) {
  ::onnx::TensorProto p;
  p.set_name(name);
  p.set_data_type(static_cast<int32_t>(ir::dtype_to_onnx(t.dtype())));
  for (int64_t d : t.shape()) p.add_dims(d);
  p.set_raw_data(std::string(static_cast<const char*>(t.raw()), t.nbytes()));
  return p;
}

StatusOr<ir::Tensor> read_tensor_pb(const std::string& path, std::string* name_out) {
  K3_ASSIGN_OR_RETURN(MappedFile f, MappedFile::open(path));
  ::onnx::TensorProto t;
  if (f.size() > kMaxOnnxFileBytes || !t.ParseFromArray(f.data(), static_cast<int>(f.size())))
    return data_loss(path + ": not a TensorProto (corrupt or truncated)");
  if (name_out != nullptr) *name_out = t.name();
  auto r = tensor_from_proto(t, "tensor '" + printable(t.name()) + "'");
  if (!r.ok()) return r.status().with_context(path);
  return r;
}

Status write_tensor_pb(const std::string& path, const ir::Tensor& t, const std::string& name) {
  const std::string bytes = tensor_to_proto(t, name).SerializeAsString();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return io_error("cannot write " + path);
  return Status();
}

}  // namespace k3::onnxfe
