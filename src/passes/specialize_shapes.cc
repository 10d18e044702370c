// specialize-shapes: the compiler's --input-shape. An imported ONNX graph
// may leave input dims unknown (-1) with a dim_param name ("batch", "seq",
// "past"); the user fixes some of those names to values, and this pass
//
//   1. replaces every graph-input dim whose dim_param has a given value by
//      that constant (the name is dropped from that dim: it is known now);
//   2. re-runs the shape rule of every onnx.* node, in order, with what is
//      now known (weights' data included, as the importer does), so unknown
//      dims downstream become known. Dims still unknown keep their name.
//
// It runs before constant-folding so that folding sees static shapes
// (Shape of an activation folds only when its dims are known).
//
// Guards (each has a test in tests/passes/test_specialize_shapes.cc):
//   - no dims given -> nothing to do, run() returns false;
//   - a value < 0 -> error;
//   - a name given twice with different values -> error;
//   - an input whose named dim is already a different known size -> error
//     (the model says otherwise; silently changing it would break it);
//   - a name no input uses -> error naming it (most likely a typo);
//   - a shape rule that refuses the specialized shapes (a Reshape whose
//     element count no longer works out) -> error naming the node;
//   - fused (non-onnx) nodes are left alone: their shapes are static.
//
// Stats: matched = input dims specialized, applied = values whose type
// changed (inputs and node outputs).
#include "passes/specialize_shapes.h"

#include <map>

#include "ir/onnx_shape.h"

namespace k3::passes {

namespace {

// Drops the dim_params vector when no dim has a name left.
void tidy_dim_params(ir::Value& v) {
  for (const std::string& p : v.dim_params)
    if (!p.empty()) return;
  v.dim_params.clear();
}

}  // namespace

StatusOr<int64_t> refresh_onnx_types(ir::Graph& g, size_t node_index) {
  const ir::Node& n = g.nodes()[node_index];
  if (!ir::is_onnx_op(n.op)) return int64_t{0};
  const std::string where = "node " + n.name + " (" + ir::op_name(n.op) + ")";
  const std::vector<ir::OnnxInput> in = ir::onnx_inputs_of(g, n);
  std::vector<ir::OutType> types;
  K3_RETURN_IF_ERROR(ir::infer_onnx(n, in, types).with_context(where));
  if (types.size() < n.outputs.size()) return internal_error(where + ": shape rule gave too few outputs");
  int64_t changed = 0;
  for (size_t o = 0; o < n.outputs.size(); ++o) {
    ir::Value& v = g.values()[static_cast<size_t>(n.outputs[o])];
    const ir::OutType& t = types[o];
    if (v.shape == t.shape && v.dtype == t.dtype) continue;
    if (v.shape.size() != t.shape.size() || v.dtype != t.dtype)
      return invalid_argument(where + ": output " + v.name + " would change from " +
                              std::string(ir::dtype_name(v.dtype)) + ir::shape_to_string(v.shape) + " to " +
                              std::string(ir::dtype_name(t.dtype)) + ir::shape_to_string(t.shape));
    for (size_t d = 0; d < t.shape.size(); ++d) {
      if (v.shape[d] >= 0 && t.shape[d] >= 0 && v.shape[d] != t.shape[d])
        return invalid_argument(where + ": output " + v.name + " would change from " + ir::shape_to_string(v.shape) +
                                " to " + ir::shape_to_string(t.shape));
      if (t.shape[d] >= 0 && !v.dim_params.empty()) v.dim_params[d].clear();
    }
    v.shape = t.shape;
    tidy_dim_params(v);
    ++changed;
  }
  return changed;
}

Status refresh_all_onnx_types(ir::Graph& g) {
  for (size_t i = 0; i < g.nodes().size(); ++i) K3_RETURN_IF_ERROR(refresh_onnx_types(g, i).status());
  return Status();
}

StatusOr<bool> SpecializeShapes::run(ir::Graph& g) {
  if (dims_.empty()) return false;
  std::map<std::string, int64_t> want;
  for (const auto& [name, size] : dims_) {
    if (size < 0)
      return invalid_argument("--input-shape: dim '" + name + "' must be >= 0 (got " + std::to_string(size) + ")");
    auto [it, fresh] = want.emplace(name, size);
    if (!fresh && it->second != size)
      return invalid_argument("--input-shape: dim '" + name + "' is given twice (" + std::to_string(it->second) +
                              " and " + std::to_string(size) + ")");
  }
  std::map<std::string, bool> used;
  int64_t specialized = 0, changed_values = 0;
  for (int id : g.inputs()) {
    ir::Value& v = g.values()[static_cast<size_t>(id)];
    if (v.dim_params.empty()) continue;
    bool changed = false;
    for (size_t d = 0; d < v.shape.size() && d < v.dim_params.size(); ++d) {
      auto it = want.find(v.dim_params[d]);
      if (v.dim_params[d].empty() || it == want.end()) continue;
      used[it->first] = true;
      if (v.shape[d] >= 0 && v.shape[d] != it->second)
        return invalid_argument("--input-shape: input '" + v.name + "' dim " + std::to_string(d) + " ('" + it->first +
                                "') is already " + std::to_string(v.shape[d]) + ", not " + std::to_string(it->second));
      if (v.shape[d] >= 0) continue;
      v.shape[d] = it->second;
      v.dim_params[d].clear();
      ++specialized;
      changed = true;
    }
    tidy_dim_params(v);
    changed_values += changed ? 1 : 0;
  }
  for (const auto& [name, size] : want)
    if (!used.count(name)) return invalid_argument("--input-shape: no input has a dim named '" + name + "'");
  for (size_t ni = 0; ni < g.nodes().size(); ++ni) {
    K3_ASSIGN_OR_RETURN(const int64_t c, refresh_onnx_types(g, ni));
    changed_values += c;
  }
  stats_.matched += specialized;
  stats_.applied += changed_values;
  return specialized > 0 || changed_values > 0;
}

}  // namespace k3::passes
