// fuse-attention pass and the k3.Attention op: hand-built attention graphs
// in the exporters' forms (concat cache with static and symbolic dims, slot
// cache) fold into one k3.Attention with unchanged outputs (which also checks
// the op's reference kernel against the decomposed graph), one
// must-not-match test per guard, and the op's shape rule and kernel errors.
#include <gtest/gtest.h>

#include <cmath>

#include "ir/onnx_shape.h"
#include "kernels/onnx_ref/onnx_ref.h"
#include "passes/fuse_attention.h"
#include "passes/fusion_test_util.h"

namespace k3::passes {
namespace {

using namespace test;  // NOLINT

constexpr int64_t kB = 2, kS = 3, kP = 4, kHq = 4, kHkv = 2, kHd = 4, kD = 8;

// Knobs; the defaults are the naive export's form (python/k3ref/export_onnx.py
// _gqa_attention over a concat cache) with static shapes.
struct Att {
  bool slot = false;     // static decode: Where(write, new, past), S = 1
  bool dynamic = false;  // B, S, P unknown (dim_params), shape-computed key range
  DType dtype = DType::kF32;
  double scale = 0.5;        // 1/sqrt(kHd)
  bool scale_div = false;    // Div(scores, 1/scale)
  bool scale_input = false;  // scale is a graph input
  int64_t softmax_axis = -1;
  bool mask_less = false;           // s < pos instead of s <= pos
  bool mask_input = false;          // the condition is a graph input
  bool mask_add = false;            // additive mask input instead of Where
  bool mask_keep_polarity = false;  // Where(allowed, x, -inf)
  bool bad_head_split = false;      // q split as [B,S,hd,H] then Transpose(0,3,1,2)
  bool probs_output = false;        // the probabilities are also a graph output
  bool present_not_output = false;
};

struct Built {
  ir::Graph g;
  int64_t s = kS, p = kP;
};

Built build(const Att& o) {
  Builder b;
  const DType dt = o.dtype;
  const int64_t s = o.slot ? 1 : kS, p = o.slot ? 6 : kP, kk = o.slot ? p : p + s;
  const int64_t ub = o.dynamic ? -1 : kB, us = o.dynamic ? -1 : s, up = o.dynamic ? -1 : p;
  const int x = b.input("x", {ub, us, kD}, dt);
  const int pos = b.input("position_ids", {ub, us}, DType::kI64);
  const int past_k = b.input("past_key_0", {ub, kHkv, up, kHd}, dt);
  const int past_v = b.input("past_value_0", {ub, kHkv, up, kHd}, dt);
  if (o.dynamic)
    for (int id : {x, pos, past_k, past_v}) {
      auto& v = b.g.values()[static_cast<size_t>(id)];
      v.dim_params.assign(v.shape.size(), "");
      v.dim_params[0] = "batch";
      if (id == x || id == pos) v.dim_params[1] = "seq";
      if (id == past_k || id == past_v) v.dim_params[2] = "past";
    }
  auto ints = [&](const std::string& n, std::vector<int64_t> v) {
    std::vector<double> d(v.begin(), v.end());
    return b.weight(n, {static_cast<int64_t>(v.size())}, d, DType::kI64);
  };
  auto head_split = [&](const std::string& n, int y, int64_t h) {
    if (o.bad_head_split && n == "q") {
      const int r = b.node(OpKind::kOnnxReshape, n + "/split", {y, ints(n + "/shape", {0, 0, kHd, h})});
      return b.node(OpKind::kOnnxTranspose, n + "/t", {r}, {{"perm", std::vector<int64_t>{0, 3, 1, 2}}});
    }
    const int r = b.node(OpKind::kOnnxReshape, n + "/split", {y, ints(n + "/shape", {0, 0, h, kHd})});
    return b.node(OpKind::kOnnxTranspose, n + "/t", {r}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  };
  const int q = head_split("q", b.node(OpKind::kOnnxMatMul, "wq", {x, b.ramp("wq.w", {kD, kHq * kHd}, dt)}), kHq);
  const int kn = head_split("k", b.node(OpKind::kOnnxMatMul, "wk", {x, b.ramp("wk.w", {kD, kHkv * kHd}, dt)}), kHkv);
  const int vn = head_split("v", b.node(OpKind::kOnnxMatMul, "wv", {x, b.ramp("wv.w", {kD, kHkv * kHd}, dt)}), kHkv);
  int k, v, allowed;
  if (!o.slot) {
    k = b.node(OpKind::kOnnxConcat, "cat_k", {past_k, kn}, {{"axis", int64_t{2}}});
    v = b.node(OpKind::kOnnxConcat, "cat_v", {past_v, vn}, {{"axis", int64_t{2}}});
    int key_pos;
    if (o.dynamic) {
      const int len =
          b.node(OpKind::kOnnxGather, "klen",
                 {b.node(OpKind::kOnnxShape, "kshape", {k}), b.scalar("two", 2, DType::kI64)}, {{"axis", int64_t{0}}});
      key_pos =
          b.node(OpKind::kOnnxRange, "range", {b.scalar("zero", 0, DType::kI64), len, b.scalar("one", 1, DType::kI64)});
    } else {
      std::vector<int64_t> r;
      for (int64_t i = 0; i < kk; ++i) r.push_back(i);
      key_pos = ints("arange", r);
    }
    const int kp = b.node(OpKind::kOnnxUnsqueeze, "kp", {key_pos, ints("ax01", {0, 1})});
    const int qp = b.node(OpKind::kOnnxUnsqueeze, "qp", {pos, ints("ax2", {2})});
    allowed = b.node(o.mask_less ? OpKind::kOnnxLess : OpKind::kOnnxLessOrEqual, "allowed", {kp, qp});  // [B,S,K]
  } else {
    std::vector<int64_t> r;
    for (int64_t i = 0; i < p; ++i) r.push_back(i);
    const int slots = b.node(OpKind::kOnnxUnsqueeze, "slots", {ints("arange", r), ints("ax0", {0})});  // [1,P]
    const int write = b.node(OpKind::kOnnxReshape, "write",
                             {b.node(OpKind::kOnnxEqual, "eq", {slots, pos}), ints("wshape", {kB, 1, p, 1})});
    k = b.node(OpKind::kOnnxWhere, "put_k", {write, kn, past_k});
    v = b.node(OpKind::kOnnxWhere, "put_v", {write, vn, past_v});
    allowed = b.node(OpKind::kOnnxReshape, "allowed",
                     {b.node(o.mask_less ? OpKind::kOnnxLess : OpKind::kOnnxLessOrEqual, "le", {slots, pos}),
                      ints("ashape", {kB, 1, p})});  // [B,1,P] = [B,S,K]
  }
  b.g.mark_output(k);
  if (!o.present_not_output) b.g.mark_output(v);
  // _gqa_attention
  const int qg = b.node(OpKind::kOnnxReshape, "qg", {q, ints("qg/shape", {0, kHkv, kHq / kHkv, -1, kHd})});
  const int kt = b.node(OpKind::kOnnxTranspose, "kt", {b.node(OpKind::kOnnxUnsqueeze, "ku", {k, ints("ax2b", {2})})},
                        {{"perm", std::vector<int64_t>{0, 1, 2, 4, 3}}});
  const int scores = b.node(OpKind::kOnnxMatMul, "qk", {qg, kt});
  int scaled;
  if (o.scale_input)
    scaled = b.node(OpKind::kOnnxMul, "scale", {scores, b.input("scale_in", {}, dt)});
  else if (o.scale_div)
    scaled = b.node(OpKind::kOnnxDiv, "scale", {scores, b.scalar("inv_scale", 1.0 / o.scale, dt)});
  else
    scaled = b.node(OpKind::kOnnxMul, "scale", {scores, b.scalar("scale_c", o.scale, dt)});
  const int a5 = b.node(OpKind::kOnnxUnsqueeze, "a5", {allowed, ints("ax12", {1, 2})});  // [B,1,1,S,K]
  const int ninf = b.scalar("ninf", -INFINITY, dt);
  int masked;
  if (o.mask_add)
    masked = b.node(OpKind::kOnnxAdd, "mask", {scaled, b.input("attn_bias", {kB, 1, 1, s, kk}, dt)});
  else if (o.mask_input)
    masked = b.node(OpKind::kOnnxWhere, "mask", {b.input("attn_mask", {kB, 1, 1, s, kk}, DType::kBool), ninf, scaled});
  else if (o.mask_keep_polarity)
    masked = b.node(OpKind::kOnnxWhere, "mask", {a5, scaled, ninf});
  else
    masked = b.node(OpKind::kOnnxWhere, "mask", {b.node(OpKind::kOnnxNot, "not", {a5}), ninf, scaled});
  const int probs = b.node(OpKind::kOnnxSoftmax, "softmax", {masked}, {{"axis", o.softmax_axis}});
  if (o.probs_output) b.g.mark_output(probs);
  const int pv =
      b.node(OpKind::kOnnxMatMul, "pv", {probs, b.node(OpKind::kOnnxUnsqueeze, "vu", {v, ints("ax2c", {2})})});
  const int m1 = b.node(OpKind::kOnnxReshape, "merge1", {pv, ints("m1/shape", {0, kHq, -1, kHd})});
  const int m2 = b.node(OpKind::kOnnxTranspose, "merge2", {m1}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  const int m3 = b.node(OpKind::kOnnxReshape, "merge3", {m2, ints("m3/shape", {0, 0, kHq * kHd})});
  const int y = b.node(OpKind::kOnnxMatMul, "wo", {m3, b.ramp("wo.w", {kHq * kHd, kD}, dt)});
  b.g.mark_output(b.node(OpKind::kOnnxAdd, "residual", {x, y}));
  if (o.present_not_output) b.g.mark_output(b.node(OpKind::kOnnxNeg, "v_reader", {v}));
  EXPECT_TRUE(b.g.verify().ok()) << b.g.verify().message();
  return {std::move(b.g), s, p};
}

// Inputs of concrete size with distinct positions inside the cache.
std::vector<runtime::interp::NamedTensor> make_inputs(const ir::Graph& g, int64_t s, int64_t p, bool slot) {
  std::vector<runtime::interp::NamedTensor> in;
  uint32_t seed = 777;
  for (int id : g.inputs()) {
    const ir::Value& v = g.value(id);
    std::vector<int64_t> shape = v.shape;
    for (size_t d = 0; d < shape.size(); ++d)
      if (shape[d] < 0) shape[d] = d == 0 ? kB : (v.name == "position_ids" || v.name == "x") ? s : p;
    ir::Tensor t = *ir::Tensor::zeros(v.dtype, shape);
    for (int64_t i = 0; i < t.numel(); ++i) {
      seed = seed * 1664525u + 1013904223u;
      const double r = static_cast<double>(seed >> 8) / 16777216.0 * 2.0 - 1.0;
      if (v.dtype == DType::kF32) t.mut<float>()[i] = static_cast<float>(r);
      if (v.dtype == DType::kF64) t.mut<double>()[i] = r;
      if (v.dtype == DType::kBool) t.mut<uint8_t>()[i] = (seed >> 9) % 3 != 0;
      if (v.dtype == DType::kI64) {
        const int64_t b = i / shape[1], t_ = i % shape[1];
        t.mut<int64_t>()[i] = slot ? (3 * b + 2) % p : std::min<int64_t>(p + t_ - b, p + s - 1);
      }
    }
    in.push_back({v.name, std::move(t)});
  }
  return in;
}

void expect_same(const ir::Graph& before, const ir::Graph& after, int64_t s, int64_t p, bool slot) {
  auto a = runtime::interp::Interpreter::create(before);
  ASSERT_TRUE(a.ok()) << a.status().message();
  auto b = runtime::interp::Interpreter::create(after);
  ASSERT_TRUE(b.ok()) << b.status().message();
  const auto in = make_inputs(before, s, p, slot);
  auto ra = a->run(in);
  ASSERT_TRUE(ra.ok()) << ra.status().message();
  auto rb = b->run(in);
  ASSERT_TRUE(rb.ok()) << rb.status().message();
  ASSERT_EQ(ra->size(), rb->size());
  for (size_t o = 0; o < ra->size(); ++o) {
    const ir::Tensor &want = (*ra)[o].tensor, &got = (*rb)[o].tensor;
    ASSERT_EQ((*ra)[o].name, (*rb)[o].name);
    ASSERT_EQ(want.shape(), got.shape()) << (*ra)[o].name;
    double worst = 0;
    for (int64_t i = 0; i < want.numel(); ++i) {
      const double w = want.dtype() == DType::kF32 ? want.data<float>()[i] : want.data<double>()[i];
      const double x = got.dtype() == DType::kF32 ? got.data<float>()[i] : got.data<double>()[i];
      worst = std::max(worst, std::fabs(w - x) / std::max(1.0, std::fabs(w)));
    }
    EXPECT_LE(worst, 1e-5) << "output " << (*ra)[o].name;
  }
}

FuseAttention run_checked(const Att& o, bool want_change) {
  Built bt = build(o);
  const ir::Graph before = bt.g;
  FuseAttention pass;
  auto changed = pass.run(bt.g);
  EXPECT_TRUE(changed.ok()) << changed.status().message();
  EXPECT_EQ(changed.ok() && *changed, want_change);
  EXPECT_TRUE(bt.g.verify().ok()) << bt.g.verify().message();
  EXPECT_EQ(count_op(bt.g, OpKind::kK3Attention), want_change ? 1 : 0);
  if (want_change) {
    EXPECT_EQ(count_op(bt.g, OpKind::kOnnxSoftmax), 0);
    EXPECT_EQ(count_op(bt.g, OpKind::kOnnxConcat) + count_op(bt.g, OpKind::kOnnxWhere), 0);
  } else {
    EXPECT_EQ(bt.g.nodes().size(), before.nodes().size());
  }
  if (!o.mask_input && !o.mask_add && !o.scale_input) expect_same(before, bt.g, bt.s, bt.p, o.slot);
  return pass;
}

const ir::Node& attention_node(const ir::Graph& g) {
  for (const ir::Node& n : g.nodes())
    if (n.op == OpKind::kK3Attention) return n;
  return g.nodes().front();
}

TEST(FuseAttention, ConcatCacheStatic) {
  FuseAttention p = run_checked(Att{}, true);
  EXPECT_EQ(p.stats().matched, 1);
  Built bt = build(Att{});
  ASSERT_TRUE(p.run(bt.g).ok());
  const ir::Node& n = attention_node(bt.g);
  EXPECT_EQ(n.attr_int("n_heads"), kHq);
  EXPECT_EQ(n.attr_int("n_kv_heads"), kHkv);
  EXPECT_EQ(n.attr_int("head_dim"), kHd);
  EXPECT_DOUBLE_EQ(n.attr_float("scale"), 0.5);
  EXPECT_EQ(std::get<std::string>(*n.find_attr("cache")), "concat");
  // The presents keep their names (the graph outputs).
  EXPECT_EQ(bt.g.value(n.outputs[1]).name, bt.g.value(bt.g.outputs()[0]).name);
}

TEST(FuseAttention, ConcatCacheSymbolicDims) {
  Att o;
  o.dynamic = true;
  run_checked(o, true);
}

TEST(FuseAttention, SlotCache) {
  Att o;
  o.slot = true;
  FuseAttention p = run_checked(o, true);
  Built bt = build(o);
  ASSERT_TRUE(p.run(bt.g).ok());
  EXPECT_EQ(std::get<std::string>(*attention_node(bt.g).find_attr("cache")), "slot");
}

TEST(FuseAttention, ScaleByDivAndKeepPolarity) {
  Att o;
  o.scale_div = true;
  o.mask_keep_polarity = true;
  run_checked(o, true);
}

TEST(FuseAttention, OtherScaleIsRecordedAndNoted) {
  Att o;
  o.scale = 0.3;
  FuseAttention p = run_checked(o, true);
  EXPECT_TRUE(any_note_has(p.stats().notes, "not 1/sqrt(head_dim)"));
}

// ---- must not match: one per guard ----

TEST(FuseAttention, NotSoftmaxOnOtherAxis) {
  Att o;
  o.softmax_axis = 3;
  EXPECT_TRUE(any_note_has(run_checked(o, false).stats().notes, "not on the last axis"));
}

TEST(FuseAttention, NotScaleFromInput) {
  Att o;
  o.scale_input = true;
  EXPECT_TRUE(any_note_has(run_checked(o, false).stats().notes, "scale is not a scalar constant"));
}

TEST(FuseAttention, NotStrictlyEarlierMask) {
  Att o;
  o.mask_less = true;
  EXPECT_TRUE(any_note_has(run_checked(o, false).stats().notes, "not causal by position"));
}

TEST(FuseAttention, NotMaskFromInput) {
  Att o;
  o.mask_input = true;
  EXPECT_TRUE(any_note_has(run_checked(o, false).stats().notes, "not causal by position"));
}

TEST(FuseAttention, NotAdditiveMask) {
  Att o;
  o.mask_add = true;
  EXPECT_TRUE(any_note_has(run_checked(o, false).stats().notes, "additive"));
}

TEST(FuseAttention, NotSlotMaskStrict) {
  Att o;
  o.slot = true;
  o.mask_less = true;
  EXPECT_TRUE(any_note_has(run_checked(o, false).stats().notes, "not causal by position"));
}

TEST(FuseAttention, NotProbsWithOtherReader) {
  Att o;
  o.probs_output = true;
  EXPECT_TRUE(any_note_has(run_checked(o, false).stats().notes, "other readers"));
}

TEST(FuseAttention, NotPresentNotOutput) {
  Att o;
  o.present_not_output = true;
  EXPECT_TRUE(any_note_has(run_checked(o, false).stats().notes, "not a graph output"));
}

TEST(FuseAttention, NotF64) {
  Att o;
  o.dtype = DType::kF64;
  EXPECT_TRUE(any_note_has(run_checked(o, false).stats().notes, "not f32"));
}

TEST(FuseAttention, NotNonStandardHeadSplit) {
  Att o;
  o.bad_head_split = true;
  EXPECT_TRUE(any_note_has(run_checked(o, false).stats().notes, "not the standard head split"));
}

// ---- the op itself ----

ir::Node attention(int64_t hq, int64_t hkv, int64_t hd, const std::string& cache) {
  ir::Node n{OpKind::kK3Attention, "att", {}, {}, {}};
  n.attrs = {{"n_heads", hq}, {"n_kv_heads", hkv}, {"head_dim", hd}, {"cache", cache}, {"scale", 0.5}};
  return n;
}

std::vector<ir::OnnxInput> att_inputs(int64_t qw, int64_t p) {
  auto f = [](std::vector<int64_t> s, DType t = DType::kF32) {
    ir::OnnxInput i;
    i.present = true;
    i.dtype = t;
    i.shape = std::move(s);
    return i;
  };
  return {f({-1, 3, qw}), f({-1, 3, 8}), f({-1, 3, 8}), f({-1, 3}, DType::kI32), f({-1, 2, p, 4}), f({-1, 2, p, 4})};
}

TEST(K3Attention, ShapeRule) {
  std::vector<ir::OutType> out;
  ASSERT_TRUE(ir::infer_onnx(attention(4, 2, 4, "concat"), att_inputs(16, 5), out).ok());
  EXPECT_EQ(out[0].shape, (std::vector<int64_t>{-1, 3, 16}));
  EXPECT_EQ(out[1].shape, (std::vector<int64_t>{-1, 2, 8, 4}));
  ASSERT_TRUE(ir::infer_onnx(attention(4, 2, 4, "concat"), att_inputs(16, -1), out).ok());
  EXPECT_EQ(out[2].shape, (std::vector<int64_t>{-1, 2, -1, 4}));
  ASSERT_TRUE(ir::infer_onnx(attention(4, 2, 4, "slot"), att_inputs(16, 6), out).ok());
  EXPECT_EQ(out[1].shape, (std::vector<int64_t>{-1, 2, 6, 4}));
  EXPECT_FALSE(ir::infer_onnx(attention(3, 2, 4, "concat"), att_inputs(12, 5), out).ok());  // Hq % Hkv
  EXPECT_FALSE(ir::infer_onnx(attention(4, 2, 4, "concat"), att_inputs(12, 5), out).ok());  // q width
  EXPECT_FALSE(ir::infer_onnx(attention(4, 2, 4, "ring"), att_inputs(16, 5), out).ok());
  ir::Node no_scale = attention(4, 2, 4, "slot");
  no_scale.attrs.pop_back();
  EXPECT_FALSE(ir::infer_onnx(no_scale, att_inputs(16, 5), out).ok());
}

TEST(K3Attention, PositionOutsideCacheIsAnError) {
  Builder b;
  const int q = b.input("q", {1, 1, 8});
  const int k = b.input("k", {1, 1, 8});
  const int v = b.input("v", {1, 1, 8});
  const int pos = b.input("pos", {1, 1}, DType::kI64);
  const int pk = b.input("pk", {1, 2, 4, 4});
  const int pv = b.input("pv", {1, 2, 4, 4});
  auto r = b.g.add_node(OpKind::kK3Attention, "att", {q, k, v, pos, pk, pv}, attention(2, 2, 4, "slot").attrs, 3);
  ASSERT_TRUE(r.ok()) << r.status().message();
  for (int o : *r) b.g.mark_output(o);
  auto it = runtime::interp::Interpreter::create(b.g);
  ASSERT_TRUE(it.ok());
  auto in = inputs_for(b.g);
  for (auto& t : in)
    if (t.name == "pos") t.tensor.mut<int64_t>()[0] = 4;
  auto res = it->run(in);
  ASSERT_FALSE(res.ok());
  EXPECT_NE(res.status().message().find("outside the cache"), std::string::npos) << res.status().message();
}

}  // namespace
}  // namespace k3::passes
