// constant-folding: evaluates at compile time the onnx.* nodes whose result
// does not depend on the step's inputs, and turns their outputs into
// weights. Imported graphs are full of such nodes: shape arithmetic
// (Shape -> Gather -> Unsqueeze -> Concat -> a Reshape target), rotary
// cos/sin tables gathered by constant positions, masks built from Range.
//
//   For each node, in topological order (so a chain folds in one run):
//   1. re-run its shape rule (refresh_onnx_types): inputs folded earlier in
//      this run are weights now, so e.g. a Reshape target became known;
//   2. fold it when
//      - all its present inputs are weights (omitted optional inputs, id -1,
//        are fine): run it with k3::onnx_ref::eval_node, the very code the
//        O0 interpreter runs, so folded values equal interpreted ones;
//      - or it is onnx.Shape and the dims it reads ([start, end) of its
//        input's shape) are known, or onnx.Size and its input's shape is
//        fully known, whatever the input's kind (an activation's shape is
//        static even when its values are not);
//   3. each output value becomes a weight with an owned buffer (kept alive
//      by Graph::keep_alive), keeping its name, so a graph output that is
//      folded keeps its name and stays an output.
//   Folded nodes are then removed with compact(); weights that nothing reads
//   any more are left to dead-code, which runs next.
//
// Guards (each has a must-not-fold test in tests/passes/test_constant_folding.cc):
//   - a node with any input that is not a weight (a graph input, an
//     activation, state) is not folded (Shape/Size aside, as above);
//   - data-dependent ops (NonZero, TopK, ...) fold only when their inputs
//     are constant, like everything else: the rule alone decides nothing;
//   - an output larger than kMaxFoldedBytes (before evaluation when the
//     shape is known, after it for NonZero) is not folded: a note says so;
//   - a node whose evaluation fails (e.g. a Gather index out of range) is
//     left for the run time to report, with a note;
//   - fused (non-onnx) ops are never folded: they have no reference kernel
//     here and their inputs are activations anyway.
//
// Stats: matched = nodes whose inputs allow folding (those the cap or an
// evaluation error then stop included), applied = nodes folded.
#include "passes/constant_folding.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ir/tensor.h"
#include "kernels/onnx_ref/onnx_ref.h"
#include "passes/graph_edit.h"
#include "passes/specialize_shapes.h"
#include "util/checked.h"

namespace k3::passes {
namespace {

std::string where(const ir::Node& n) {
  return "node " + n.name + " (" + ir::op_name(n.op) + ")";
}

// onnx.Shape / onnx.Size whose result the input's static shape decides;
// nullopt when a dim it reads is unknown.
std::optional<ir::Tensor> fold_shape_of(const ir::Graph& g, const ir::Node& n) {
  if (n.inputs.size() != 1 || n.inputs[0] < 0) return std::nullopt;
  const ir::Value& x = g.value(n.inputs[0]);
  const int64_t r = static_cast<int64_t>(x.shape.size());
  if (n.op == ir::OpKind::kOnnxSize) {
    if (x.has_unknown_dims()) return std::nullopt;
    auto t = ir::Tensor::zeros(ir::DType::kI64, {});
    if (!t) return std::nullopt;
    int64_t numel = 1;
    for (int64_t d : x.shape) numel *= d;  // verify() checked it does not overflow
    t->mut<int64_t>()[0] = numel;
    return t;
  }
  // The same [start, end) clamping as the shape rule and the kernel.
  int64_t st = n.attr_int("start", 0), en = n.attr_int("end", r);
  if (st < 0) st += r;
  if (en < 0) en += r;
  st = std::clamp<int64_t>(st, 0, r);
  en = std::clamp<int64_t>(en, 0, r);
  const int64_t len = std::max<int64_t>(0, en - st);
  for (int64_t i = 0; i < len; ++i)
    if (x.shape[static_cast<size_t>(st + i)] < 0) return std::nullopt;
  auto t = ir::Tensor::zeros(ir::DType::kI64, {len});
  if (!t) return std::nullopt;
  for (int64_t i = 0; i < len; ++i) t->mut<int64_t>()[i] = x.shape[static_cast<size_t>(st + i)];
  return t;
}

bool all_inputs_constant(const ir::Graph& g, const ir::Node& n) {
  for (int id : n.inputs)
    if (id >= 0 && g.value(id).kind != ir::ValueKind::kWeight) return false;
  return true;
}

}  // namespace

StatusOr<bool> ConstantFolding::run(ir::Graph& g) {
  std::vector<bool> keep(g.nodes().size(), true);
  int64_t folded = 0;
  for (size_t ni = 0; ni < g.nodes().size(); ++ni) {
    if (!ir::is_onnx_op(g.nodes()[ni].op)) continue;
    // Earlier folds may have made this node's inputs constants.
    K3_RETURN_IF_ERROR(refresh_onnx_types(g, ni).status());
    const ir::Node& n = g.nodes()[ni];
    std::vector<ir::Tensor> results;
    if (n.op == ir::OpKind::kOnnxShape || n.op == ir::OpKind::kOnnxSize) {
      std::optional<ir::Tensor> t = fold_shape_of(g, n);
      if (!t) continue;
      ++stats_.matched;
      results.push_back(std::move(*t));
    } else {
      if (!all_inputs_constant(g, n)) continue;
      ++stats_.matched;
      // Size guard before evaluating, where the rule knows the shapes.
      bool too_big = false;
      for (int out : n.outputs) {
        const ir::Value& v = g.value(out);
        if (v.has_unknown_dims()) continue;  // data-dependent: checked after evaluation
        const auto bytes = checked_numel_bytes(v.shape, ir::dtype_size(v.dtype));
        too_big = too_big || !bytes || *bytes > kMaxFoldedBytes;
      }
      if (!too_big) {
        std::vector<ir::Tensor> views(n.inputs.size());
        std::vector<const ir::Tensor*> in(n.inputs.size(), nullptr);
        for (size_t i = 0; i < n.inputs.size(); ++i) {
          if (n.inputs[i] < 0) continue;
          const ir::Value& v = g.value(n.inputs[i]);
          views[i] = ir::Tensor::view(v.dtype, v.shape, v.data, nullptr);
          in[i] = &views[i];
        }
        auto r = onnx_ref::eval_node(g, n, std::move(in));
        if (!r.ok()) {
          stats_.notes.push_back("not folded (left for run time): " + r.status().message());
          continue;
        }
        results = std::move(*r);
        for (const ir::Tensor& t : results) too_big = too_big || t.nbytes() > kMaxFoldedBytes;
      }
      if (too_big) {
        stats_.notes.push_back("not folded: " + where(n) + " has an output over the " +
                               std::to_string(kMaxFoldedBytes >> 20) + " MiB folding cap");
        continue;
      }
    }
    if (results.size() < n.outputs.size()) return internal_error(where(n) + ": evaluation gave too few outputs");
    for (size_t o = 0; o < n.outputs.size(); ++o) {
      ir::Tensor& t = results[o];
      if (t.owner() == nullptr) {  // a view: copy it into a buffer of its own
        auto copy = ir::Tensor::zeros(t.dtype(), t.shape());
        if (!copy) return internal_error(where(n) + ": cannot copy a folded output");
        std::memcpy(copy->raw_mut(), t.raw(), t.nbytes());
        t = std::move(*copy);
      }
      ir::Value& v = g.values()[static_cast<size_t>(n.outputs[o])];
      v.kind = ir::ValueKind::kWeight;
      v.dtype = t.dtype();
      v.shape = t.shape();
      v.dim_params.clear();
      v.row_dim = ir::RowDim::kFixed;
      v.producer = -1;
      v.data = t.raw();
      g.keep_alive.push_back(t.owner());
    }
    keep[ni] = false;
    ++folded;
  }
  if (folded == 0) return false;
  stats_.applied += folded;
  g = compact(g, keep);
  return true;
}

}  // namespace k3::passes
