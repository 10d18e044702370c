// lower-to-plan: the last O3 step for an imported ONNX decoder
// (docs/onnx-lowering.md). When every node the logits depend on has a
// planned equivalent, the graph is rebuilt in the fused dialect for one
// step shape, with the engine's calling convention:
//
//   input_ids [B,S] -> tokens [T] i32      position_ids [B,S] -> positions [T] i32
//   (new) slots [T] i32, out_rows [R] i32  past_*/present_* -> KV cache state
//   [B,S,X] activations -> [T,X] rows (B*S tokens, any sequence mix)
//
//   Gather(table, input_ids) or GatherND(table, Unsqueeze(input_ids, -1)) -> Embedding
//   LayerNormalization / RMSNormalization (last axis, constant [D] params) -> LayerNorm / RmsNorm
//   MatMul(x, W const [K,N])           -> Linear(x, W^T [N,K])   (transposed here, stored in the .k3m)
//   Add(a, b) of two token rows        -> Add
//   k3.Rope                            -> Rope (tables read by position)
//   k3.Attention                       -> CachedAttention on "layers.{l}.k_cache"/"v_cache"
//   k3.Moe                             -> Moe
//   Reshape/Squeeze/Unsqueeze/Flatten keeping the last dim -> nothing (same rows)
//   the logits MatMul                  -> GatherRows(x, out_rows) then Linear: only the
//                                         rows whose logits are asked for
//
// Only data edges are followed back from the logits (a Reshape's target
// and the shape arithmetic feeding it are not needed once rows are rows).
// Guards (tests/passes/test_lower_to_plan.cc): batch dim unknown or 1;
// norms over the last axis with constant [D] parameters; MatMul weights
// constant 2-D; Add operands both token rows of one width; k3.Attention's
// positions are the position_ids input, its caches graph inputs, its
// presents read by nothing but the graph outputs, its scale 1/sqrt(hd);
// rotary tables cover the context; the attention count and heads agree
// with each other. Anything else the logits need -> the graph is left as it
// is (still correct on the interpreter) and a note names the node.
#include "passes/lower_to_plan.h"

#include "passes/onnx_match.h"

#include <cmath>
#include <cstring>
#include <map>
#include <memory>

namespace k3::passes {
namespace {

using ir::DType;
using ir::OpKind;

class Lowering {
 public:
  Lowering(const ir::Graph& g, const PipelineOptions::PlanShape& s) : g_(g), s_(s) {}

  // The lowered graph, or an error naming the first node that blocks it.
  StatusOr<ir::Graph> run() {
    const int ids = input("input_ids"), pos = input("position_ids");
    if (ids < 0 || pos < 0) return fail("the graph has no input_ids and position_ids inputs");
    const ir::Value& idv = g_.value(ids);
    if (idv.shape.size() != 2 || idv.shape[0] > 1) return fail("input_ids is not [1 or batch, seq]");
    const int logits = g_.find_value("logits");
    if (logits < 0 || !g_.value(logits).is_output) return fail("the graph has no logits output");
    mark_needed(logits);

    tokens_ = out_.add_input("tokens", DType::kI32, {s_.tokens}, ir::RowDim::kTokens);
    positions_ = out_.add_input("positions", DType::kI32, {s_.tokens}, ir::RowDim::kTokens);
    slots_ = out_.add_input("slots", DType::kI32, {s_.tokens}, ir::RowDim::kTokens);
    out_rows_ = out_.add_input("out_rows", DType::kI32, {s_.out_rows}, ir::RowDim::kOutRows);
    map_[ids] = tokens_;
    ids_ = ids;
    map_[pos] = positions_;
    logits_ = logits;
    for (size_t i = 0; i < g_.nodes().size(); ++i) {
      const ir::Node& n = g_.nodes()[i];
      bool need = false;
      for (int o : n.outputs) need = need || needed_[static_cast<size_t>(o)];
      if (need) K3_RETURN_IF_ERROR(lower(n));
    }
    auto it = map_.find(logits);
    if (it == map_.end()) return fail("the logits were not produced by a lowered node");
    out_.mark_output(it->second);
    out_.keep_alive = g_.keep_alive;
    for (auto& k : owned_) out_.keep_alive.push_back(k);
    K3_RETURN_IF_ERROR(out_.verify().with_context("lowered graph"));
    return std::move(out_);
  }

  int layers() const { return layer_; }

 private:
  static Status fail(const std::string& why) { return unimplemented(why); }
  static Status fail(const ir::Node& n, const std::string& why) {
    return unimplemented("node " + n.name + " (" + ir::op_name(n.op) + "): " + why);
  }

  int input(const char* name) const {
    const int id = g_.find_value(name);
    return id >= 0 && g_.value(id).kind == ir::ValueKind::kInput ? id : -1;
  }

  // Data inputs of a node: a Reshape's target, Unsqueeze/Squeeze axes and
  // the like only shape the ONNX tensor; rows stay rows.
  size_t data_inputs(const ir::Node& n) const {
    int table = -1, index = -1;
    std::string why;
    // An embedding lookup reads input_ids itself (GatherND's Unsqueeze of
    // the ids is part of the lookup, not a tensor of its own).
    if (n.op == OpKind::kOnnxGatherND && gathers_rows(g_, n, table, index, why)) return 1;
    switch (n.op) {
      case OpKind::kOnnxReshape:
      case OpKind::kOnnxSqueeze:
      case OpKind::kOnnxUnsqueeze:
      case OpKind::kOnnxFlatten:
        return 1;
      default:
        return n.inputs.size();
    }
  }

  void mark_needed(int root) {
    needed_.assign(g_.values().size(), false);
    std::vector<int> stack{root};
    while (!stack.empty()) {
      const int v = stack.back();
      stack.pop_back();
      if (v < 0 || needed_[static_cast<size_t>(v)]) continue;
      needed_[static_cast<size_t>(v)] = true;
      const int p = g_.value(v).producer;
      if (p < 0) continue;
      const ir::Node& n = g_.nodes()[static_cast<size_t>(p)];
      for (size_t i = 0; i < data_inputs(n); ++i) stack.push_back(n.inputs[i]);
    }
  }

  // The fused value standing for an ONNX activation, -1 if none.
  int mapped(int v) const {
    auto it = map_.find(v);
    return it == map_.end() ? -1 : it->second;
  }
  // The same, only for f32 token rows [T, X] (not the 1-D token/position
  // ids): what every op but the embedding lookup reads.
  int rows(int v) const {
    const int m = mapped(v);
    return m >= 0 && out_.value(m).shape.size() == 2 && out_.value(m).dtype == DType::kF32 ? m : -1;
  }
  bool is_const(int v) const { return v >= 0 && g_.value(v).kind == ir::ValueKind::kWeight; }
  // A constant of the given rank and dtype, else -1; re-registered in out_.
  int weight(int v, size_t rank) {
    if (!is_const(v) || g_.value(v).shape.size() != rank || g_.value(v).dtype != DType::kF32) return -1;
    auto it = weights_.find(v);
    if (it != weights_.end()) return it->second;
    const ir::Value& w = g_.value(v);
    const int id = out_.add_weight(w.name, w.dtype, w.shape, w.data);
    weights_[v] = id;
    return id;
  }
  int owned_weight(const std::string& name, std::vector<int64_t> shape, std::shared_ptr<float[]> data) {
    owned_.push_back(data);
    return out_.add_weight(name, DType::kF32, std::move(shape), data.get());
  }

  StatusOr<int> node(OpKind op, const std::string& name, std::vector<int> in, std::vector<ir::Attr> attrs = {}) {
    K3_ASSIGN_OR_RETURN(std::vector<int> outs, out_.add_node(op, name, std::move(in), std::move(attrs)));
    return outs[0];
  }

  Status lower(const ir::Node& n) {
    // Inputs as token rows; ids and positions are compared by their own ids.
    auto in = [&](size_t i) { return i < n.inputs.size() ? rows(n.inputs[i]) : -1; };
    auto id_in = [&](size_t i) { return i < n.inputs.size() ? mapped(n.inputs[i]) : -1; };
    const int out = n.outputs.empty() ? -1 : n.outputs[0];
    switch (n.op) {
      case OpKind::kOnnxGather:
      case OpKind::kOnnxGatherND: {
        // Gather(table, input_ids, axis 0), or the dynamo exporter's
        // GatherND(table, Unsqueeze(input_ids, -1)).
        int table_in = -1, index = -1;
        std::string why;
        if (!gathers_rows(g_, n, table_in, index, why) || index != ids_)
          return fail(n, "not an embedding lookup (constant [V, D] table gathered by input_ids)");
        const int table = weight(table_in, 2);
        if (table < 0) return fail(n, "not an embedding lookup (constant [V, D] table gathered by input_ids)");
        K3_ASSIGN_OR_RETURN(map_[out], node(OpKind::kEmbedding, n.name, {table, tokens_}));
        return Status();
      }
      case OpKind::kOnnxLayerNormalization:
      case OpKind::kOnnxRMSNormalization: {
        const int x = in(0);
        const int rank = static_cast<int>(g_.value(n.inputs[0]).shape.size());
        const int64_t axis = n.attr_int("axis", -1);
        if (x < 0 || (axis != -1 && axis != rank - 1)) return fail(n, "not a norm over the last axis of token rows");
        for (size_t o = 1; o < n.outputs.size(); ++o)
          if (needed_[static_cast<size_t>(n.outputs[o])]) return fail(n, "its mean/inv-std outputs are used");
        const int64_t d = out_.value(x).shape[1];
        const int w = weight(n.inputs[1], 1);
        if (w < 0 || out_.value(w).shape[0] != d) return fail(n, "scale is not a constant [D]");
        const double eps = n.attr_float("epsilon", 1e-5);
        if (n.op == OpKind::kOnnxRMSNormalization) {
          K3_ASSIGN_OR_RETURN(map_[out], node(OpKind::kRmsNorm, n.name, {x, w}, {{"eps", eps}}));
          return Status();
        }
        int b = n.inputs.size() > 2 && n.inputs[2] >= 0 ? weight(n.inputs[2], 1) : -1;
        if (n.inputs.size() > 2 && n.inputs[2] >= 0 && (b < 0 || out_.value(b).shape[0] != d))
          return fail(n, "bias is not a constant [D]");
        if (b < 0) {
          auto zeros = std::shared_ptr<float[]>(new float[static_cast<size_t>(d)]());
          b = owned_weight(n.name + ".bias_zero", {d}, zeros);
        }
        K3_ASSIGN_OR_RETURN(map_[out], node(OpKind::kLayerNorm, n.name, {x, w, b}, {{"eps", eps}}));
        return Status();
      }
      case OpKind::kOnnxMatMul: {
        int x = in(0);
        const ir::Value& wv = g_.value(n.inputs[1]);
        if (x < 0 || !is_const(n.inputs[1]) || wv.shape.size() != 2 || wv.dtype != DType::kF32)
          return fail(n, "not token rows times a constant f32 [K, N] matrix");
        const int64_t k = wv.shape[0], cols = wv.shape[1];
        if (out_.value(x).shape[1] != k) return fail(n, "inner dims differ");
        // W [K, N] -> W^T [N, K] (PyTorch's Linear layout, what the kernels
        // read), once per weight however many MatMuls read it.
        int wt = transposed_.count(n.inputs[1]) ? transposed_[n.inputs[1]] : -1;
        if (wt < 0) {
          auto t = std::shared_ptr<float[]>(new float[static_cast<size_t>(k * cols)]);
          const float* src = static_cast<const float*>(wv.data);
          for (int64_t r = 0; r < k; ++r)
            for (int64_t c = 0; c < cols; ++c) t[static_cast<size_t>(c * k + r)] = src[r * cols + c];
          wt = transposed_[n.inputs[1]] = owned_weight(wv.name + ".T", {cols, k}, t);
        }
        if (out == logits_) {
          K3_ASSIGN_OR_RETURN(x, node(OpKind::kGatherRows, "select_rows", {x, out_rows_}));
        }
        K3_ASSIGN_OR_RETURN(map_[out], node(OpKind::kLinear, n.name, {x, wt}));
        return Status();
      }
      case OpKind::kOnnxAdd: {
        const int a = in(0), b = in(1);
        if (a < 0 || b < 0 || out_.value(a).shape != out_.value(b).shape)
          return fail(n, "not a sum of two token-row tensors of one width");
        K3_ASSIGN_OR_RETURN(map_[out], node(OpKind::kAdd, n.name, {a, b}));
        return Status();
      }
      case OpKind::kOnnxReshape:
      case OpKind::kOnnxSqueeze:
      case OpKind::kOnnxUnsqueeze:
      case OpKind::kOnnxFlatten: {
        const int x = in(0);
        const std::vector<int64_t>& to = g_.value(out).shape;
        // Reshape(x, Shape(x)) is x whatever its dims.
        const int target_producer = n.op == OpKind::kOnnxReshape ? g_.value(n.inputs[1]).producer : -1;
        const bool identity = target_producer >= 0 &&
                              g_.nodes()[static_cast<size_t>(target_producer)].op == OpKind::kOnnxShape &&
                              g_.nodes()[static_cast<size_t>(target_producer)].inputs[0] == n.inputs[0] &&
                              g_.nodes()[static_cast<size_t>(target_producer)].attrs.empty();
        if (x >= 0 && identity) {
          map_[out] = x;
          return Status();
        }
        if (x < 0 || to.empty() || to.back() != out_.value(x).shape[1])
          return fail(n, "changes the row width (only regrouping token rows is free)");
        map_[out] = x;
        return Status();
      }
      case OpKind::kK3Rope: {
        const int x = in(0);
        const int cos = weight(n.inputs[2], 2), sin = weight(n.inputs[3], 2);
        if (x < 0 || id_in(1) != positions_ || cos < 0 || sin < 0)
          return fail(n, "not on token rows with position_ids and constant tables");
        if (out_.value(cos).shape[0] < s_.ctx) return fail(n, "the rotary table has fewer positions than the context");
        K3_ASSIGN_OR_RETURN(
            map_[out], node(OpKind::kRope, n.name, {x, positions_, cos, sin}, {{"head_dim", n.attr_int("head_dim")}}));
        return Status();
      }
      case OpKind::kK3Attention: {
        const int q = in(0), k = in(1), v = in(2);
        if (q < 0 || k < 0 || v < 0 || id_in(3) != positions_)
          return fail(n, "q/k/v are not token rows or positions are not position_ids");
        for (int i : {4, 5})
          if (g_.value(n.inputs[static_cast<size_t>(i)]).kind != ir::ValueKind::kInput)
            return fail(n, "its past caches are not graph inputs");
        for (size_t o = 1; o < n.outputs.size(); ++o)
          if (needed_[static_cast<size_t>(n.outputs[o])]) return fail(n, "a present cache is read inside the graph");
        const int64_t hq = n.attr_int("n_heads"), hkv = n.attr_int("n_kv_heads"), hd = n.attr_int("head_dim");
        const double scale = n.attr_float("scale", 1.0 / std::sqrt(static_cast<double>(hd)));
        if (std::fabs(scale * std::sqrt(static_cast<double>(hd)) - 1.0) > 1e-6)
          return fail(n, "its scale is not 1/sqrt(head_dim)");
        if (heads_ == 0) {
          heads_ = hq;
          kv_heads_ = hkv;
          head_dim_ = hd;
        } else if (heads_ != hq || kv_heads_ != hkv || head_dim_ != hd) {
          return fail(n, "its head counts differ from the first attention's");
        }
        const std::string p = "layers." + std::to_string(layer_) + ".";
        const std::vector<int64_t> cache{s_.slots, hkv, s_.ctx, hd};
        const int kc = out_.add_state(p + "k_cache", DType::kF32, cache);
        const int vc = out_.add_state(p + "v_cache", DType::kF32, cache);
        K3_ASSIGN_OR_RETURN(map_[out],
                            node(OpKind::kCachedAttention, n.name, {q, k, v, positions_, slots_, kc, vc},
                                 {{"n_heads", hq}, {"n_kv_heads", hkv}, {"head_dim", hd}, {"layer", int64_t{layer_}}}));
        ++layer_;
        return Status();
      }
      case OpKind::kK3Moe: {
        std::vector<int> ins{in(0)};
        if (ins[0] < 0) return fail(n, "its input is not token rows");
        for (size_t i = 1; i < n.inputs.size(); ++i) {
          const int w = weight(n.inputs[i], 2);
          if (w < 0) return fail(n, "an expert or gate weight is not a constant matrix");
          ins.push_back(w);
        }
        K3_ASSIGN_OR_RETURN(map_[out], node(OpKind::kMoe, n.name, ins,
                                            {{"n_experts", n.attr_int("n_experts")},
                                             {"top_k", n.attr_int("top_k")},
                                             {"swiglu", n.attr_int("swiglu")},
                                             {"dense", int64_t{0}}}));
        return Status();
      }
      default:
        return fail(n, "has no planned equivalent");
    }
  }

  const ir::Graph& g_;
  PipelineOptions::PlanShape s_;
  ir::Graph out_;
  std::vector<bool> needed_;
  std::map<int, int> map_, weights_, transposed_;
  std::vector<std::shared_ptr<const void>> owned_;
  int ids_ = -1;
  int tokens_ = -1, positions_ = -1, slots_ = -1, out_rows_ = -1, logits_ = -1;
  int layer_ = 0;
  int64_t heads_ = 0, kv_heads_ = 0, head_dim_ = 0;
};

}  // namespace

StatusOr<bool> LowerToPlan::run(ir::Graph& g) {
  if (shape_.tokens < 1) return false;
  if (shape_.out_rows < 1 || shape_.slots < 1 || shape_.ctx < 1)
    return invalid_argument("lower-to-plan: invalid step shape");
  Lowering l(g, shape_);
  StatusOr<ir::Graph> out = l.run();
  if (!out.ok()) {
    // Not an error: the graph stays correct on the interpreter.
    stats_.notes.push_back("not lowered: " + out.status().message());
    return false;
  }
  stats_.matched = stats_.applied = 1;
  stats_.notes.push_back("lowered " + std::to_string(l.layers()) + " attention layers to the planned executor");
  g = std::move(*out);
  return true;
}

}  // namespace k3::passes
