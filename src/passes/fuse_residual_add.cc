// fuse-residual-add: a residual Add of a Linear's or Moe's result becomes
// that op's epilogue (attr residual, ir/op_table.h).
//
//   x --> Linear(x, W) --> y --+
//                               Add --> h'        ==>   Linear(x, W, h; residual 1) --> h'
//   h -------------------------+
//
// (the same with Moe in Linear's place). Each decoder layer has two: the
// attention output projection and the MoE. A separate Add reads both
// operands and writes the sum, one more pass over a [T, D] block that at
// prefill (128 x 512 f32: 256 KiB each) no longer sits in L1, on one
// thread; fused, each thread adds its own columns while they are in cache.
// Results are unchanged bit for bit: the op computes its output as before
// and then adds the residual, the same float addition the Add did (in
// either operand order; addition commutes).
//
// Guards (each has a must-not-match test in tests/passes/test_fuse_residual_add.cc):
//   - the Add has scale 1 (an Add with scale computes a + scale * b, which
//     is not y + h);
//   - the operand y is made by a Linear with one output (no splits) or a
//     Moe, which has no residual yet;
//   - y is read by this Add only, once (Add(y, y) reads it twice), and is
//     not a graph output: it disappears;
//   - h has y's type, f32 [T, N] with the same row dim (Add's shape rule
//     guarantees it; the fused op's rule checks it again).
// The fused node takes the Add's place in the order: every input of the
// Linear or Moe was computed before it, so also before the Add, and h may
// be computed after it. It keeps the Add's output value (its name, which
// tensor dumps and readers use) and is named after the op, "+residual".
#include "passes/fuse_residual_add.h"

#include <vector>

#include "passes/graph_edit.h"

namespace k3::passes {
namespace {

using ir::OpKind;

bool fusable_producer(const ir::Node& n) {
  if (n.find_attr("residual") != nullptr) return false;
  if (n.op == OpKind::kMoe) return true;
  return n.op == OpKind::kLinear && n.outputs.size() == 1 && n.find_attr("splits") == nullptr;
}

}  // namespace

StatusOr<bool> FuseResidualAdd::run(ir::Graph& g) {
  const std::vector<int> uses = count_uses(g);
  std::vector<bool> keep(g.nodes().size(), true);
  std::vector<ir::Node>& nodes = g.mutable_nodes();
  for (size_t ai = 0; ai < nodes.size(); ++ai) {
    const ir::Node& add = nodes[ai];
    if (add.op != OpKind::kAdd || add.inputs.size() != 2) continue;
    // The op's result as the second operand first (a decoder's h + f(h)).
    for (int side : {1, 0}) {
      const int y = add.inputs[static_cast<size_t>(side)], h = add.inputs[static_cast<size_t>(1 - side)];
      const int p = g.value(y).producer;  // -1: an input or weight
      if (p < 0 || !keep[static_cast<size_t>(p)]) continue;
      const ir::Node& op = nodes[static_cast<size_t>(p)];
      if (op.op != OpKind::kLinear && op.op != OpKind::kMoe) continue;
      ++stats_.matched;
      const ir::Value& yv = g.value(y);
      const ir::Value& hv = g.value(h);
      const char* miss = nullptr;
      if (add.attr_float("scale", 1.0) != 1.0)
        miss = "the Add has a scale";
      else if (!fusable_producer(op))
        miss = "a split Linear or one with a residual already";
      else if (uses[static_cast<size_t>(y)] != 1 || yv.is_output)
        miss = "its result has other readers";
      else if (hv.dtype != ir::DType::kF32 || hv.shape != yv.shape || hv.row_dim != yv.row_dim)
        miss = "the residual's type differs";
      if (miss != nullptr) {
        stats_.notes.push_back(add.name + ": not fused into " + op.name + ": " + miss);
        continue;
      }
      ir::Node fused = op;
      fused.name = op.name + "+residual";
      fused.inputs.push_back(h);
      fused.attrs.push_back({"residual", int64_t{1}});
      fused.outputs = add.outputs;
      keep[static_cast<size_t>(p)] = false;
      nodes[ai] = std::move(fused);  // `add` and `op` are not used after this
      ++stats_.applied;
      break;
    }
  }
  if (stats_.applied == 0) return false;
  g = compact(g, keep);
  K3_RETURN_IF_ERROR(g.verify().with_context("fuse-residual-add"));
  return true;
}

}  // namespace k3::passes
