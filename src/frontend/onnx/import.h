// ONNX -> K3 graph IR, in the onnx dialect (ir/onnx_op_table.h).
//
// Every node becomes one onnx.* op with ONNX semantics (no fusion: passes
// do that later), except: Constant nodes become weight values, Identity and
// Dropout (inference) are dropped. Initializers become weights (copied, kept
// alive by Graph::keep_alive); graph inputs become kInput values whose
// unknown dims are -1 with their dim_param names; graph outputs are marked.
// Output types come from K3's own shape rules and are checked against what
// ONNX shape inference found (a disagreement is an error, never silently
// trusted). Control flow, sequence ops, other domains and unknown ops are
// refused with a one-line error naming the node and op.
#pragma once

#include "frontend/onnx/onnx_model.h"
#include "ir/graph.h"

namespace k3::onnxfe {

struct ImportOptions {
  // Compare each output type with ONNX's inferred value_info (when present).
  bool check_inferred_types = true;
};

StatusOr<ir::Graph> import_onnx(const OnnxModel& model, const ImportOptions& options = {});

}  // namespace k3::onnxfe
