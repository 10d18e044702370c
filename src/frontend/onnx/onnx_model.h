// Loading an ONNX model file: parse, validate, run ONNX shape inference.
//
// This is the boundary between K3 and the ONNX/protobuf libraries: a file
// that is missing, not ONNX, truncated or inconsistent becomes a Status with
// a one-line message, every exception the ONNX library throws is caught
// here, and a crash inside ONNX shape inference is contained in a child
// process (see OnnxLoadOptions::isolate_shape_inference). Code after this
// point (lint, importer) may rely on the invariants checked by
// validate_model() for the top-level graph:
//   - ir_version set, a graph present, a default-domain opset imported;
//   - every node has an op_type, every node input names a graph input, an
//     initializer or an output of an earlier node (topological order, SSA);
//   - every graph output is defined;
//   - initializer and Constant tensors: dims non-negative, element count
//     does not overflow, embedded payload size matches the dims.
// Subgraphs (If/Loop/Scan bodies) are not validated: K3 rejects control flow.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "util/status.h"

namespace k3::onnxfe {

// Protobuf cannot parse a message of 2 GiB or more; larger models keep their
// weights in external data files next to the .onnx file.
inline constexpr uint64_t kMaxOnnxFileBytes = 0x7fffffffu;

struct OnnxLoadOptions {
  uint64_t max_file_bytes = kMaxOnnxFileBytes;
  // Runs onnx::shape_inference::InferShapes (with data propagation, so
  // shapes computed by Shape->Gather->Concat chains are known).
  bool infer_shapes = true;
  // Runs shape inference in a forked child process. ONNX's inference
  // functions dereference missing types and crash on some valid-looking
  // models (ONNX 1.12: Shape -> Expand after an op without a schema, with
  // data propagation), so a crash there must not take K3 down. The child
  // sends back the inferred value_info; if it dies, inference is retried
  // without data propagation, then given up (shapes stay unknown and the
  // error is recorded). fork() is only safe while the process has a single
  // thread: load models before starting thread pools, or turn this off.
  bool isolate_shape_inference = true;
  // Seconds the child may run before it is killed (an inference hang).
  unsigned shape_inference_timeout_s = 300;
};

class OnnxModel {
 public:
  // Reads and validates a .onnx file. Errors name the path.
  static StatusOr<OnnxModel> load(const std::string& path, const OnnxLoadOptions& options = {});
  // Same, from serialized bytes already in memory.
  static StatusOr<OnnxModel> parse(const void* data, size_t size, const OnnxLoadOptions& options = {});
  // Validates (and shape-infers) a model built in memory, e.g. by tests.
  static StatusOr<OnnxModel> from_proto(::onnx::ModelProto proto, const OnnxLoadOptions& options = {});

  OnnxModel(OnnxModel&&) noexcept = default;
  OnnxModel& operator=(OnnxModel&&) noexcept = default;

  // The model, with value_info filled in by shape inference.
  const ::onnx::ModelProto& proto() const { return *proto_; }
  const ::onnx::GraphProto& graph() const { return proto_->graph(); }
  // Opset version of the default domain.
  int64_t opset() const { return opset_; }
  // Directory external data locations are relative to (the .onnx file's;
  // empty for models parsed from memory, which cannot use external data).
  const std::string& base_dir() const { return base_dir_; }
  // Empty when shape inference succeeded or did not run; otherwise the
  // (one-line) reason it stopped or ran degraded. The model is still
  // usable: shapes inferred before a failure are kept.
  const std::string& shape_inference_error() const { return shape_inference_error_; }

  // Type of a top-level tensor as declared or inferred (graph inputs,
  // value_info, graph outputs); nullptr when nothing is known about it.
  // Initializers are not included: see find_initializer().
  const ::onnx::TypeProto* find_type(const std::string& name) const;
  const ::onnx::TensorProto* find_initializer(const std::string& name) const;

 private:
  OnnxModel() = default;
  void index();

  // Held by pointer so the indexes below, which point into it, stay valid
  // when the OnnxModel moves.
  std::unique_ptr<::onnx::ModelProto> proto_;
  int64_t opset_ = 0;
  std::string base_dir_;
  std::string shape_inference_error_;
  std::unordered_map<std::string, const ::onnx::TypeProto*> types_;
  std::unordered_map<std::string, const ::onnx::TensorProto*> initializers_;
};

// Checks the invariants listed at the top of this file.
Status validate_model(const ::onnx::ModelProto& model);

// Bytes per element of an ONNX TensorProto data type; nullopt for STRING,
// UNDEFINED, sub-byte and unknown types.
std::optional<uint64_t> onnx_elem_bytes(int32_t data_type);
// ONNX data type name ("FLOAT", "INT64", ...) or "type N".
std::string onnx_type_name(int32_t data_type);

// Element count from dims; nullopt on negative dims or overflow.
std::optional<uint64_t> tensor_numel(const ::onnx::TensorProto& t);
// Size of the tensor's data as the dims and type say (not what is stored,
// so it also works for external data); nullopt when not computable.
std::optional<uint64_t> tensor_nominal_bytes(const ::onnx::TensorProto& t);

// The values of a small numeric tensor (at most max_elems elements) as
// doubles; nullopt for external data, strings, unsupported types or larger
// tensors. Safe on any tensor that passed validation.
std::optional<std::vector<double>> tensor_values(const ::onnx::TensorProto& t, size_t max_elems = 64);

// A name from the file made safe for a one-line message: control characters
// become '?', and long names are shortened.
std::string printable(std::string_view name);

}  // namespace k3::onnxfe
