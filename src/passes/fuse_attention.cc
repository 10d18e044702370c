// fuse-attention: folds the causal grouped-query attention that k3ref's
// exporters write (python/k3ref/export_onnx.py, _gqa_attention with the
// naive concat cache or the static decode slot cache) into one k3.Attention
// (docs/onnx-lowering.md). Runs after fuse-rope, so q and k reach the head
// split through layout ops only.
//
//   Xq [B,S,Hq*hd] --layout--> qo [B,Hkv,G,S,hd] (or [B,Hq,S,hd] when G = 1)
//   Xk [B,S,Hkv*hd] --layout--> kn [B,Hkv,S,hd]
//   present_k = Concat(past_k, kn, axis 2)            (cache "concat")
//            or Where(write, kn, past_k)              (cache "slot", S = 1)
//   present_k --layout--> ko [B,Hkv,1,hd,K] (or [B,Hkv,hd,K])
//   (same for v: present_v --layout--> vo [B,Hkv,1,K,hd] (or [B,Hkv,K,hd]))
//
//   scores = MatMul(qo, ko)
//     [-> Mul(., c) | Mul(c, .) | Div(., c)]          scale = c (or 1/c), else 1
//     -> Where(cond, -inf, .) | Where(cond, ., -inf)  the position mask
//     -> Softmax(last axis)
//     -> MatMul(., vo) --layout--> out [B,S,Hq*hd]
//
//   ==> out, present_k, present_v = k3.Attention(Xq, Xk, Xv, positions, past_k, past_v;
//                                                n_heads, n_kv_heads, head_dim, cache, scale)
//
// The layout chains and masks are verified semantically, not by op
// sequence: the pass concretizes the graph once (every unknown dim gets a
// small distinct value per dim_param, int graph inputs of rank <= 2 get
// distinct small values, and shapes, plus the data of non-float tensors,
// are propagated with the reference shape rules and kernels). Then:
//   - each layout chain (Reshape, Transpose, Unsqueeze, Squeeze, Flatten)
//     is run on an iota tensor and must be exactly the standard head split
//     / cache view / head merge: query head j = h * G + g reads kv head h;
//   - the mask condition's data must be "key s is masked for query [b,t]
//     iff s > positions[b,t]" broadcast over the heads, for one int graph
//     input `positions` [B,S] (so it comes from position ids and a key
//     index range, not from a learned or padded mask);
//   - the slot write mask must be "slot s is written iff s == positions[b,0]".
// The scale is recorded in the `scale` attribute (any scalar constant is
// accepted, not only 1/sqrt(hd)).
//
// Guards (each has a must-not-match test in tests/passes/test_fuse_attention.cc):
//   - Softmax on the last axis;
//   - scores, q, k, v and the caches f32;
//   - the scale, when present, a constant holding one number;
//   - the mask a Where with a constant -inf (or float lowest) branch whose
//     condition is causal by position as above (an additive mask is not
//     matched: it is noted);
//   - past_k / past_v graph inputs, present_k / present_v graph outputs of
//     the same cache style, the same positions for the mask and the write;
//   - head counts consistent: Hq = Hkv * G, Xq width Hq*hd, Xk/Xv width
//     Hkv*hd, cache [B,Hkv,K,hd];
//   - every intermediate (everything the match removes but the presents)
//     is not a graph output and its readers outside the match only compute
//     values that die with the match (the Shape ops of reshape targets).
// A Softmax that fails a guard is noted with its node name and the reason.
// The fused node takes the place of the head merge's last node; nodes that
// only fed the match (mask, shape arithmetic) are removed, and the graph is
// re-sorted topologically (present readers may have preceded it).
#include "passes/fuse_attention.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "ir/onnx_shape.h"
#include "kernels/onnx_ref/onnx_ref.h"
#include "passes/dead_code.h"
#include "passes/graph_edit.h"
#include "passes/onnx_match.h"

namespace k3::passes {
namespace {

using ir::OpKind;
using ir::Tensor;
using Shape = std::vector<int64_t>;

const ir::Node& at(const ir::Graph& g, int i) {
  return g.nodes()[static_cast<size_t>(i)];
}

bool is_layout(OpKind op) {
  return op == OpKind::kOnnxReshape || op == OpKind::kOnnxTranspose || op == OpKind::kOnnxUnsqueeze ||
         op == OpKind::kOnnxSqueeze || op == OpKind::kOnnxFlatten;
}

// One concrete instance of the graph: every value's shape, and the data of
// the small non-float values (shape arithmetic, masks, positions).
struct Concrete {
  std::vector<Shape> shape;
  std::vector<std::optional<Tensor>> data;
};

// Distinct small values for the int graph inputs' elements: input number
// `which`, element (b, t) of a [B, S] tensor. All < 6, so they are valid
// positions in any cache of the concrete instance (K >= 7) and token ids.
int64_t input_value(size_t which, int64_t i, int64_t cols) {
  const int64_t b = cols > 0 ? i / cols : 0, t = cols > 0 ? i % cols : 0;
  return (7 * b + 3 * t + 2 + 2 * static_cast<int64_t>(which)) % 6;
}

StatusOr<Concrete> concretize(const ir::Graph& g) {
  Concrete c;
  c.shape.resize(g.values().size());
  c.data.resize(g.values().size());
  std::map<std::string, int64_t> named;
  const int64_t picks[] = {2, 3, 5, 4, 7, 6, 9, 8};
  size_t next = 0;
  auto pick = [&](const std::string& name) {
    if (!name.empty()) {
      auto it = named.find(name);
      if (it != named.end()) return it->second;
    }
    const int64_t v = next < std::size(picks) ? picks[next] : static_cast<int64_t>(next) + 2;
    ++next;
    if (!name.empty()) named[name] = v;
    return v;
  };
  for (size_t vi = 0; vi < g.values().size(); ++vi) {
    const ir::Value& v = g.values()[vi];
    if (v.kind == ir::ValueKind::kWeight) {
      c.shape[vi] = v.shape;
      c.data[vi] = Tensor::view(v.dtype, v.shape, v.data, nullptr);
    }
  }
  size_t which = 0;
  for (int id : g.inputs()) {
    const ir::Value& v = g.value(id);
    Shape s = v.shape;
    for (size_t d = 0; d < s.size(); ++d)
      if (s[d] < 0) s[d] = pick(d < v.dim_params.size() ? v.dim_params[d] : "");
    c.shape[static_cast<size_t>(id)] = s;
    if ((v.dtype == ir::DType::kI64 || v.dtype == ir::DType::kI32) && s.size() <= 2) {
      auto t = Tensor::zeros(v.dtype, s);
      if (!t) return invalid_argument("input " + v.name + " is too large");
      const int64_t cols = s.size() == 2 ? s[1] : 0;
      for (int64_t i = 0; i < t->numel(); ++i) {
        const int64_t x = input_value(which, i, cols);
        if (v.dtype == ir::DType::kI64)
          t->mut<int64_t>()[i] = x;
        else
          t->mut<int32_t>()[i] = static_cast<int32_t>(x);
      }
      c.data[static_cast<size_t>(id)] = std::move(*t);
      ++which;
    }
  }
  for (const ir::Node& n : g.nodes()) {
    if (!ir::is_onnx_op(n.op)) return invalid_argument("node " + n.name + " is not an onnx-style op");
    std::vector<ir::OnnxInput> in;
    bool all_data = true;
    for (int id : n.inputs) {
      ir::OnnxInput oi;
      if (id >= 0) {
        const ir::Value& v = g.value(id);
        oi.present = true;
        oi.dtype = v.dtype;
        oi.shape = c.shape[static_cast<size_t>(id)];
        const auto& d = c.data[static_cast<size_t>(id)];
        oi.data = d ? d->raw() : nullptr;
        all_data = all_data && d.has_value();
      }
      in.push_back(oi);
    }
    std::vector<ir::OutType> out;
    if (!ir::infer_onnx(n, in, out).ok()) {
      // Not valid in this instance (a value-dependent shape): keep the
      // compile-time shapes, no data.
      for (int o : n.outputs) c.shape[static_cast<size_t>(o)] = g.value(o).shape;
      continue;
    }
    bool small = true;
    for (size_t o = 0; o < n.outputs.size() && o < out.size(); ++o) {
      c.shape[static_cast<size_t>(n.outputs[o])] = out[o].shape;
      int64_t numel = 1;
      for (int64_t d : out[o].shape) numel *= d;
      small = small && (numel <= 16 || !ir::dtype_is_float(out[o].dtype)) && numel <= (int64_t{1} << 20);
    }
    if (n.op == OpKind::kOnnxShape && !n.inputs.empty()) {
      const Shape& s = c.shape[static_cast<size_t>(n.inputs[0])];
      if (std::any_of(s.begin(), s.end(), [](int64_t d) { return d < 0; })) continue;
      const Shape& os = c.shape[static_cast<size_t>(n.outputs[0])];
      const int64_t r = static_cast<int64_t>(s.size());
      int64_t first = n.attr_int("start", 0);
      if (first < 0) first += r;
      first = std::clamp<int64_t>(first, 0, r);
      auto t = Tensor::zeros(ir::DType::kI64, os);
      for (int64_t i = 0; i < t->numel(); ++i) t->mut<int64_t>()[i] = s[static_cast<size_t>(first + i)];
      c.data[static_cast<size_t>(n.outputs[0])] = std::move(*t);
      continue;
    }
    if (!all_data || !small) continue;
    std::vector<const Tensor*> ins;
    for (int id : n.inputs) ins.push_back(id >= 0 ? &*c.data[static_cast<size_t>(id)] : nullptr);
    auto r = onnx_ref::eval_node(g, n, ins);
    if (!r.ok()) continue;  // e.g. an index out of range in this instance: data stays unknown
    for (size_t o = 0; o < n.outputs.size() && o < r->size(); ++o)
      c.data[static_cast<size_t>(n.outputs[o])] = std::move((*r)[o]);
  }
  return c;
}

// Index arithmetic on concrete shapes.
Shape unflatten(int64_t i, const Shape& s) {
  Shape idx(s.size());
  for (size_t d = s.size(); d-- > 0;) {
    idx[d] = s[d] > 0 ? i % s[d] : 0;
    i = s[d] > 0 ? i / s[d] : 0;
  }
  return idx;
}
int64_t flatten(const Shape& idx, const Shape& s) {
  int64_t i = 0;
  for (size_t d = 0; d < s.size(); ++d) i = i * s[d] + idx[d];
  return i;
}

// Element at `idx` (of shape `full`) of a tensor broadcast to `full`.
int64_t bcast_int(const Tensor& t, const Shape& idx, const Shape& full) {
  const Shape& s = t.shape();
  const size_t off = full.size() - s.size();
  int64_t flat = 0;
  for (size_t d = 0; d < s.size(); ++d) flat = flat * s[d] + (s[d] == 1 ? 0 : idx[off + d]);
  switch (t.dtype()) {
    case ir::DType::kBool:
    case ir::DType::kU8:
      return t.data<uint8_t>()[flat];
    case ir::DType::kI32:
      return t.data<int32_t>()[flat];
    case ir::DType::kI64:
      return t.data<int64_t>()[flat];
    default:
      return 0;
  }
}

struct Matcher {
  const ir::Graph& g;
  const Readers& rd;
  const Concrete& c;
  std::string why;

  const Shape& shape(int v) const { return c.shape[static_cast<size_t>(v)]; }

  const ir::Node* producer(int v) const {
    if (v < 0) return nullptr;
    const int p = g.value(v).producer;
    return p < 0 ? nullptr : &at(g, p);
  }

  // Walks back from `v` through layout ops until `stop(value)` or a value
  // not produced by one; the chain comes out source-first.
  int back(int v, std::vector<int>& chain, const std::function<bool(int)>& stop) const {
    std::vector<int> rev;
    while (!stop(v)) {
      const int p = g.value(v).producer;
      if (p < 0 || !is_layout(at(g, p).op) || at(g, p).inputs.empty()) break;
      rev.push_back(p);
      v = at(g, p).inputs[0];
    }
    chain.assign(rev.rbegin(), rev.rend());
    return v;
  }

  // Runs `chain` on an iota tensor of src's concrete shape; the result must
  // have shape `want` and element idx must be src element `src_of(idx)`.
  bool check_chain(const std::vector<int>& chain, int src, const Shape& want,
                   const std::function<int64_t(const Shape&)>& src_of) const {
    auto t = Tensor::zeros(ir::DType::kI64, shape(src));
    if (!t) return false;
    for (int64_t i = 0; i < t->numel(); ++i) t->mut<int64_t>()[i] = i;
    Tensor cur = std::move(*t);
    for (int ni : chain) {
      const ir::Node& n = at(g, ni);
      std::vector<const Tensor*> ins = {&cur};
      for (size_t k = 1; k < n.inputs.size(); ++k) {
        const int id = n.inputs[k];
        if (id >= 0 && !c.data[static_cast<size_t>(id)]) return false;
        ins.push_back(id >= 0 ? &*c.data[static_cast<size_t>(id)] : nullptr);
      }
      // eval_node checks results against the value's compile-time dtype:
      // run it on a copy of the node typed as the iota.
      const ir::Graph& sg = iota_graph(n, ins);
      auto r = onnx_ref::eval_node(sg, sg.nodes().back(), ins);
      if (!r.ok() || r->empty()) return false;
      cur = std::move((*r)[0]);
    }
    if (cur.shape() != want) return false;
    for (int64_t i = 0; i < cur.numel(); ++i)
      if (cur.data<int64_t>()[i] != src_of(unflatten(i, want))) return false;
    return true;
  }

  // A two-value graph for evaluating one layout node on int64 data.
  mutable ir::Graph scratch;
  ir::Graph& iota_graph(const ir::Node& n, const std::vector<const Tensor*>& ins) const {
    scratch = ir::Graph();
    std::vector<int> ids;
    for (size_t k = 0; k < ins.size(); ++k) {
      if (ins[k] == nullptr) {
        ids.push_back(-1);
        continue;
      }
      ids.push_back(scratch.add_input("in" + std::to_string(k), ins[k]->dtype(), ins[k]->shape(), ir::RowDim::kFixed));
    }
    ir::Node m = n;
    m.inputs = ids;
    const Shape& os = shape(n.outputs[0]);
    ir::Value out;
    out.name = "out";
    out.dtype = ir::DType::kI64;
    out.shape = os;
    m.outputs = {scratch.add_value(out)};
    scratch.append_node(m);
    return scratch;
  }

  bool fail(const std::string& w) {
    why = w;
    return false;
  }

  // Every reader of `v` is in `m` or dies with the match; `v` is no output.
  bool contained(int v, const std::set<int>& m) const {
    if (rd.is_output(v)) return false;
    memo.clear();
    for (int r : rd.of(v))
      if (!m.count(r) && !dies(r, m, 0)) return false;
    return true;
  }
  // Whether every result of `node` only feeds nodes of `m` (or such nodes).
  bool dies(int node, const std::set<int>& m, int depth) const {
    auto it = memo.find(node);
    if (it != memo.end()) return it->second;
    bool d = depth <= 64;
    for (int o : at(g, node).outputs) {
      if (!d) break;
      if (rd.is_output(o)) d = false;
      for (int r : rd.of(o))
        if (d && !m.count(r) && !dies(r, m, depth + 1)) d = false;
    }
    memo[node] = d;
    return d;
  }
  mutable std::map<int, bool> memo;
};

std::optional<Fusion> match(ir::Graph& g, const Readers& rd, const Concrete& c, int sm_i, std::string& why) {
  Matcher mt{g, rd, c, "", ir::Graph(), {}};
  auto no = [&](const std::string& w) -> std::optional<Fusion> {
    why = w;
    return std::nullopt;
  };
  const ir::Node& sm = at(g, sm_i);
  if (sm.inputs.empty() || sm.outputs.empty()) return std::nullopt;
  std::set<int> m = {sm_i};
  // Backwards: the mask, the scale, the scores MatMul.
  int x = sm.inputs[0];
  const ir::Node* mask = mt.producer(x);
  if (mask == nullptr || (mask->op != OpKind::kOnnxWhere && mask->op != OpKind::kOnnxAdd)) return std::nullopt;
  const int64_t rank = static_cast<int64_t>(g.value(x).shape.size());
  if (rank != 4 && rank != 5) return std::nullopt;
  if (mask->op == OpKind::kOnnxAdd) return no("additive attention mask (only Where masks are matched)");
  if (onnx_ref::norm_axis(sm.attr_int("axis", -1), rank) != rank - 1) return no("Softmax is not on the last axis");
  if (!is_f32(g, x)) return no("scores are not f32");
  int cond = mask->inputs[0];
  bool cond_masks = false;
  int scaled = -1;
  auto neg_inf = [&](int v) {
    const auto s = constant_scalar(g, v, static_cast<size_t>(rank));
    return s && *s <= -static_cast<double>(std::numeric_limits<float>::max());
  };
  if (neg_inf(mask->inputs[1])) {
    cond_masks = true;
    scaled = mask->inputs[2];
  } else if (neg_inf(mask->inputs[2])) {
    scaled = mask->inputs[1];
  } else {
    return no("the Where before Softmax has no constant -inf branch");
  }
  m.insert(g.value(x).producer);
  double scale = 1.0;
  int scores = scaled;
  const ir::Node* sn = mt.producer(scaled);
  if (sn != nullptr && (sn->op == OpKind::kOnnxMul || sn->op == OpKind::kOnnxDiv)) {
    const bool div = sn->op == OpKind::kOnnxDiv;
    int other = -1;
    const ir::Node* mm0 = mt.producer(sn->inputs[0]);
    const ir::Node* mm1 = mt.producer(sn->inputs[1]);
    if (mm0 != nullptr && mm0->op == OpKind::kOnnxMatMul) {
      scores = sn->inputs[0];
      other = sn->inputs[1];
    } else if (!div && mm1 != nullptr && mm1->op == OpKind::kOnnxMatMul) {
      scores = sn->inputs[1];
      other = sn->inputs[0];
    } else {
      return no("the scaled scores do not come from a MatMul");
    }
    const auto s = constant_scalar(g, other, static_cast<size_t>(rank));
    if (!s || *s == 0.0) return no("the scale is not a scalar constant");
    scale = div ? 1.0 / *s : *s;
    m.insert(g.value(scaled).producer);
  }
  const ir::Node* qk = mt.producer(scores);
  if (qk == nullptr || qk->op != OpKind::kOnnxMatMul) return no("the masked scores do not come from a MatMul");
  m.insert(g.value(scores).producer);
  const int qo = qk->inputs[0], ko = qk->inputs[1];

  // Forwards: Softmax -> MatMul(., vo) -> head merge.
  const int probs = sm.outputs[0];
  if (rd.of(probs).size() != 1 || rd.is_output(probs)) return no("the probabilities have other readers");
  const int pv_i = rd.of(probs)[0];
  const ir::Node& pvn = at(g, pv_i);
  if (pvn.op != OpKind::kOnnxMatMul || pvn.inputs[0] != probs) return no("the probabilities are not MatMul'd with V");
  m.insert(pv_i);
  const int vo = pvn.inputs[1];
  int out = pvn.outputs[0];
  std::vector<int> merge;
  while (c.shape[static_cast<size_t>(out)].size() != 3) {
    int next = -1;
    for (int r : rd.of(out))
      if (at(g, r).op != OpKind::kOnnxShape) next = next < 0 ? r : -2;
    if (next < 0 || rd.is_output(out) || !is_layout(at(g, next).op) || at(g, next).inputs[0] != out) break;
    merge.push_back(next);
    out = at(g, next).outputs[0];
  }
  for (int k : merge) m.insert(k);

  // K / V: back from the MatMul operands to the caches.
  auto cache_of = [&](int v) {
    const ir::Node* p = mt.producer(v);
    return p != nullptr && (p->op == OpKind::kOnnxConcat || p->op == OpKind::kOnnxWhere);
  };
  std::vector<int> kchain, vchain, qchain;
  const int pk = mt.back(ko, kchain, cache_of);
  const int pvv = mt.back(vo, vchain, cache_of);
  if (!cache_of(pk) || !cache_of(pvv)) return no("K or V is not read from a Concat or Where KV cache");
  const ir::Node& kc = *mt.producer(pk);
  const ir::Node& vc = *mt.producer(pvv);
  if (kc.op != vc.op) return no("K and V caches differ in style");
  const bool slot = kc.op == OpKind::kOnnxWhere;
  for (int v : {pk, pvv})
    if (!rd.is_output(v)) return no("the present cache " + g.value(v).name + " is not a graph output");
  const Shape& cs = c.shape[static_cast<size_t>(pk)];
  if (cs.size() != 4 || c.shape[static_cast<size_t>(pvv)] != cs) return no("the caches are not [B,Hkv,K,hd]");
  const int64_t b_n = cs[0], hkv = cs[1], k_n = cs[2], hd = cs[3];

  // Q: back to the [B,S,Hq*hd] source.
  const int xq = mt.back(qo, qchain, [&](int v) { return c.shape[static_cast<size_t>(v)].size() == 3; });
  const Shape& qs = c.shape[static_cast<size_t>(xq)];
  if (qs.size() != 3) return no("q is not reached from a [B,S,H*hd] tensor through layout ops (rope not fused?)");
  const int64_t s_n = qs[1];
  const Shape& qos = c.shape[static_cast<size_t>(qo)];
  const int64_t grp = qos.size() == 5 ? qos[2] : 1;
  const int64_t hq = hkv * grp;
  if (qos.size() != static_cast<size_t>(rank) || c.shape[static_cast<size_t>(ko)].size() != static_cast<size_t>(rank) ||
      c.shape[static_cast<size_t>(vo)].size() != static_cast<size_t>(rank))
    return no("q, k, v operands differ in rank");
  if (rank == 4 && qos[1] != hkv) return no("4-D scores with n_heads != n_kv_heads");
  if (qs[0] != b_n || qs[2] != hq * hd)
    return no("head counts inconsistent: q width " + std::to_string(qs[2]) + " vs " + std::to_string(hq) +
              " heads of " + std::to_string(hd));
  for (int v : {xq, pk, pvv, qo, ko, vo})
    if (!is_f32(g, v)) return no("q, k, v and the caches must be f32");

  // The layout chains, on iota tensors.
  const Shape want_q = rank == 5 ? Shape{b_n, hkv, grp, s_n, hd} : Shape{b_n, hq, s_n, hd};
  auto q_src = [&](const Shape& i) {
    const int64_t j = rank == 5 ? i[1] * grp + i[2] : i[1];
    return flatten({i[0], i[rank - 2], j * hd + i[rank - 1]}, qs);
  };
  if (!mt.check_chain(qchain, xq, want_q, q_src)) return no("q's layout chain is not the standard head split");
  const Shape want_k = rank == 5 ? Shape{b_n, hkv, 1, hd, k_n} : Shape{b_n, hkv, hd, k_n};
  auto k_src = [&](const Shape& i) { return flatten({i[0], i[1], i[rank - 1], i[rank - 2]}, cs); };
  if (!mt.check_chain(kchain, pk, want_k, k_src)) return no("K's layout chain is not K^T of the cache per kv head");
  const Shape want_v = rank == 5 ? Shape{b_n, hkv, 1, k_n, hd} : Shape{b_n, hkv, k_n, hd};
  auto v_src = [&](const Shape& i) { return flatten({i[0], i[1], i[rank - 2], i[rank - 1]}, cs); };
  if (!mt.check_chain(vchain, pvv, want_v, v_src)) return no("V's layout chain is not the cache per kv head");
  const Shape pv_shape = c.shape[static_cast<size_t>(pvn.outputs[0])];
  auto o_src = [&](const Shape& i) {
    const int64_t j = i[2] / hd, d = i[2] % hd;
    return rank == 5 ? flatten({i[0], j / grp, j % grp, i[1], d}, pv_shape) : flatten({i[0], j, i[1], d}, pv_shape);
  };
  if (pv_shape != want_q || !mt.check_chain(merge, pvn.outputs[0], {b_n, s_n, hq * hd}, o_src))
    return no("the output's layout chain is not the standard head merge");

  // The caches: past inputs, new k/v through a head split.
  int past[2], xkv[2];
  std::vector<int> newchain[2];
  for (int w = 0; w < 2; ++w) {
    const ir::Node& cn = w == 0 ? kc : vc;
    int nv = -1;
    if (!slot) {
      if (cn.inputs.size() != 2 || onnx_ref::norm_axis(cn.attr_int("axis", 0), 4) != 2)
        return no("the cache Concat is not (past, new) on axis 2");
      past[w] = cn.inputs[0];
      nv = cn.inputs[1];
    } else {
      past[w] = cn.inputs[2];
      nv = cn.inputs[1];
    }
    if (g.value(past[w]).kind != ir::ValueKind::kInput) return no("the past cache is not a graph input");
    xkv[w] = mt.back(nv, newchain[w], [&](int v) { return c.shape[static_cast<size_t>(v)].size() == 3; });
    const Shape& xs = c.shape[static_cast<size_t>(xkv[w])];
    if (xs.size() != 3 || xs[0] != b_n || xs[1] != s_n || xs[2] != hkv * hd)
      return no("head counts inconsistent: new k/v is not [B,S,Hkv*hd] through layout ops");
    if (!is_f32(g, xkv[w]) || !is_f32(g, past[w])) return no("q, k, v and the caches must be f32");
    auto n_src = [&](const Shape& i) { return flatten({i[0], i[2], i[1] * hd + i[3]}, xs); };
    if (!mt.check_chain(newchain[w], xkv[w], {b_n, hkv, s_n, hd}, n_src))
      return no("new k/v's layout chain is not the standard head split");
    const Shape& ps = c.shape[static_cast<size_t>(past[w])];
    if (ps.size() != 4 || ps[0] != b_n || ps[1] != hkv || ps[3] != hd || ps[2] != (slot ? k_n : k_n - s_n))
      return no("the past cache is not [B,Hkv,P,hd]");
  }

  // Positions: the int [B,S] graph input that the mask is causal by.
  const auto& cd = c.data[static_cast<size_t>(cond)];
  if (!cd) return no("the mask does not come from graph inputs and constants (not causal by position)");
  const Shape& score_shape = c.shape[static_cast<size_t>(scores)];
  int positions = -1;
  for (int in : g.inputs()) {
    const auto& pd = c.data[static_cast<size_t>(in)];
    if (!pd || pd->shape() != Shape{b_n, s_n}) continue;
    const std::vector<int64_t> pos = onnx_ref::index_values(*pd);
    bool ok = true;
    for (int64_t i = 0; ok && i < onnx_ref::numel_of(score_shape); ++i) {
      const Shape idx = unflatten(i, score_shape);
      const int64_t b = idx[0], t = idx[rank - 2], s = idx[rank - 1];
      const bool masked = s > pos[static_cast<size_t>(b * s_n + t)];
      ok = (bcast_int(*cd, idx, score_shape) != 0) == (masked == cond_masks);
    }
    if (ok) {
      positions = in;
      break;
    }
  }
  if (positions < 0) return no("the mask is not causal by position (key s visible iff s <= positions[b,t])");
  if (slot) {
    if (s_n != 1) return no("slot cache with more than one new token");
    const std::vector<int64_t> pos = onnx_ref::index_values(*c.data[static_cast<size_t>(positions)]);
    for (int w = 0; w < 2; ++w) {
      const ir::Node& cn = w == 0 ? kc : vc;
      const auto& wd = c.data[static_cast<size_t>(cn.inputs[0])];
      if (!wd) return no("the cache write mask is not computed from positions");
      for (int64_t i = 0; i < onnx_ref::numel_of(cs); ++i) {
        const Shape idx = unflatten(i, cs);
        if ((bcast_int(*wd, idx, cs) != 0) != (idx[2] == pos[static_cast<size_t>(idx[0])]))
          return no("the cache write mask is not slot == positions");
      }
    }
  }

  // Containment: everything removed is read only inside the match.
  m.insert(g.value(pk).producer);
  m.insert(g.value(pvv).producer);
  for (const auto* ch : {&qchain, &kchain, &vchain, &newchain[0], &newchain[1]})
    for (int k : *ch) m.insert(k);
  for (int ni : m)
    for (int o : at(g, ni).outputs)
      if (o != out && o != pk && o != pvv && !mt.contained(o, m))
        return no("intermediate " + g.value(o).name + " has readers outside the match or is a graph output");

  Fusion f;
  f.nodes.assign(m.begin(), m.end());
  const int last = *std::max_element(f.nodes.begin(), f.nodes.end());
  f.fused.op = OpKind::kK3Attention;
  f.fused.name = at(g, last).name;
  f.fused.inputs = {xq, xkv[0], xkv[1], positions, past[0], past[1]};
  f.fused.outputs = {out, pk, pvv};
  f.fused.attrs = {{"n_heads", hq},
                   {"n_kv_heads", hkv},
                   {"head_dim", hd},
                   {"cache", std::string(slot ? "slot" : "concat")},
                   {"scale", scale}};
  if (!near_value(scale, 1.0 / std::sqrt(static_cast<double>(hd))))
    why = "fused with scale " + std::to_string(scale) + " (not 1/sqrt(head_dim))";
  return f;
}

// Orders the nodes so every value is produced before it is read (stable:
// keeps the current order where it already is).
void topo_sort(ir::Graph& g) {
  const auto& nodes = g.nodes();
  const size_t n = nodes.size();
  std::vector<int> pending(n, 0);
  std::vector<std::vector<int>> users(n);
  for (size_t i = 0; i < n; ++i)
    for (int in : nodes[i].inputs) {
      const int p = in >= 0 ? g.value(in).producer : -1;
      if (p >= 0 && static_cast<size_t>(p) != i) {
        ++pending[i];
        users[static_cast<size_t>(p)].push_back(static_cast<int>(i));
      }
    }
  std::set<int> ready;
  for (size_t i = 0; i < n; ++i)
    if (pending[i] == 0) ready.insert(static_cast<int>(i));
  std::vector<ir::Node> order;
  while (!ready.empty()) {
    const int i = *ready.begin();
    ready.erase(ready.begin());
    order.push_back(nodes[static_cast<size_t>(i)]);
    for (int u : users[static_cast<size_t>(i)])
      if (--pending[static_cast<size_t>(u)] == 0) ready.insert(u);
  }
  if (order.size() != n) return;  // a cycle: leave it for verify() to report
  g.mutable_nodes() = std::move(order);
  g = compact(g, std::vector<bool>(n, true));
}

}  // namespace

StatusOr<bool> FuseAttention::run(ir::Graph& g) {
  bool any = false;
  for (const ir::Node& n : g.nodes()) any = any || n.op == OpKind::kOnnxSoftmax;
  if (!any) return false;
  auto conc = concretize(g);
  if (!conc.ok()) {
    stats_.notes.push_back("not matched: could not concretize the graph: " + conc.status().message());
    return false;
  }
  const Readers rd(g);
  std::vector<Fusion> fusions;
  const int n = static_cast<int>(g.nodes().size());
  std::vector<bool> taken(static_cast<size_t>(n), false);
  for (int i = 0; i < n; ++i) {
    if (at(g, i).op != OpKind::kOnnxSoftmax) continue;
    std::string why;
    std::optional<Fusion> f = match(g, rd, *conc, i, why);
    if (!why.empty()) stats_.notes.push_back("node " + at(g, i).name + ": attention " + (f ? "" : "not fused: ") + why);
    if (!f) continue;
    ++stats_.matched;
    bool clash = false;
    for (int k : f->nodes) clash = clash || taken[static_cast<size_t>(k)];
    if (clash) continue;
    for (int k : f->nodes) taken[static_cast<size_t>(k)] = true;
    fusions.push_back(std::move(*f));
  }
  if (fusions.empty()) return false;
  apply_fusions(g, fusions);
  stats_.applied += static_cast<int64_t>(fusions.size());
  // Mask and shape arithmetic that only fed the match are dead now; some
  // of them read a present value, which the fused node produces later.
  DeadCode dce;
  K3_RETURN_IF_ERROR(dce.run(g).status());
  topo_sort(g);
  // The fused outputs take the op's types (the head merge's Reshape may
  // have had an unknown width that k3.Attention knows).
  for (const ir::Node& fn : g.nodes()) {
    if (fn.op != OpKind::kK3Attention) continue;
    std::vector<ir::OutType> types;
    K3_RETURN_IF_ERROR(ir::infer_onnx(fn, ir::onnx_inputs_of(g, fn), types).with_context("node " + fn.name));
    for (size_t o = 0; o < fn.outputs.size() && o < types.size(); ++o) {
      ir::Value& v = g.values()[static_cast<size_t>(fn.outputs[o])];
      for (size_t d = 0; d < v.shape.size() && d < types[o].shape.size(); ++d)
        if (v.shape[d] < 0) v.shape[d] = types[o].shape[d];
    }
  }
  return true;
}

}  // namespace k3::passes
