// fuse-moe: folds an exported mixture-of-experts layer into one k3.Moe
// (docs/onnx-lowering.md): x [..., D], gate [E, D], per expert up [F, D]
// (gate [F, D] for swiglu) down [D, F] -> [..., D]; attrs n_experts, top_k,
// swiglu. Weights come out in PyTorch's [out, in] layout: MatMul
// initializers ([in, out]) are transposed here, at compile time, into new
// weights the .k3m stores; stacked [E, ., .] weights are split into per-
// expert views of the same buffer (no copy).
//
// Every form starts at the same anchor, the router:
//
//   x --Reshape--> xf [N, D] --MatMul(Wg [D, E] const)--> logits [N, E]
//        --TopK(k = K, axis -1, largest)--> values [N, K] --Softmax(-1)--> s
//                                           idx    [N, K]
//
// (a) naive export (NaiveExportModel.moe: torch.where + index_add per expert)
//
//   for each expert e (in any order, each e in 0..E-1 exactly once):
//     idx --Equal(e)--> NonZero --Transpose--> Split(axis 1) --> Squeeze --> tok_e
//                                                            --> Squeeze --> slot_e
//     xf --Gather(tok_e, axis 0)--> FFN_e --> y_e
//     y_e --Mul(w_e)--> [Expand]* --> u_e            w_e [n, 1] derived from s, tok_e, slot_e
//     acc_{i+1} = Add(acc_i, ScatterElements(zeros, index(tok_e), u_e))   (TorchScript index_add)
//              |  ScatterElements(acc_i, index(tok_e), u_e, reduction=add)
//              |  ScatterND(acc_i, tok_e[:, None], u_e, reduction=add)
//   acc_0 = ConstantOfShape(Shape(xf), 0) | a constant of zeros
//         | Expand(0.0 f32 scalar, Shape(xf));  y = acc_E
//
//   The dynamo exporter writes the same dispatch with other ops:
//     Transpose --> Slice(cols 0:1, axis 1) --> Squeeze --> tok_e   (for the Split)
//               --> Slice(cols 1:2, axis 1) --> Squeeze --> slot_e
//     xf --GatherND(Unsqueeze(tok_e, -1), batch_dims 0)--> rows    (= Gather(xf, tok_e, axis 0))
//     w_e = Unsqueeze(GatherND(s, Concat(Unsqueeze(tok_e, -1), Unsqueeze(slot_e, -1))), -1)
//                                                                 (= s[tok_e, slot_e], [n, 1])
//     ScatterND(acc_i, Unsqueeze(tok_e, -1), u_e, reduction=add)
//   and Shape(xf) may carry start=0 (the whole shape).
//
//   FFN (gelu):   MatMul(Wu [D, F]) --> Gelu(approximate none) --> MatMul(Wd [F, D])
//   FFN (swiglu): MatMul(Wg') --+--> Sigmoid --> Mul(g, sigmoid(g)) --> Mul(., up) --> MatMul(Wd)
//                 MatMul(Wu) --+-------------------------------------^
//   (fuse-gelu runs first and turns the exported erf decomposition into
//   onnx.Gelu; a decomposed GeLU left over is a near miss.)
//
// (c) static decode (StaticDecodeModel.moe: stacked weights gathered by index)
//
//   xv = Unsqueeze/Reshape(xf) [N, 1, D, 1]
//   up   = MatMul(Gather(Wup [E, F, D], idx), xv)        [N, K, F, 1]
//   h    = Gelu(up) | Sigmoid/Mul SwiGLU with MatMul(Gather(Wgate [E, F, D], idx), xv)
//   down = MatMul(Gather(Wdown [E, D, F], idx), h)       [N, K, D, 1]
//   y    = ReduceSum(Squeeze(down, 3) * Unsqueeze(s, 2), axes 1, keepdims 0)
//
// (b) static prefill (StaticPrefillModel.moe, the article's dense one-hot
//     mask: every expert on every token, mixed by a [N, E] weight matrix)
//
//   dense = ScatterElements(zeros [N, E], idx, s, axis 1)     [N, E]
//   xu    = Unsqueeze/Reshape(xf) [1, N, D]
//   up    = MatMul(xu, Wup [E, D, F])                          [E, N, F]
//   h     = Gelu(up) | Sigmoid/Mul SwiGLU with MatMul(xu, Wgate [E, D, F])
//   down  = MatMul(h, Wdown [E, F, D])                         [E, N, D]
//   y     = ReduceSum(down * Unsqueeze(Transpose(dense, [1, 0]), 2), axes 0, keepdims 0)
//
//   k3.Moe computes the same sum over the chosen experts only (the other
//   columns of `dense` are 0): E/K times fewer expert FLOPs and bytes.
//
// The output: y [N, D]. When y's one reader is Reshape(y, shape of x) that
// restores x exactly (x's constant shape, Shape(x), or a Concat of
// Unsqueeze(Gather(Shape(x), i)) for i = 0..rank-1, or -- dynamo -- a Concat
// whose piece i is Shape(v, start a, end a + 1) with v's dim a equal to x's
// dim i: the same known size or the same named symbolic dim, which the
// runtime binds to one size) and xf = Reshape(x) with x's last dim D, k3.Moe
// reads x and replaces the Reshape's output (a shape built from other
// values' dims is left in place);
// otherwise it reads xf and replaces y. Shapes downstream are re-inferred.
//
// Guards (each has a must-not-match test in tests/passes/test_fuse_moe.cc):
//   - the gate weight Wg is a constant f32 [D, E], xf is f32 [N, D], and the
//     logits are read by the TopK only;
//   - TopK on the last axis, largest=1, constant k with 1 <= k <= E;
//   - the TopK values are read only by a Softmax on the last axis (a softmax
//     over all logits followed by TopK is a different model: its weights
//     are not renormalized over the chosen experts; that TopK reads a
//     Softmax, not the gate MatMul, and is not matched);
//   - (a) every reader of the indices is Equal(idx, constant e), the
//     experts e are 0..E-1, each found exactly once; the dispatch chain of
//     each is the one drawn above (dynamo: the two Slices are exactly column
//     0 (token) and column 1 (slot), axis 1, step 1, and the Transpose has
//     no other reader; the rows are gathered by column 0; the row GatherND
//     has batch_dims 0 and indices Unsqueeze(tok_e, -1); the Expand zeros
//     broadcast an f32 0.0 of at most xf's rank); w_e is [n, 1] and derived from s, tok_e
//     (and slot_e) by indexing and layout ops only (integer arithmetic on
//     indices is allowed, float arithmetic is not); scatter indices derive
//     from tok_e by Unsqueeze/Expand/Reshape/Cast only; scatter axis 0; the
//     accumulation is one chain from zeros of xf's shape through all E
//     experts;
//   - (b) the indices' one reader is ScatterElements(all-zero constant
//     [N, E], idx, s) on axis 1 with no reduction; the mix is exactly
//     Transpose(perm [1, 0]) -> Unsqueeze(axis 2); xu is xf by Unsqueeze /
//     Reshape only, shaped [1, N, D]; every reader of xu is a MatMul by a
//     constant f32 [E, D, F] stack (one up, at most one gate); down is
//     [E, F, D]; the sum is over axis 0 with keepdims 0;
//   - (c) every reader of the indices is Gather(axis 0) of a constant f32
//     [E, ., .]; exactly one up (and one gate) and one down stack;
//     Squeeze/Unsqueeze/ReduceSum axes as drawn;
//   - each expert FFN is one of the two above, all experts the same kind,
//     with constant f32 weights of matching dims;
//   - the matched region is closed: every value it computes, except the
//     replaced one, is read only inside it and is no graph output, and it
//     reads nothing but x / xf and constants (shape computations included).
// A TopK on a gate MatMul that fails a guard is left alone and noted in the
// stats with the reason.
#include "passes/fuse_moe.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "passes/onnx_match.h"
#include "passes/specialize_shapes.h"

namespace k3::passes {
namespace {

using ir::OpKind;

// One expert weight as k3.Moe wants it: `value` ([in, out] MatMul
// initializer to transpose, or row `slice` of a stacked [E, out, in], or
// -- both set -- row `slice` of a stacked [E, in, out] to transpose).
struct WeightRef {
  int value = -1;
  bool transpose = false;
  int64_t slice = -1;
};

struct Match {
  std::set<int> nodes;
  int x = -1;         // k3.Moe's input
  int replaced = -1;  // the value its output takes over
  int gate = -1;      // [D, E]
  int64_t n_experts = 0, top_k = 0;
  bool swiglu = false;
  std::vector<std::vector<WeightRef>> experts;  // [e] = up, (gate), down
  std::string anchor_name;
  // A shape the Reshape back reads that is computed outside the match from
  // graph inputs' dims (is_shape_of, dynamo form): it stays where it is.
  int outside_shape = -1;
};

bool is_const(const ir::Graph& g, int v) {
  return v >= 0 && g.value(v).kind == ir::ValueKind::kWeight && g.value(v).data != nullptr;
}

std::optional<int64_t> const_int_scalar(const ir::Graph& g, int v) {
  auto xs = constant_ints(g, v);
  if (!xs || xs->size() != 1 || g.value(v).shape.size() > 1) return std::nullopt;
  return (*xs)[0];
}

// Axes of Squeeze/Unsqueeze/ReduceSum (attribute or constant input 1), normalized to `rank`.
std::optional<std::vector<int64_t>> axes_of(const ir::Graph& g, const ir::Node& n, int64_t rank) {
  std::vector<int64_t> axes;
  if (const auto* a = n.attr_ints("axes")) {
    axes = *a;
  } else if (n.inputs.size() > 1 && n.inputs[1] >= 0) {
    auto c = constant_ints(g, n.inputs[1]);
    if (!c) return std::nullopt;
    axes = *c;
  } else {
    return std::nullopt;
  }
  for (auto& a : axes) a = a < 0 ? a + rank : a;
  std::sort(axes.begin(), axes.end());
  return axes;
}

// Which column of `x` [n, 2] Slice node `n` takes: 0 or 1 when it is
// Slice(x, starts [c], ends [c + 1], axes [1], steps [1]) (column 1 may end
// past 2), -1 otherwise.
int column_slice(const ir::Graph& g, const ir::Node& n, int x) {
  if (n.op != OpKind::kOnnxSlice || n.inputs.size() < 4 || n.inputs[0] != x || n.inputs[3] < 0) return -1;
  const auto st = constant_ints(g, n.inputs[1]), en = constant_ints(g, n.inputs[2]), ax = constant_ints(g, n.inputs[3]);
  if (!st || !en || !ax || st->size() != 1 || en->size() != 1 || ax->size() != 1) return -1;
  if ((*ax)[0] != 1 && (*ax)[0] != -1) return -1;
  if (n.inputs.size() > 4 && n.inputs[4] >= 0) {
    const auto sp = constant_ints(g, n.inputs[4]);
    if (!sp || *sp != std::vector<int64_t>{1}) return -1;
  }
  const int64_t c = (*st)[0], e = (*en)[0];
  if (c == 0 && e == 1) return 0;
  if (c == 1 && e >= 2) return 1;
  return -1;
}

// Shape node `n` returns the whole shape of its input (no start/end, or
// start 0 and no end, as the dynamo exporter writes it).
bool whole_shape(const ir::Node& n) {
  if (n.find_attr("end") != nullptr) return false;
  return n.find_attr("start") == nullptr || n.attr_int("start", 0) == 0;
}

bool is_float_arith(OpKind op) {
  switch (op) {
    case OpKind::kOnnxAdd:
    case OpKind::kOnnxSub:
    case OpKind::kOnnxMul:
    case OpKind::kOnnxDiv:
    case OpKind::kOnnxPow:
    case OpKind::kOnnxMod:
    case OpKind::kOnnxMax:
    case OpKind::kOnnxMin:
      return true;
    default:
      return false;
  }
}

class Matcher {
 public:
  Matcher(const ir::Graph& g, const Readers& rd) : g_(g), rd_(rd) {}
  std::string why;

  bool match(int topk, Match& m);

 private:
  const ir::Graph& g_;
  const Readers& rd_;
  int xf_ = -1, x0_ = -1, s_ = -1, idx_ = -1;
  int64_t d_ = 0, e_ = 0, f_ = -1;
  int swiglu_ = -1;  // -1 unknown yet, 0 gelu, 1 swiglu

  bool fail(std::string msg) {
    why = std::move(msg);
    return false;
  }
  const ir::Node& at(int i) const { return g_.nodes()[static_cast<size_t>(i)]; }
  const std::string& vname(int v) const { return g_.value(v).name; }
  // The one reader of v when it has exactly one (and is no graph output) of op `op`, else -1.
  int single_of(int v, OpKind op) const {
    const int r = rd_.only_reader(v);
    return r >= 0 && at(r).op == op ? r : -1;
  }
  std::vector<int> unique_readers(int v) const {
    std::vector<int> r = rd_.of(v);
    std::sort(r.begin(), r.end());
    r.erase(std::unique(r.begin(), r.end()), r.end());
    return r;
  }
  bool const_f32(int v, size_t rank) const {
    return is_const(g_, v) && g_.value(v).dtype == ir::DType::kF32 && g_.value(v).shape.size() == rank;
  }

  bool shape_walk(int v, Match& m, std::set<int>& seen);
  bool derive(int v, const std::set<int>& stops, const std::vector<OpKind>& allowed, std::set<int>& hit, Match& m,
              std::set<int>& seen);
  bool zeros_of_shape(int v, Match& m, const std::vector<int>& like);
  bool ffn_2d(int xe, int64_t e, Match& m, int& ye);
  bool hidden(const std::vector<int>& in_side, Match& m, int& up, int& gmm, int& h);
  bool form_a(Match& m, int& y_end);
  bool form_b(Match& m, int& y_end);
  bool form_c(Match& m, int& y_end);
  bool is_shape_of(int shp, int x, Match& m);
  bool closed(const Match& m);
};

// Walks a value that is used only for its shape (the input of a Shape
// node) back to x / xf, adding the nodes on the way; constants end the walk,
// any other graph input fails it.
bool Matcher::shape_walk(int v, Match& m, std::set<int>& seen) {
  if (v < 0 || v == xf_ || v == x0_ || is_const(g_, v) || !seen.insert(v).second) return true;
  const int p = g_.value(v).producer;
  if (p < 0) return fail("the MoE region reads " + vname(v) + ", which is not computed from x");
  m.nodes.insert(p);
  for (int in : at(p).inputs)
    if (!shape_walk(in, m, seen)) return false;
  return true;
}

// Walks back from v through nodes of the `allowed` ops (Shape nodes: their
// input in shape mode) to the values in `stops`, recording which were hit.
// A float value computed by arithmetic fails the walk.
bool Matcher::derive(int v, const std::set<int>& stops, const std::vector<OpKind>& allowed, std::set<int>& hit,
                     Match& m, std::set<int>& seen) {
  if (v < 0 || is_const(g_, v)) return true;
  if (stops.count(v) != 0) {
    hit.insert(v);
    return true;
  }
  if (!seen.insert(v).second) return true;
  const int p = g_.value(v).producer;
  if (p < 0) return fail(vname(v) + " is not computed from the routing");
  const ir::Node& n = at(p);
  m.nodes.insert(p);
  if (n.op == OpKind::kOnnxShape) {
    std::set<int> s2;
    return shape_walk(n.inputs[0], m, s2);
  }
  if (std::find(allowed.begin(), allowed.end(), n.op) == allowed.end())
    return fail(vname(v) + " comes from " + n.name + " (" + std::string(ir::op_name(n.op)) +
                "), not an index/layout op");
  const ir::DType t = g_.value(v).dtype;
  if ((t == ir::DType::kF32 || t == ir::DType::kF64) && is_float_arith(n.op))
    return fail(vname(v) + " comes from float arithmetic " + n.name);
  for (int in : n.inputs)
    if (!derive(in, stops, allowed, hit, m, seen)) return false;
  return true;
}

// v is zeros with the shape of one of `like`: ConstantOfShape(Shape(l), 0)
// or an all-zero constant of l's (known) shape.
bool Matcher::zeros_of_shape(int v, Match& m, const std::vector<int>& like) {
  if (is_const(g_, v)) {
    const ir::Value& w = g_.value(v);
    if (w.dtype != ir::DType::kF32) return fail(vname(v) + " is not f32");
    for (int l : like) {
      if (g_.value(l).shape != w.shape) continue;
      const float* p = static_cast<const float*>(w.data);
      for (int64_t i = 0; i < w.numel(); ++i)
        if (p[i] != 0.0f) return fail(vname(v) + " is not all zeros");
      return true;
    }
    return fail(vname(v) + " does not have the accumulator's shape");
  }
  if (const ir::Node* ex = produced_by(g_, v, OpKind::kOnnxExpand)) {
    // Expand(zero scalar, Shape(l)): a constant f32 zero whose dims are all
    // 1 broadcast to exactly l's shape.
    const int z = ex->inputs[0];
    const ir::Value& zv = g_.value(z);
    if (!is_const(g_, z) || zv.dtype != ir::DType::kF32 || zv.numel() != 1 ||
        static_cast<const float*>(zv.data)[0] != 0.0f)
      return fail(ex->name + " does not expand a zero f32 scalar");
    const ir::Node* sh = produced_by(g_, ex->inputs[1], OpKind::kOnnxShape);
    if (sh == nullptr || !whole_shape(*sh) || std::find(like.begin(), like.end(), sh->inputs[0]) == like.end() ||
        zv.shape.size() > g_.value(sh->inputs[0]).shape.size())
      return fail(ex->name + " does not take the accumulator's shape");
    m.nodes.insert(g_.value(v).producer);
    m.nodes.insert(g_.value(ex->inputs[1]).producer);
    return true;
  }
  const ir::Node* c = produced_by(g_, v, OpKind::kOnnxConstantOfShape);
  if (c == nullptr) return fail(vname(v) + " is not zeros (ConstantOfShape)");
  if (const ir::AttrValue* a = c->find_attr("value")) {
    const auto* i = std::get_if<int64_t>(a);
    const auto* d = std::get_if<double>(a);
    if ((i != nullptr && *i != 0) || (d != nullptr && *d != 0.0) || (i == nullptr && d == nullptr))
      return fail(c->name + " is not zeros");
  }
  if (c->attr_int("value_dtype", 1) != 1) return fail(c->name + " is not f32");
  const ir::Node* sh = produced_by(g_, c->inputs[0], OpKind::kOnnxShape);
  if (sh == nullptr || !whole_shape(*sh) || std::find(like.begin(), like.end(), sh->inputs[0]) == like.end())
    return fail(c->name + " does not take the accumulator's shape");
  m.nodes.insert(g_.value(v).producer);
  m.nodes.insert(g_.value(c->inputs[0]).producer);
  return true;
}

// Expert FFN on rows xe [n, D] (form a): GeLU or SwiGLU, weights [in, out].
bool Matcher::ffn_2d(int xe, int64_t e, Match& m, int& ye) {
  const std::string who = "expert " + std::to_string(e) + ": ";
  std::vector<int> mms = unique_readers(xe);
  if (rd_.is_output(xe)) return fail(who + "gathered rows are a graph output");
  for (int r : mms)
    if (at(r).op != OpKind::kOnnxMatMul || at(r).inputs[0] != xe || !const_f32(at(r).inputs[1], 2) ||
        g_.value(at(r).inputs[1]).shape[0] != d_)
      return fail(who + "rows read by " + at(r).name + ", not a MatMul by a constant [D, F]");
  int up = -1, gmm = -1, h = -1;
  if (mms.size() == 1) {
    up = mms[0];
    const int ge = single_of(at(up).outputs[0], OpKind::kOnnxGelu);
    if (ge < 0) return fail(who + at(up).name + " is not followed by onnx.Gelu (FFN not GeLU or SwiGLU)");
    const ir::AttrValue* a = at(ge).find_attr("approximate");
    if (a != nullptr && std::get_if<std::string>(a) != nullptr && *std::get_if<std::string>(a) != "none")
      return fail(who + at(ge).name + " is the tanh GeLU");
    m.nodes.insert(ge);
    h = at(ge).outputs[0];
    if (swiglu_ == 1) return fail(who + "GeLU expert among SwiGLU experts");
    swiglu_ = 0;
  } else if (mms.size() == 2) {
    for (int c : mms) {
      const int gv = at(c).outputs[0];
      const std::vector<int> rs = unique_readers(gv);
      if (rs.size() != 2 || rd_.is_output(gv)) continue;
      int sig = -1, mul = -1;
      for (int r : rs) {
        if (at(r).op == OpKind::kOnnxSigmoid) sig = r;
        if (at(r).op == OpKind::kOnnxMul) mul = r;
      }
      if (sig < 0 || mul < 0 || rd_.only_reader(at(sig).outputs[0]) != mul ||
          other_input(at(mul), gv) != at(sig).outputs[0])
        continue;
      gmm = c;
      m.nodes.insert(sig);
      m.nodes.insert(mul);
      const int silu = at(mul).outputs[0];
      up = mms[0] == c ? mms[1] : mms[0];
      const int pm = single_of(silu, OpKind::kOnnxMul);
      if (pm < 0 || other_input(at(pm), silu) != at(up).outputs[0] || !rd_.single(at(up).outputs[0]))
        return fail(who + "SiLU(gate) is not multiplied by the up projection");
      m.nodes.insert(pm);
      h = at(pm).outputs[0];
    }
    if (gmm < 0) return fail(who + "two projections but no SiLU(gate) * up");
    if (swiglu_ == 0) return fail(who + "SwiGLU expert among GeLU experts");
    swiglu_ = 1;
  } else {
    return fail(who + "rows read by " + std::to_string(mms.size()) + " nodes (FFN not GeLU or SwiGLU)");
  }
  const int64_t f = g_.value(at(up).inputs[1]).shape[1];
  if (gmm >= 0 && g_.value(at(gmm).inputs[1]).shape[1] != f) return fail(who + "gate and up widths differ");
  if (f_ >= 0 && f != f_) return fail(who + "hidden width differs from the other experts");
  f_ = f;
  const int dn = single_of(h, OpKind::kOnnxMatMul);
  if (dn < 0 || at(dn).inputs[0] != h || !const_f32(at(dn).inputs[1], 2) ||
      g_.value(at(dn).inputs[1]).shape != std::vector<int64_t>{f, d_})
    return fail(who + "activation is not followed by a MatMul by a constant [F, D]");
  m.nodes.insert(up);
  m.nodes.insert(dn);
  if (gmm >= 0) m.nodes.insert(gmm);
  std::vector<WeightRef> ws = {{at(up).inputs[1], true, -1}};
  if (gmm >= 0) ws.push_back({at(gmm).inputs[1], true, -1});
  ws.push_back({at(dn).inputs[1], true, -1});
  m.experts[static_cast<size_t>(e)] = ws;
  ye = at(dn).outputs[0];
  return true;
}

bool Matcher::form_a(Match& m, int& y_end) {
  struct Step {
    int prev, next;
  };
  std::vector<Step> steps;
  const std::vector<OpKind> weight_ops = {OpKind::kOnnxGather,    OpKind::kOnnxGatherND,  OpKind::kOnnxGatherElements,
                                          OpKind::kOnnxFlatten,   OpKind::kOnnxReshape,   OpKind::kOnnxSqueeze,
                                          OpKind::kOnnxUnsqueeze, OpKind::kOnnxTranspose, OpKind::kOnnxExpand,
                                          OpKind::kOnnxConcat,    OpKind::kOnnxCast,      OpKind::kOnnxMul,
                                          OpKind::kOnnxAdd,       OpKind::kOnnxSlice,     OpKind::kOnnxSplit};
  const std::vector<OpKind> index_ops = {OpKind::kOnnxUnsqueeze, OpKind::kOnnxExpand, OpKind::kOnnxReshape,
                                         OpKind::kOnnxCast};
  for (int q : unique_readers(idx_)) {
    const ir::Node& eq = at(q);
    if (eq.op != OpKind::kOnnxEqual) return fail("the indices are read by " + eq.name + ", not Equal");
    const auto e = const_int_scalar(g_, other_input(eq, idx_));
    if (!e) return fail(eq.name + " does not compare with a constant expert index");
    if (*e < 0 || *e >= e_)
      return fail(eq.name + " compares with expert " + std::to_string(*e) + " of " + std::to_string(e_));
    if (!m.experts[static_cast<size_t>(*e)].empty()) return fail("expert " + std::to_string(*e) + " dispatched twice");
    const std::string who = "expert " + std::to_string(*e) + " (" + eq.name + "): ";
    m.nodes.insert(q);
    const int nz = single_of(eq.outputs[0], OpKind::kOnnxNonZero);
    if (nz < 0) return fail(who + "not followed by NonZero");
    const int tr = single_of(at(nz).outputs[0], OpKind::kOnnxTranspose);
    if (tr < 0) return fail(who + "NonZero is not followed by Transpose");
    const auto* perm = at(tr).attr_ints("perm");
    if (perm != nullptr && *perm != std::vector<int64_t>{1, 0}) return fail(who + "Transpose is not [1, 0]");
    // The (token, slot) columns: Split(axis 1, [1, 1]) or, as the dynamo
    // exporter writes them, two Slices of column 0 and column 1.
    int cols[2] = {-1, -1};
    const int sp = single_of(at(tr).outputs[0], OpKind::kOnnxSplit);
    if (sp >= 0) {
      if (at(sp).outputs.size() != 2) return fail(who + "no Split into (token, slot)");
      const int64_t sp_axis = at(sp).attr_int("axis", 0);
      if (sp_axis != 1 && sp_axis != -1) return fail(who + "Split is not along axis 1");
      if (at(sp).inputs.size() > 1 && at(sp).inputs[1] >= 0) {
        const auto sizes = constant_ints(g_, at(sp).inputs[1]);
        if (!sizes || *sizes != std::vector<int64_t>{1, 1}) return fail(who + "Split sizes are not [1, 1]");
      }
      cols[0] = at(sp).outputs[0];
      cols[1] = at(sp).outputs[1];
      m.nodes.insert(sp);
    } else {
      const std::vector<int> sls = unique_readers(at(tr).outputs[0]);
      if (rd_.is_output(at(tr).outputs[0]) || sls.size() != 2 || rd_.of(at(tr).outputs[0]).size() != 2)
        return fail(who + "no Split into (token, slot)");
      for (int sl : sls) {
        const int c = column_slice(g_, at(sl), at(tr).outputs[0]);
        if (c < 0 || cols[c] >= 0)
          return fail(who + "no Split into (token, slot): " + at(sl).name + " is not column 0 or 1");
        cols[c] = at(sl).outputs[0];
        m.nodes.insert(sl);
      }
    }
    int tok = -1, slot = -1;
    for (int o = 0; o < 2; ++o) {
      const int sq = single_of(cols[o], OpKind::kOnnxSqueeze);
      const auto ax = sq < 0 ? std::nullopt : axes_of(g_, at(sq), 2);
      if (sq < 0 || !ax || *ax != std::vector<int64_t>{1}) return fail(who + "Split output is not squeezed on axis 1");
      m.nodes.insert(sq);
      (o == 0 ? tok : slot) = at(sq).outputs[0];
    }
    m.nodes.insert(nz);
    m.nodes.insert(tr);
    // Rows of xf for this expert: Gather(xf, tok, axis 0), or
    // GatherND(xf, Unsqueeze(tok, -1), batch_dims 0) (one index per tuple:
    // the same rows).
    int gather = -1;
    for (int r : unique_readers(tok)) {
      const ir::Node& n = at(r);
      if (n.op == OpKind::kOnnxGather && n.inputs[0] == xf_ && n.inputs[1] == tok && n.attr_int("axis", 0) == 0) {
        if (gather >= 0) return fail(who + "rows gathered twice");
        gather = r;
      }
      if (n.op != OpKind::kOnnxUnsqueeze || n.inputs[0] != tok) continue;
      const auto ax = axes_of(g_, n, 2);
      if (!ax || *ax != std::vector<int64_t>{1}) continue;
      for (int r2 : unique_readers(n.outputs[0])) {
        const ir::Node& nd = at(r2);
        if (nd.op != OpKind::kOnnxGatherND || nd.inputs.size() != 2 || nd.inputs[0] != xf_ ||
            nd.inputs[1] != n.outputs[0])
          continue;
        if (nd.attr_int("batch_dims", 0) != 0) return fail(who + nd.name + " gathers rows with batch_dims != 0");
        if (gather >= 0) return fail(who + "rows gathered twice");
        gather = r2;
        m.nodes.insert(r);
      }
    }
    if (gather < 0) return fail(who + "no Gather of the input rows by the token index");
    m.nodes.insert(gather);
    int ye = -1;
    if (!ffn_2d(at(gather).outputs[0], *e, m, ye)) return false;
    // Times the routing weight.
    const int mul = single_of(ye, OpKind::kOnnxMul);
    if (mul < 0) return fail(who + "FFN output is not multiplied by a routing weight");
    m.nodes.insert(mul);
    const int w = other_input(at(mul), ye);
    const auto& ws = g_.value(w).shape;
    if (ws.size() != 2 || ws[1] != 1) return fail(who + "routing weight " + vname(w) + " is not [n, 1]");
    std::set<int> hit, seen;
    if (!derive(w, {s_, tok, slot}, weight_ops, hit, m, seen)) return fail(who + why);
    if (hit.count(s_) == 0 || hit.count(tok) == 0)
      return fail(who + "routing weight is not indexed from the top-k softmax by token");
    // [Expand]* then the scatter; other readers on the way must be Shape
    // nodes of the match (the closed-region check makes sure).
    int u = at(mul).outputs[0];
    auto reader_of = [&](int v, OpKind op, size_t slot) {
      int found = -1;
      for (int r : unique_readers(v))
        if (at(r).op == op && at(r).inputs.size() > slot && at(r).inputs[slot] == v) found = found < 0 ? r : -2;
      return found;
    };
    for (int ex = reader_of(u, OpKind::kOnnxExpand, 0); ex >= 0; ex = reader_of(u, OpKind::kOnnxExpand, 0)) {
      std::set<int> h2, s2;
      if (!derive(at(ex).inputs[1], {}, {}, h2, m, s2)) return fail(who + why);
      m.nodes.insert(ex);
      u = at(ex).outputs[0];
    }
    int sc = reader_of(u, OpKind::kOnnxScatterElements, 2);
    if (sc == -1) sc = reader_of(u, OpKind::kOnnxScatterND, 2);
    if (sc < 0) return fail(who + "weighted output " + vname(u) + " does not go to one scatter");
    const ir::Node& scn = at(sc);
    const bool elements = scn.op == OpKind::kOnnxScatterElements;
    if ((!elements && scn.op != OpKind::kOnnxScatterND) || scn.inputs.size() != 3 || scn.inputs[2] != u)
      return fail(who + "weighted output goes to " + scn.name + ", not a scatter");
    if (elements && scn.attr_int("axis", 0) != 0) return fail(who + scn.name + " scatters along axis != 0");
    const auto& is = g_.value(scn.inputs[1]).shape;
    if (is.size() != 2 || (!elements && is[1] != 1)) return fail(who + scn.name + " indices have the wrong rank");
    std::set<int> h3, s3;
    if (!derive(scn.inputs[1], {tok}, index_ops, h3, m, s3)) return fail(who + why);
    if (h3.count(tok) == 0) return fail(who + scn.name + " does not scatter by the token index");
    m.nodes.insert(sc);
    std::string red = "none";
    if (const ir::AttrValue* a = scn.find_attr("reduction"))
      if (const auto* sv = std::get_if<std::string>(a)) red = *sv;
    if (red == "add") {
      steps.push_back({scn.inputs[0], scn.outputs[0]});
    } else if (red == "none") {
      const int add = single_of(scn.outputs[0], OpKind::kOnnxAdd);
      if (add < 0) return fail(who + scn.name + " is not added to the accumulator");
      const int prev = other_input(at(add), scn.outputs[0]);
      if (!zeros_of_shape(scn.inputs[0], m, {prev, xf_})) return fail(who + why);
      m.nodes.insert(add);
      steps.push_back({prev, at(add).outputs[0]});
    } else {
      return fail(who + scn.name + " has reduction " + red);
    }
  }
  for (int64_t e = 0; e < e_; ++e)
    if (m.experts[static_cast<size_t>(e)].empty()) return fail("expert " + std::to_string(e) + " is not dispatched");
  // One accumulation chain from zeros through every expert.
  std::set<int> nexts;
  for (const Step& s : steps) nexts.insert(s.next);
  int start = -1;
  for (const Step& s : steps)
    if (nexts.count(s.prev) == 0) {
      if (start >= 0 && start != s.prev) return fail("the experts' outputs are not accumulated in one chain");
      start = s.prev;
    }
  if (start < 0) return fail("no accumulator start");
  if (!zeros_of_shape(start, m, {xf_})) return fail("accumulator start: " + why);
  int cur = start;
  for (size_t i = 0; i < steps.size(); ++i) {
    int found = -1;
    for (const Step& s : steps)
      if (s.prev == cur) {
        if (found >= 0) return fail("the accumulation chain forks at " + vname(cur));
        found = s.next;
      }
    if (found < 0) return fail("the accumulation chain breaks at " + vname(cur));
    cur = found;
  }
  y_end = cur;
  return true;
}

// The expert activation after the stacked input projections `in_side`
// (one MatMul: GeLU; two: SwiGLU), forms b and c: sets the up and gate
// MatMuls and the hidden value h the down projection must read.
bool Matcher::hidden(const std::vector<int>& in_side, Match& m, int& up, int& gmm, int& h) {
  if (in_side.size() == 1) {
    up = in_side[0];
    const int ge = single_of(at(up).outputs[0], OpKind::kOnnxGelu);
    if (ge < 0) return fail(at(up).name + " is not followed by onnx.Gelu (FFN not GeLU or SwiGLU)");
    const ir::AttrValue* a = ge < 0 ? nullptr : at(ge).find_attr("approximate");
    if (a != nullptr && std::get_if<std::string>(a) != nullptr && *std::get_if<std::string>(a) != "none")
      return fail(at(ge).name + " is the tanh GeLU");
    m.nodes.insert(ge);
    h = at(ge).outputs[0];
    swiglu_ = 0;
  } else {
    for (int c : in_side) {
      const int gv = at(c).outputs[0];
      const std::vector<int> rs = unique_readers(gv);
      if (rs.size() != 2 || rd_.is_output(gv)) continue;
      int sig = -1, mul = -1;
      for (int r : rs) {
        if (at(r).op == OpKind::kOnnxSigmoid) sig = r;
        if (at(r).op == OpKind::kOnnxMul) mul = r;
      }
      if (sig < 0 || mul < 0 || rd_.only_reader(at(sig).outputs[0]) != mul ||
          other_input(at(mul), gv) != at(sig).outputs[0])
        continue;
      gmm = c;
      up = in_side[0] == c ? in_side[1] : in_side[0];
      const int silu = at(mul).outputs[0];
      const int pm = single_of(silu, OpKind::kOnnxMul);
      if (pm < 0 || other_input(at(pm), silu) != at(up).outputs[0] || !rd_.single(at(up).outputs[0]))
        return fail("SiLU(gate) is not multiplied by the up projection");
      m.nodes.insert(sig);
      m.nodes.insert(mul);
      m.nodes.insert(pm);
      h = at(pm).outputs[0];
    }
    if (gmm < 0) return fail("two stacked projections but no SiLU(gate) * up");
    swiglu_ = 1;
  }
  return true;
}

bool Matcher::form_b(Match& m, int& y_end) {
  const std::vector<int> rs = unique_readers(idx_);
  const ir::Node& sc = at(rs[0]);
  if (rs.size() != 1 || sc.op != OpKind::kOnnxScatterElements || sc.inputs.size() != 3 || sc.inputs[1] != idx_ ||
      sc.inputs[2] != s_)
    return fail("the indices are read by " + sc.name + ", not only by ScatterElements(zeros, indices, softmax)");
  const int64_t sax = sc.attr_int("axis", 0);
  if (sax != 1 && sax != -1) return fail(sc.name + " does not scatter along the expert axis");
  if (const ir::AttrValue* r = sc.find_attr("reduction");
      r != nullptr && (std::get_if<std::string>(r) == nullptr || *std::get_if<std::string>(r) != "none"))
    return fail(sc.name + " has a reduction (the dense mix must overwrite zeros)");
  // The zeros must be a constant: ConstantOfShape(Shape(logits)) would make
  // the logits' reader count fail the router guard anyway.
  if (!is_const(g_, sc.inputs[0])) return fail(sc.name + " does not scatter into constant zeros");
  if (!zeros_of_shape(sc.inputs[0], m, {at(g_.value(idx_).producer).inputs[0]})) return false;
  m.nodes.insert(rs[0]);
  const int tr = single_of(sc.outputs[0], OpKind::kOnnxTranspose);
  const auto* perm = tr < 0 ? nullptr : at(tr).attr_ints("perm");
  if (perm == nullptr || *perm != std::vector<int64_t>{1, 0}) return fail("the dense mix is not transposed to [E, N]");
  const int un = single_of(at(tr).outputs[0], OpKind::kOnnxUnsqueeze);
  const auto un_ax = un < 0 ? std::nullopt : axes_of(g_, at(un), 3);
  if (un < 0 || !un_ax || *un_ax != std::vector<int64_t>{2})
    return fail("the dense mix is not unsqueezed to [E, N, 1]");
  const int mul = single_of(at(un).outputs[0], OpKind::kOnnxMul);
  if (mul < 0) return fail("the dense mix does not weight the expert outputs");
  m.nodes.insert(tr);
  m.nodes.insert(un);
  m.nodes.insert(mul);
  // The input projections: MatMul(xu [1, N, D], constant [E, D, F]).
  std::vector<int> in_side;
  int xu = -1;
  for (int r : unique_readers(xf_)) {
    const ir::Node& rn = at(r);
    if (rn.op == OpKind::kOnnxMatMul && rn.outputs[0] == at(g_.value(idx_).producer).inputs[0]) continue;  // gate
    if (rn.op != OpKind::kOnnxUnsqueeze && rn.op != OpKind::kOnnxReshape) continue;  // closed() judges the rest
    if (g_.value(rn.outputs[0]).shape != std::vector<int64_t>{1, g_.value(xf_).shape[0], d_}) continue;
    for (int mm : unique_readers(rn.outputs[0])) {
      const ir::Node& mn = at(mm);
      if (mn.op != OpKind::kOnnxMatMul || mn.inputs[0] != rn.outputs[0] || !const_f32(mn.inputs[1], 3) ||
          g_.value(mn.inputs[1]).shape[0] != e_ || g_.value(mn.inputs[1]).shape[1] != d_)
        return fail(vname(rn.outputs[0]) + " is read by " + mn.name +
                    ", not a MatMul by a constant f32 [E, D, F] stack");
      in_side.push_back(mm);
    }
    if (xu >= 0) return fail("two different reshapes of the input");
    xu = rn.outputs[0];
    std::set<int> hit, seen;
    if (!derive(xu, {xf_}, {OpKind::kOnnxUnsqueeze, OpKind::kOnnxReshape}, hit, m, seen)) return false;
    if (hit.count(xf_) == 0) return fail(vname(xu) + " is not computed from the input");
  }
  if (in_side.empty() || in_side.size() > 2) return fail("not one up (and gate) stack on the input");
  int up = -1, gmm = -1, h = -1;
  if (!hidden(in_side, m, up, gmm, h)) return false;
  const int down = single_of(h, OpKind::kOnnxMatMul);
  if (down < 0 || at(down).inputs[0] != h || !const_f32(at(down).inputs[1], 3))
    return fail("the activation is not multiplied by a constant down stack");
  const int64_t f = g_.value(at(up).inputs[1]).shape[2];
  if (g_.value(at(down).inputs[1]).shape != std::vector<int64_t>{e_, f, d_} ||
      (gmm >= 0 && g_.value(at(gmm).inputs[1]).shape != g_.value(at(up).inputs[1]).shape))
    return fail("stacked weight shapes do not agree with [E, D, F] / [E, F, D]");
  if (other_input(at(mul), at(un).outputs[0]) != at(down).outputs[0] || rd_.only_reader(at(down).outputs[0]) != mul)
    return fail("the dense mix does not weight the down projection");
  const int sum = single_of(at(mul).outputs[0], OpKind::kOnnxReduceSum);
  const auto sum_ax = sum < 0 ? std::nullopt : axes_of(g_, at(sum), 3);
  if (sum < 0 || !sum_ax || *sum_ax != std::vector<int64_t>{0} || at(sum).attr_int("keepdims", 1) != 0)
    return fail("the weighted outputs are not summed over the expert axis (keepdims=0)");
  for (int n : {up, down, sum}) m.nodes.insert(n);
  for (int n : in_side) m.nodes.insert(n);
  f_ = f;
  for (int64_t e = 0; e < e_; ++e) {
    std::vector<WeightRef> ws = {{at(up).inputs[1], true, e}};
    if (gmm >= 0) ws.push_back({at(gmm).inputs[1], true, e});
    ws.push_back({at(down).inputs[1], true, e});
    m.experts[static_cast<size_t>(e)] = ws;
  }
  y_end = at(sum).outputs[0];
  return true;
}

bool Matcher::form_c(Match& m, int& y_end) {
  std::vector<int> in_side;  // MatMuls of gathered [F, D] stacks by xv
  int down = -1, xv = -1;
  for (int r : unique_readers(idx_)) {
    const ir::Node& gn = at(r);
    if (gn.op != OpKind::kOnnxGather || gn.inputs[1] != idx_ || gn.attr_int("axis", 0) != 0 ||
        !const_f32(gn.inputs[0], 3) || g_.value(gn.inputs[0]).shape[0] != e_)
      return fail("the indices are read by " + gn.name + ", not a Gather of a constant f32 [E, ., .] stack");
    const int mm = single_of(gn.outputs[0], OpKind::kOnnxMatMul);
    if (mm < 0 || at(mm).inputs[0] != gn.outputs[0]) return fail(gn.name + " is not multiplied by activations");
    m.nodes.insert(r);
    m.nodes.insert(mm);
    // Is the other operand xf reshaped to [N, 1, D, 1]?
    const int other = at(mm).inputs[1];
    const auto& os = g_.value(other).shape;
    bool from_x = false;
    if (os.size() == 4 && os[1] == 1 && os[2] == d_ && os[3] == 1) {
      std::set<int> hit, seen;
      Match tmp;
      if (derive(other, {xf_}, {OpKind::kOnnxUnsqueeze, OpKind::kOnnxReshape}, hit, tmp, seen) && hit.count(xf_)) {
        from_x = true;
        if (xv >= 0 && xv != other) return fail("two different reshapes of the input");
        xv = other;
        m.nodes.insert(tmp.nodes.begin(), tmp.nodes.end());
      }
    }
    if (from_x) {
      in_side.push_back(mm);
    } else {
      if (down >= 0) return fail("two stacks multiply the hidden activations");
      down = mm;
    }
  }
  if (down < 0 || in_side.empty() || in_side.size() > 2) return fail("not one up (and gate) and one down stack");
  auto stack_of = [&](int mm) { return at(g_.value(at(mm).inputs[0]).producer).inputs[0]; };
  int up = -1, gmm = -1, h = -1;
  if (!hidden(in_side, m, up, gmm, h)) return false;
  if (at(down).inputs[1] != h) return fail("the down stack does not multiply the activation");
  const auto& us = g_.value(stack_of(up)).shape;
  const int64_t f = us[1];
  if (us[2] != d_ || g_.value(stack_of(down)).shape != std::vector<int64_t>{e_, d_, f} ||
      (gmm >= 0 && g_.value(stack_of(gmm)).shape != us))
    return fail("stacked weight shapes do not agree with [E, F, D] / [E, D, F]");
  const int sq = single_of(at(down).outputs[0], OpKind::kOnnxSqueeze);
  const auto sq_ax = sq < 0 ? std::nullopt : axes_of(g_, at(sq), 4);
  if (sq < 0 || !sq_ax || *sq_ax != std::vector<int64_t>{3}) return fail("the down product is not squeezed on axis 3");
  const int mul = single_of(at(sq).outputs[0], OpKind::kOnnxMul);
  if (mul < 0) return fail("expert outputs are not weighted");
  const int w = other_input(at(mul), at(sq).outputs[0]);
  const ir::Node* un = produced_by(g_, w, OpKind::kOnnxUnsqueeze);
  const auto un_ax = un == nullptr ? std::nullopt : axes_of(g_, *un, 3);
  if (un == nullptr || un->inputs[0] != s_ || !un_ax || *un_ax != std::vector<int64_t>{2})
    return fail("the expert outputs are not weighted by the top-k softmax");
  const int rs = single_of(at(mul).outputs[0], OpKind::kOnnxReduceSum);
  const auto rs_ax = rs < 0 ? std::nullopt : axes_of(g_, at(rs), 3);
  if (rs < 0 || !rs_ax || *rs_ax != std::vector<int64_t>{1} || at(rs).attr_int("keepdims", 1) != 0)
    return fail("the weighted outputs are not summed over the k axis (keepdims=0)");
  m.nodes.insert(down);
  m.nodes.insert(sq);
  m.nodes.insert(mul);
  m.nodes.insert(g_.value(w).producer);
  m.nodes.insert(rs);
  f_ = f;
  for (int64_t e = 0; e < e_; ++e) {
    std::vector<WeightRef> ws = {{stack_of(up), false, e}};
    if (gmm >= 0) ws.push_back({stack_of(gmm), false, e});
    ws.push_back({stack_of(down), false, e});
    m.experts[static_cast<size_t>(e)] = ws;
  }
  y_end = at(rs).outputs[0];
  return true;
}

// shp (an i64 [rank] value) is the shape of x.
bool Matcher::is_shape_of(int shp, int x, Match& m) {
  const auto& xs = g_.value(x).shape;
  if (auto c = constant_ints(g_, shp))
    return *c == xs && std::all_of(xs.begin(), xs.end(), [](int64_t d) { return d >= 0; });
  const int p = g_.value(shp).producer;
  if (p < 0) return false;
  const ir::Node& n = at(p);
  if (n.op == OpKind::kOnnxShape) {
    if (n.inputs[0] != x || n.find_attr("start") != nullptr || n.find_attr("end") != nullptr) return false;
    m.nodes.insert(p);
    return true;
  }
  if (n.op != OpKind::kOnnxConcat || n.inputs.size() != xs.size()) return false;
  std::set<int> add = {p};
  bool outside = false;
  for (size_t i = 0; i < xs.size(); ++i) {
    const int piece = n.inputs[i];
    if (auto c = constant_ints(g_, piece)) {
      if (c->size() != 1 || (*c)[0] != xs[i] || xs[i] < 0) return false;
      continue;
    }
    // Shape(v, start a, end a + 1) where v's dim a is x's dim i: the same
    // known size, or the same named symbolic dim (the interpreter binds one
    // size per name across the inputs, so equal names are equal sizes).
    if (const ir::Node* sl = produced_by(g_, piece, OpKind::kOnnxShape); sl != nullptr && !whole_shape(*sl)) {
      const ir::Value& v = g_.value(sl->inputs[0]);
      const int64_t rank = static_cast<int64_t>(v.shape.size());
      int64_t a = sl->attr_int("start", 0), b = sl->attr_int("end", rank);
      if (a < 0) a += rank;
      if (b < 0) b += rank;
      if (a < 0 || a >= rank || b != a + 1) return false;
      const int64_t vd = v.shape[static_cast<size_t>(a)];
      const std::string vp = v.dim_params.empty() ? std::string() : v.dim_params[static_cast<size_t>(a)];
      const std::string xp = g_.value(x).dim_params.empty() ? std::string() : g_.value(x).dim_params[i];
      const bool same = (vd >= 0 && vd == xs[i]) || (vd < 0 && xs[i] < 0 && !vp.empty() && vp == xp);
      if (!same) return false;
      outside = true;
      continue;
    }
    const ir::Node* un = produced_by(g_, piece, OpKind::kOnnxUnsqueeze);
    const auto ax = un == nullptr ? std::nullopt : axes_of(g_, *un, 1);
    if (un == nullptr || !ax || *ax != std::vector<int64_t>{0}) return false;
    const ir::Node* ga = produced_by(g_, un->inputs[0], OpKind::kOnnxGather);
    if (ga == nullptr || ga->attr_int("axis", 0) != 0) return false;
    const auto gi = const_int_scalar(g_, ga->inputs[1]);
    if (!gi || g_.value(ga->inputs[1]).shape.size() != 0) return false;
    const int64_t want = static_cast<int64_t>(i);
    if (*gi != want && *gi != want - static_cast<int64_t>(xs.size())) return false;
    const ir::Node* sh = produced_by(g_, ga->inputs[0], OpKind::kOnnxShape);
    if (sh == nullptr || sh->inputs[0] != x || sh->find_attr("start") != nullptr || sh->find_attr("end") != nullptr)
      return false;
    add.insert(g_.value(piece).producer);
    add.insert(g_.value(un->inputs[0]).producer);
    add.insert(g_.value(ga->inputs[0]).producer);
  }
  // A shape built from other values' dims stays outside the match (its
  // pieces are often shared with other reshapes).
  if (outside) {
    m.outside_shape = shp;
    return true;
  }
  m.nodes.insert(add.begin(), add.end());
  return true;
}

bool Matcher::closed(const Match& m) {
  for (int ni : m.nodes) {
    const ir::Node& n = at(ni);
    for (int in : n.inputs) {
      if (in < 0 || is_const(g_, in) || in == xf_ || in == x0_ || in == m.x || in == m.outside_shape) continue;
      const int p = g_.value(in).producer;
      if (p < 0 || m.nodes.count(p) == 0) return fail(n.name + " reads " + vname(in) + " from outside the MoE");
    }
    for (int out : n.outputs) {
      if (out == m.replaced) continue;
      if (rd_.is_output(out)) return fail(vname(out) + " is a graph output");
      for (int r : rd_.of(out))
        if (m.nodes.count(r) == 0) return fail(vname(out) + " is also read by " + at(r).name);
    }
  }
  return true;
}

bool Matcher::match(int topk, Match& m) {
  const ir::Node& t = at(topk);
  m.anchor_name = t.name;
  if (t.outputs.size() != 2 || t.inputs.size() != 2) return fail("TopK without both outputs");
  const ir::Node* mm = produced_by(g_, t.inputs[0], OpKind::kOnnxMatMul);
  if (mm == nullptr) return fail("TopK input is not a gate MatMul");
  xf_ = mm->inputs[0];
  m.gate = mm->inputs[1];
  if (!is_const(g_, m.gate)) return fail("gate weight " + vname(m.gate) + " is not a constant");
  const ir::Value& gw = g_.value(m.gate);
  if (gw.dtype != ir::DType::kF32 || !is_f32(g_, xf_)) return fail("gate or input is not f32");
  const auto& xs = g_.value(xf_).shape;
  if (gw.shape.size() != 2 || xs.size() != 2 || xs[1] != gw.shape[0])
    return fail("gate weight " + ir::shape_to_string(gw.shape) + " does not fit input " + ir::shape_to_string(xs));
  d_ = gw.shape[0];
  e_ = gw.shape[1];
  if (!rd_.single(t.inputs[0])) return fail("the gate logits have other readers than the TopK");
  const int64_t axis = t.attr_int("axis", -1);
  if (axis != -1 && axis != 1) return fail("TopK is not on the last axis");
  if (t.attr_int("largest", 1) != 1) return fail("TopK has largest=0");
  const auto k = const_int_scalar(g_, t.inputs[1]);
  if (!k || *k < 1 || *k > e_) return fail("TopK k is not a constant in 1..E");
  m.top_k = *k;
  m.n_experts = e_;
  const int sm = single_of(t.outputs[0], OpKind::kOnnxSoftmax);
  if (sm < 0) return fail("the top-k values are not read by one Softmax only (weights not a softmax of the top-k)");
  const int64_t sax = at(sm).attr_int("axis", -1);
  if (sax != -1 && sax != 1) return fail("the Softmax is not over the k axis");
  s_ = at(sm).outputs[0];
  idx_ = t.outputs[1];
  m.nodes = {g_.value(t.inputs[0]).producer, topk, sm};
  if (const ir::Node* rs = produced_by(g_, xf_, OpKind::kOnnxReshape)) {
    const int x0 = rs->inputs[0];
    if (is_f32(g_, x0) && !g_.value(x0).shape.empty() && g_.value(x0).shape.back() == d_) x0_ = x0;
  }
  m.experts.assign(static_cast<size_t>(e_), {});
  const std::vector<int> idx_readers = unique_readers(idx_);
  if (idx_readers.empty()) return fail("the top-k indices are unused");
  const ir::Node& first = at(idx_readers[0]);
  int y_end = -1;
  if (first.op == OpKind::kOnnxEqual) {
    if (!form_a(m, y_end)) return false;
  } else if (first.op == OpKind::kOnnxScatterElements) {
    if (!form_b(m, y_end)) return false;
  } else if (first.op == OpKind::kOnnxGather) {
    if (!form_c(m, y_end)) return false;
  } else {
    return fail("the top-k indices are read by " + first.name + " (no known dispatch form)");
  }
  m.swiglu = swiglu_ == 1;
  m.x = xf_;
  m.replaced = y_end;
  // Reshape back to x's shape: k3.Moe then reads x and replaces that Reshape.
  const int back = single_of(y_end, OpKind::kOnnxReshape);
  if (x0_ >= 0 && back >= 0 && at(back).inputs[0] == y_end) {
    Match tmp = m;
    if (is_shape_of(at(back).inputs[1], x0_, tmp)) {
      tmp.nodes.insert(back);
      tmp.x = x0_;
      tmp.replaced = at(back).outputs[0];
      // xf vanishes too when nothing else reads it.
      tmp.nodes.insert(g_.value(xf_).producer);
      bool only_inside = !rd_.is_output(xf_);
      for (int r : rd_.of(xf_)) only_inside = only_inside && tmp.nodes.count(r) != 0;
      if (!only_inside) tmp.nodes.erase(g_.value(xf_).producer);
      m = std::move(tmp);
    }
  }
  return closed(m);
}

// A new f32 [c, r] weight holding the transpose of the [r, c] weight v
// (of row `slice` of v when v is a stacked [E, r, c]).
int transposed(ir::Graph& g, int v, int64_t slice = -1) {
  const ir::Value w = g.value(v);
  const size_t rank = w.shape.size();
  const int64_t r = w.shape[rank - 2], c = w.shape[rank - 1];
  auto buf = std::make_shared<std::vector<float>>(static_cast<size_t>(r * c));
  const float* src = static_cast<const float*>(w.data) + (slice < 0 ? 0 : slice * r * c);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) (*buf)[static_cast<size_t>(j * r + i)] = src[i * c + j];
  const std::string name = w.name + (slice < 0 ? "" : ":e" + std::to_string(slice)) + ":moe_t";
  const int id = g.add_weight(name, ir::DType::kF32, {c, r}, buf->data());
  g.keep_alive.push_back(std::move(buf));
  return id;
}

// A view of row e of a stacked [E, a, b] weight (same buffer, kept alive by the graph).
int slice_of(ir::Graph& g, int v, int64_t e) {
  const ir::Value w = g.value(v);
  const int64_t a = w.shape[1], b = w.shape[2];
  const float* src = static_cast<const float*>(w.data) + e * a * b;
  return g.add_weight(w.name + ":e" + std::to_string(e), ir::DType::kF32, {a, b}, src);
}

}  // namespace

StatusOr<bool> FuseMoe::run(ir::Graph& g) {
  stats_ = PassStats();
  std::vector<Match> matches;
  {
    const Readers rd(g);
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      if (g.nodes()[i].op != OpKind::kOnnxTopK) continue;
      Matcher mt(g, rd);
      Match m;
      if (mt.match(static_cast<int>(i), m)) {
        bool overlap = false;
        for (const Match& o : matches)
          for (int n : m.nodes) overlap = overlap || o.nodes.count(n) != 0;
        if (overlap) {
          stats_.notes.push_back("TopK " + g.nodes()[i].name + ": overlaps another MoE match");
          continue;
        }
        ++stats_.matched;
        matches.push_back(std::move(m));
      } else if (produced_by(g, g.nodes()[i].inputs[0], OpKind::kOnnxMatMul) != nullptr) {
        stats_.notes.push_back("TopK " + g.nodes()[i].name + ": " + mt.why);
      }
    }
  }
  if (matches.empty()) return false;
  std::vector<Fusion> fusions;
  for (const Match& m : matches) {
    Fusion f;
    f.nodes.assign(m.nodes.begin(), m.nodes.end());
    f.fused.op = OpKind::kK3Moe;
    f.fused.name = m.anchor_name + "/k3.Moe";
    f.fused.inputs = {m.x, transposed(g, m.gate)};
    for (const auto& ws : m.experts)
      for (const WeightRef& w : ws)
        f.fused.inputs.push_back(w.transpose ? transposed(g, w.value, w.slice) : slice_of(g, w.value, w.slice));
    f.fused.outputs = {m.replaced};
    f.fused.attrs = {{"n_experts", m.n_experts}, {"top_k", m.top_k}, {"swiglu", int64_t{m.swiglu ? 1 : 0}}};
    ir::Value& out = g.values()[static_cast<size_t>(m.replaced)];
    out.shape = g.value(m.x).shape;
    out.dim_params = g.value(m.x).dim_params;
    fusions.push_back(std::move(f));
    ++stats_.applied;
  }
  apply_fusions(g, fusions);
  // The replaced values may now have better-known shapes: re-infer downstream.
  for (size_t i = 0; i < g.nodes().size(); ++i) K3_RETURN_IF_ERROR(refresh_onnx_types(g, i).status());
  return true;
}

}  // namespace k3::passes
