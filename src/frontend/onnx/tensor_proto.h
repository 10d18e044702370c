// ONNX TensorProto <-> ir::Tensor: initializers, Constant values, and the
// .pb tensor files of ONNX test data and `k3 run` inputs/outputs.
#pragma once

#include <onnx/onnx_pb.h>

#include <string>

#include "ir/tensor.h"
#include "util/status.h"

namespace k3::onnxfe {

// Decodes a tensor (raw_data, the typed fields, or external data read from
// a file under `external_dir`; empty = external data refused). `what` names
// it in errors ("initializer 'w'"). External locations must be relative
// paths inside external_dir (no "..", not absolute: a model file must not
// read arbitrary files), and offset/length must lie inside the file and
// match the dims.
StatusOr<ir::Tensor> tensor_from_proto(const ::onnx::TensorProto& t, const std::string& what,
                                       const std::string& external_dir = {});
// Encodes as raw_data (little-endian, as ONNX stores it).
::onnx::TensorProto tensor_to_proto(const ir::Tensor& t, const std::string& name);

// A serialized TensorProto file; errors name the path. `name_out` (may be
// null) receives the tensor's name field.
StatusOr<ir::Tensor> read_tensor_pb(const std::string& path, std::string* name_out = nullptr);
Status write_tensor_pb(const std::string& path, const ir::Tensor& t, const std::string& name);

}  // namespace k3::onnxfe
