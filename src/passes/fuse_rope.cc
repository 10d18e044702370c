// fuse-rope: the exported rotary embedding becomes one k3.Rope that reads
// the cos/sin tables by position, applied to the projection before the
// head split (rope is per token and per head, so it commutes with the
// split; the attention fusion then sees projection -> head split only).
//
//   y [B,S,H*hd] -> Reshape [B,S,H,hd] -> Transpose(0,2,1,3) -> xt [B,H,S,hd]
//   x1 = Slice(xt, 0:half, last axis)      x2 = Slice(xt, half:, last axis)
//   c  = Unsqueeze(Gather(cos_table [L,half], pos [B,S]), axis 1)
//   s  = Unsqueeze(Gather(sin_table, pos), axis 1)
//        (or, as the dynamo exporter writes the table lookup:
//         Gather(table, pos) = GatherND(table, Unsqueeze(pos, -1), batch_dims 0))
//   out = Concat(Sub(Mul(x1, c), Mul(x2, s)), Add(Mul(x2, c), Mul(x1, s)), last axis)
//
//   ==>  out = Transpose(0,2,1,3)(Reshape(k3.Rope(y, pos, cos_table, sin_table), [B,S,H,hd]))
//
// Every Mul and Add may have its operands in either order.
//
// Guards (each has a must-not-match test in tests/passes/test_fuse_rope.cc):
//   - f32 activations; the tables are constant weights [L, half] with
//     half = hd / 2, and both are gathered (axis 0) by the same positions,
//     an int tensor [B, S]; a GatherND lookup has batch_dims 0 and indices
//     Unsqueeze(pos, -1) (one index per tuple: a row of the table);
//   - the slices split exactly the last axis at half (steps 1), the first
//     from 0, the second to the end;
//   - cos multiplies x1 in the Sub and x2 in the Add, sin the other two
//     (a swapped sign or table is a different rotation);
//   - xt is Transpose(0,2,1,3) of a Reshape of a rank-3 tensor whose last dim
//     is H*hd into [.., .., H, hd];
//   - every Mul, Sub and Add is read only by the next node of the match and
//     is not a graph output; the Slices are read only by the match's Muls.
// A Concat of a Sub and an Add on the last axis that fails a guard is noted.
#include "passes/fuse_rope.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "passes/onnx_match.h"
#include "passes/specialize_shapes.h"

namespace k3::passes {
namespace {

using ir::OpKind;

const ir::Node* producer(const ir::Graph& g, int value) {
  if (value < 0) return nullptr;
  const int p = g.value(value).producer;
  return p < 0 ? nullptr : &g.nodes()[static_cast<size_t>(p)];
}

// Shape tensors, axes and slice bounds are a handful of ints.
std::optional<std::vector<int64_t>> const_ints(const ir::Graph& g, int value) {
  return constant_ints(g, value, 16);
}

std::optional<int64_t> const_int(const ir::Graph& g, int value) {
  auto v = const_ints(g, value);
  if (!v || v->size() != 1) return std::nullopt;
  return (*v)[0];
}

// The last two entries of a Reshape target: from a constant, or from a
// Concat (axis 0) whose trailing parts are constants (the exporters build
// [B, S, H, hd] from Shape() pieces and constant head sizes).
std::optional<std::pair<int64_t, int64_t>> reshape_tail(const ir::Graph& g, int shape) {
  std::vector<int64_t> tail;
  if (auto v = const_ints(g, shape)) {
    tail = *v;
  } else {
    const ir::Node* cat = producer(g, shape);
    if (cat == nullptr || cat->op != OpKind::kOnnxConcat) return std::nullopt;
    for (size_t i = cat->inputs.size(); i-- > 0 && tail.size() < 2;) {
      auto part = const_ints(g, cat->inputs[i]);
      if (!part) return std::nullopt;
      tail.insert(tail.begin(), part->begin(), part->end());
    }
  }
  if (tail.size() < 2) return std::nullopt;
  return std::make_pair(tail[tail.size() - 2], tail[tail.size() - 1]);
}

struct Match {
  Match(const ir::Graph& graph, const Readers& readers) : g(graph), rd(readers) {}
  const ir::Graph& g;
  const Readers& rd;
  std::string why;
  std::vector<int> nodes;  // matched node indices to remove
  int y = -1, pos = -1, cos = -1, sin = -1, shape_in = -1;
  int64_t hd = 0;
  std::vector<int64_t> xt_shape;

  bool fail(std::string msg) {
    why = std::move(msg);
    return false;
  }

  // Slice(xt, start, end, last axis, step 1) -> (xt, start, end).
  bool slice(int value, int& xt, int64_t& start, int64_t& end) {
    const ir::Node* n = producer(g, value);
    if (n == nullptr || n->op != OpKind::kOnnxSlice || n->inputs.size() < 3) return fail("not a Slice");
    xt = n->inputs[0];
    const int64_t rank = static_cast<int64_t>(g.value(xt).shape.size());
    auto s = const_int(g, n->inputs[1]), e = const_int(g, n->inputs[2]);
    std::optional<int64_t> axis = rank - 1, step = 1;
    if (n->inputs.size() > 3 && n->inputs[3] >= 0) axis = const_int(g, n->inputs[3]);
    if (n->inputs.size() > 4 && n->inputs[4] >= 0) step = const_int(g, n->inputs[4]);
    if (!s || !e || !axis || !step) return fail("slice bounds are not constants");
    if ((*axis != -1 && *axis != rank - 1) || *step != 1) return fail("slice is not along the last axis with step 1");
    start = *s;
    end = *e;
    return true;
  }

  // Unsqueeze(Gather(table, pos, axis 0), axis 1) -> table, pos.
  bool table(int value, int& tab, int& p) {
    const ir::Node* u = producer(g, value);
    if (u == nullptr || u->op != OpKind::kOnnxUnsqueeze) return fail("cos/sin is not Unsqueeze(Gather(table))");
    std::optional<std::vector<int64_t>> axes;
    if (u->inputs.size() > 1)
      axes = const_ints(g, u->inputs[1]);
    else if (const auto* a = u->attr_ints("axes"))
      axes = *a;
    if (!axes || axes->size() != 1 || (*axes)[0] != 1) return fail("cos/sin unsqueeze is not at axis 1");
    // Gather(table, pos, axis 0), or GatherND(table, Unsqueeze(pos, -1),
    // batch_dims 0): the same rows (onnx_match.h gathers_rows).
    const ir::Node* ga = producer(g, u->inputs[0]);
    std::string gwhy;
    if (ga == nullptr || !gathers_rows(g, *ga, tab, p, gwhy))
      return fail("cos/sin is not a table gathered along axis 0" + (gwhy.empty() ? "" : " (" + gwhy + ")"));
    const ir::Value& t = g.value(tab);
    if (t.kind != ir::ValueKind::kWeight || t.dtype != ir::DType::kF32 || t.shape.size() != 2)
      return fail("rotary table is not a constant f32 [L, half]");
    const ir::Value& pv = g.value(p);
    if (pv.shape.size() != 2 || (pv.dtype != ir::DType::kI64 && pv.dtype != ir::DType::kI32))
      return fail("positions are not an int [B, S] tensor");
    return true;
  }

  // Mul(a, b) in either order with a == want_x -> the other operand.
  static int mul_other(const ir::Node* n, int x) {
    if (n == nullptr || n->op != OpKind::kOnnxMul || n->inputs.size() != 2) return -1;
    if (n->inputs[0] == x) return n->inputs[1];
    if (n->inputs[1] == x) return n->inputs[0];
    return -1;
  }

  bool run(int concat_index) {
    const ir::Node& cat = g.nodes()[static_cast<size_t>(concat_index)];
    const int out = cat.outputs[0];
    const ir::Value& ov = g.value(out);
    const int64_t rank = static_cast<int64_t>(ov.shape.size());
    const int64_t axis = cat.attr_int("axis", 0);
    if (cat.inputs.size() != 2 || rank != 4 || (axis != -1 && axis != 3)) return fail("");
    const ir::Node* sub = producer(g, cat.inputs[0]);
    const ir::Node* add = producer(g, cat.inputs[1]);
    if (sub == nullptr || add == nullptr || sub->op != OpKind::kOnnxSub || add->op != OpKind::kOnnxAdd) return fail("");
    if (!is_f32(g, out)) return fail("not f32");
    // Sub(Mul(x1, c), Mul(x2, s)).
    const ir::Node* m0 = producer(g, sub->inputs[0]);
    const ir::Node* m1 = producer(g, sub->inputs[1]);
    if (m0 == nullptr || m1 == nullptr || m0->op != OpKind::kOnnxMul || m1->op != OpKind::kOnnxMul)
      return fail("Sub operands are not products");
    // Which operand of m0 is the slice: the one produced by a Slice.
    int x1 = -1, c = -1;
    for (int k = 0; k < 2 && x1 < 0; ++k) {
      const ir::Node* p = producer(g, m0->inputs[static_cast<size_t>(k)]);
      if (p != nullptr && p->op == OpKind::kOnnxSlice) {
        x1 = m0->inputs[static_cast<size_t>(k)];
        c = m0->inputs[static_cast<size_t>(1 - k)];
      }
    }
    if (x1 < 0) return fail("no slice in the first product");
    int x2 = -1, s = -1;
    for (int k = 0; k < 2 && x2 < 0; ++k) {
      const ir::Node* p = producer(g, m1->inputs[static_cast<size_t>(k)]);
      if (p != nullptr && p->op == OpKind::kOnnxSlice) {
        x2 = m1->inputs[static_cast<size_t>(k)];
        s = m1->inputs[static_cast<size_t>(1 - k)];
      }
    }
    if (x2 < 0) return fail("no slice in the second product");
    // Add(Mul(x2, c), Mul(x1, s)) in either order.
    const ir::Node* a0 = producer(g, add->inputs[0]);
    const ir::Node* a1 = producer(g, add->inputs[1]);
    const bool straight = mul_other(a0, x2) == c && mul_other(a1, x1) == s;
    const bool swapped = mul_other(a1, x2) == c && mul_other(a0, x1) == s;
    if (!straight && !swapped) return fail("the Add is not x2*cos + x1*sin (a different rotation)");
    // The slices.
    int xt1 = -1, xt2 = -1;
    int64_t s1 = 0, e1 = 0, s2 = 0, e2 = 0;
    if (!slice(x1, xt1, s1, e1) || !slice(x2, xt2, s2, e2)) return false;
    if (xt1 != xt2) return fail("the two halves come from different tensors");
    const ir::Value& xtv = g.value(xt1);
    if (xtv.shape.size() != 4) return fail("rotated tensor is not [B, H, S, hd]");
    // Head size: the split point says half of it; the head split's Reshape
    // target (below) must agree.
    const int64_t half = e1;
    hd = 2 * half;
    if (s1 != 0 || half < 1 || s2 != half || e2 < hd || (xtv.shape[3] >= 0 && xtv.shape[3] != hd))
      return fail("slices do not split the head at half");
    // Tables.
    int pc = -1, ps = -1;
    if (!table(c, cos, pc) || !table(s, sin, ps)) return false;
    if (pc != ps) return fail("cos and sin are gathered by different positions");
    if (g.value(cos).shape[1] != half || g.value(sin).shape != g.value(cos).shape)
      return fail("rotary tables are not [L, head_dim/2]");
    pos = pc;
    // Head split: Transpose(0,2,1,3)(Reshape(y, [.., .., H, hd])).
    const ir::Node* tr = producer(g, xt1);
    const std::vector<int64_t> perm{0, 2, 1, 3};
    if (tr == nullptr || tr->op != OpKind::kOnnxTranspose || tr->attr_ints("perm") == nullptr ||
        *tr->attr_ints("perm") != perm)
      return fail("rotated tensor is not Transpose(0,2,1,3) of the head split");
    const ir::Node* rs = producer(g, tr->inputs[0]);
    if (rs == nullptr || rs->op != OpKind::kOnnxReshape) return fail("head split is not a Reshape");
    y = rs->inputs[0];
    shape_in = rs->inputs[1];
    const ir::Value& yv = g.value(y);
    const auto tail = reshape_tail(g, shape_in);
    if (!tail || tail->second != hd || tail->first < 1) return fail("head split target is not [.., .., H, hd]");
    const int64_t heads = tail->first;
    if (yv.shape.size() != 3 || yv.shape[2] != heads * hd || !is_f32(g, y))
      return fail("head split input is not f32 [B, S, H*hd]");
    xt_shape = {yv.shape[0], heads, yv.shape[1], hd};
    // Single consumers of what the fused node replaces.
    const ir::Node* chain[] = {sub, add, m0, m1, a0, a1};
    for (const ir::Node* n : chain)
      if (!rd.single(n->outputs[0])) return fail("an intermediate product has another reader");
    for (int x : {x1, x2})
      for (int r : rd.of(x)) {
        const ir::Node& rn = g.nodes()[static_cast<size_t>(r)];
        if (&rn != m0 && &rn != m1 && &rn != a0 && &rn != a1) return fail("a half is read outside the rotation");
      }
    for (const ir::Node* n : {sub, add, m0, m1, a0, a1, producer(g, x1), producer(g, x2)})
      nodes.push_back(static_cast<int>(n - g.nodes().data()));
    nodes.push_back(concat_index);
    return true;
  }
};

}  // namespace

StatusOr<bool> FuseRope::run(ir::Graph& g) {
  const Readers rd(g);
  std::vector<Fusion> fusions;
  std::vector<bool> used(g.nodes().size(), false);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    if (g.nodes()[i].op != OpKind::kOnnxConcat) continue;
    Match m(g, rd);
    if (!m.run(static_cast<int>(i))) {
      if (!m.why.empty()) stats_.notes.push_back("node " + g.nodes()[i].name + ": rope pattern but " + m.why);
      continue;
    }
    ++stats_.matched;
    if (std::any_of(m.nodes.begin(), m.nodes.end(), [&](int n) { return used[static_cast<size_t>(n)]; })) continue;
    for (int n : m.nodes) used[static_cast<size_t>(n)] = true;
    const ir::Node& cat = g.nodes()[i];
    // A copy: add_value below may reallocate the value table.
    const ir::Value yv = g.value(m.y);
    // New values: the rotated projection and its head split.
    ir::Value rot = yv;
    rot.name = cat.name + "/rope";
    rot.kind = ir::ValueKind::kActivation;
    rot.producer = -1;
    rot.is_output = false;
    rot.data = nullptr;
    const int rot_id = g.add_value(rot);
    ir::Value head = g.value(cat.outputs[0]);
    head.name = cat.name + "/rope_split";
    head.producer = -1;
    head.is_output = false;
    // Reshape output: [B, S, H, hd] (xt is [B, H, S, hd]).
    head.shape = {yv.shape[0], yv.shape[1], m.xt_shape[1], m.hd};
    head.dim_params.clear();
    if (!yv.dim_params.empty()) head.dim_params = {yv.dim_params[0], yv.dim_params[1], "", ""};
    const int head_id = g.add_value(head);
    Fusion f;
    f.nodes = m.nodes;
    f.before.push_back(
        ir::Node{OpKind::kK3Rope, cat.name + "/k3_rope", {m.y, m.pos, m.cos, m.sin}, {rot_id}, {{"head_dim", m.hd}}});
    // The split target as a constant [0, 0, H, hd] (0 = keep that input dim),
    // so the split's shape is known wherever y's is.
    auto target = std::make_shared<std::vector<int64_t>>(std::vector<int64_t>{0, 0, m.xt_shape[1], m.hd});
    g.keep_alive.push_back(target);
    const int target_id = g.add_weight(cat.name + "/split_shape", ir::DType::kI64, {4}, target->data());
    f.before.push_back(ir::Node{OpKind::kOnnxReshape, cat.name + "/split", {rot_id, target_id}, {head_id}, {}});
    f.fused = ir::Node{OpKind::kOnnxTranspose,
                       cat.name + "/transpose",
                       {head_id},
                       {cat.outputs[0]},
                       {{"perm", std::vector<int64_t>{0, 2, 1, 3}}}};
    fusions.push_back(std::move(f));
    ++stats_.applied;
  }
  if (fusions.empty()) return false;
  apply_fusions(g, fusions);
  // The new head split may know dims the exported one did not (or the
  // reverse): re-infer every onnx node's types so they agree again.
  K3_RETURN_IF_ERROR(refresh_all_onnx_types(g));
  return true;
}

}  // namespace k3::passes
