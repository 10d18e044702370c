// fuse-moe pass: hand-built graphs of the exported MoE forms (naive top-k
// index dispatch, the dense one-hot mask, stacked-weight gather by index) fold into one k3.Moe with
// the O0 interpreter's outputs unchanged (which also checks k3.Moe's
// reference kernel against the decomposed graphs), and one must-not-match
// test per guard.
#include <gtest/gtest.h>

#include "passes/fuse_moe.h"
#include "passes/fusion_test_util.h"

namespace k3::passes {
namespace {

using namespace test;  // NOLINT

struct Moe {
  DType dt = DType::kF32;
  int64_t e = 4, k = 2, d = 8, f = 16;
  bool swiglu = false;
  bool gate_is_input = false;  // gate weight fed at run time
  int64_t largest = 1;         // TopK largest
  bool softmax_all = false;    // Softmax over all logits, then TopK (no renormalization)
  bool relu_expert = false;    // expert 1 uses Relu instead of GeLU
  int skip_expert = -1;        // expert not dispatched
  int dup_expert = -1;         // expert index dispatched twice (instead of skip_expert's slot)
  bool leak = false;           // a routing-weight intermediate is also a graph output
  bool scatter_nd = false;     // ScatterND(acc, tok, u, reduction=add) accumulation
  bool flat_input = false;     // x is [N, D] already (no Reshape back)
  bool scaled_weight = false;  // routing weight * 2 (float arithmetic on the weights)
  // The dynamo exporter's form: zeros = Expand(0.0, Shape(xf, start 0)),
  // (token, slot) = two column Slices, rows and routing weights by GatherND,
  // ScatterND add, and the shape back from Shape(v, start, end) pieces.
  bool dynamo = false;
  bool dyn_swap_cols = false;     // rows gathered by column 1 (the slot), weights by (column 1, column 0)
  float dyn_zero = 0.0f;          // the value Expand broadcasts for the accumulator
  bool dyn_swapped_back = false;  // the shape back is [S, B, D], not x's shape
  // The dense (static prefill) form's near misses.
  bool dense_add = false;           // ScatterElements with reduction=add
  float dense_zero = 0.0f;          // the value of the scattered-into constant
  bool dense_no_transpose = false;  // mix Unsqueezed without the [1, 0] Transpose (wrong layout)
  bool dense_stack_input = false;   // the up stack is a graph input, not a constant
  bool dense_keepdims = false;      // ReduceSum keepdims=1
};

// Deterministic pseudo-random constant in [-scale, scale].
int rnd(Builder& b, const std::string& name, std::vector<int64_t> shape, uint32_t seed, double scale, DType dt) {
  int64_t n = 1;
  for (int64_t x : shape) n *= x;
  std::vector<double> v;
  uint32_t s = seed * 2654435761u + 1;
  for (int64_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    v.push_back(((static_cast<double>(s >> 8) / 16777216.0) * 2.0 - 1.0) * scale);
  }
  return b.weight(name, std::move(shape), v, dt);
}

int ints(Builder& b, const std::string& name, std::vector<int64_t> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return b.weight(name, {n}, std::vector<double>(v.begin(), v.end()), DType::kI64);
}

std::vector<int> multi(Builder& b, OpKind op, const std::string& name, std::vector<int> in, std::vector<ir::Attr> attrs,
                       int n_out) {
  auto r = b.g.add_node(op, name, std::move(in), std::move(attrs), n_out);
  EXPECT_TRUE(r.ok()) << name << ": " << r.status().message();
  return r.ok() ? *r : std::vector<int>(static_cast<size_t>(n_out), -1);
}

// The gate, TopK and Softmax; returns (xf, s, idx).
void router(Builder& b, const Moe& o, int xf, int& s, int& idx) {
  const int wg = o.gate_is_input ? b.input("gate_w", {o.d, o.e}, o.dt) : rnd(b, "gate_w", {o.d, o.e}, 1, 1.0, o.dt);
  int logits = b.node(OpKind::kOnnxMatMul, "gate", {xf, wg});
  if (o.softmax_all) logits = b.node(OpKind::kOnnxSoftmax, "probs", {logits}, {{"axis", int64_t{-1}}});
  const auto top = multi(b, OpKind::kOnnxTopK, "topk", {logits, ints(b, "k", {o.k})},
                         {{"axis", int64_t{-1}}, {"largest", o.largest}}, 2);
  s = o.softmax_all ? top[0] : b.node(OpKind::kOnnxSoftmax, "softmax", {top[0]}, {{"axis", int64_t{-1}}});
  idx = top[1];
}

// Expert FFN on rows [n, D] with [in, out] MatMul weights.
int ffn(Builder& b, const Moe& o, int xe, int e) {
  const std::string p = "experts." + std::to_string(e) + "/";
  const uint32_t seed = 10 + static_cast<uint32_t>(e) * 3;
  const int up = b.node(OpKind::kOnnxMatMul, p + "up", {xe, rnd(b, p + "w_up", {o.d, o.f}, seed, 0.5, o.dt)});
  int h = -1;
  if (o.swiglu) {
    const int g = b.node(OpKind::kOnnxMatMul, p + "gate", {xe, rnd(b, p + "w_gate", {o.d, o.f}, seed + 1, 0.5, o.dt)});
    const int sig = b.node(OpKind::kOnnxSigmoid, p + "sigmoid", {g});
    const int silu = b.node(OpKind::kOnnxMul, p + "silu", {g, sig});
    h = b.node(OpKind::kOnnxMul, p + "glu", {silu, up});
  } else if (o.relu_expert && e == 1) {
    h = b.node(OpKind::kOnnxRelu, p + "relu", {up});
  } else {
    h = b.node(OpKind::kOnnxGelu, p + "gelu", {up});
  }
  return b.node(OpKind::kOnnxMatMul, p + "down", {h, rnd(b, p + "w_down", {o.f, o.d}, seed + 2, 0.5, o.dt)});
}

// NaiveExportModel.moe as TorchScript exports it (see fuse_moe.cc, form a).
ir::Graph build_naive(const Moe& o) {
  Builder b;
  const int x = o.flat_input ? b.input("x", {6, o.d}, o.dt) : b.input("x", {2, 3, o.d}, o.dt);
  const int xf = o.flat_input ? x : b.node(OpKind::kOnnxReshape, "flatten", {x, ints(b, "flat_shape", {-1, o.d})});
  int s = -1, idx = -1;
  router(b, o, xf, s, idx);
  const int64_t odt = o.dt == DType::kF32 ? 1 : 11;
  int acc = o.dynamo ? b.node(OpKind::kOnnxExpand, "zeros",
                              {b.scalar("zero", o.dyn_zero, o.dt),
                               b.node(OpKind::kOnnxShape, "xf_shape", {xf}, {{"start", int64_t{0}}})})
                     : b.node(OpKind::kOnnxConstantOfShape, "zeros", {b.node(OpKind::kOnnxShape, "xf_shape", {xf})},
                              {{"value_dtype", odt}, {"value", 0.0}});
  for (int slot_e = 0; slot_e < o.e; ++slot_e) {
    if (slot_e == o.skip_expert) continue;
    const int e = slot_e == o.dup_expert + 1 && o.dup_expert >= 0 ? o.dup_expert : slot_e;
    const std::string p = "e" + std::to_string(slot_e) + "/";
    const int eq = b.node(OpKind::kOnnxEqual, p + "eq", {idx, b.weight(p + "id", {}, {double(e)}, DType::kI64)});
    const int nz = b.node(OpKind::kOnnxNonZero, p + "nonzero", {eq});
    const int tr = b.node(OpKind::kOnnxTranspose, p + "transpose", {nz}, {{"perm", std::vector<int64_t>{1, 0}}});
    if (o.dynamo) {
      auto col = [&](const std::string& n, int64_t c) {
        const int sl = b.node(OpKind::kOnnxSlice, p + n + "_col",
                              {tr, ints(b, p + n + "_s", {c}), ints(b, p + n + "_e", {c + 1}),
                               ints(b, p + n + "_a", {1}), ints(b, p + n + "_st", {1})});
        return b.node(OpKind::kOnnxSqueeze, p + n, {sl, ints(b, p + n + "_ax", {1})});
      };
      const int tok = col("tok", o.dyn_swap_cols ? 1 : 0);
      const int slot = col("slot", o.dyn_swap_cols ? 0 : 1);
      const int tu = b.node(OpKind::kOnnxUnsqueeze, p + "tok_col", {tok, ints(b, p + "axt", {-1})});
      const int su = b.node(OpKind::kOnnxUnsqueeze, p + "slot_col", {slot, ints(b, p + "axs", {-1})});
      const int ts = b.node(OpKind::kOnnxConcat, p + "tok_slot", {tu, su}, {{"axis", int64_t{-1}}});
      const int wv = b.node(OpKind::kOnnxGatherND, p + "w_gather", {s, ts}, {{"batch_dims", int64_t{0}}});
      const int w = b.node(OpKind::kOnnxUnsqueeze, p + "w", {wv, ints(b, p + "axw", {-1})});
      const int xe = b.node(OpKind::kOnnxGatherND, p + "rows", {xf, tu}, {{"batch_dims", int64_t{0}}});
      const int u = b.node(OpKind::kOnnxMul, p + "weighted", {ffn(b, o, xe, e), w});
      acc = b.node(OpKind::kOnnxScatterND, p + "scatter", {acc, tu, u}, {{"reduction", std::string("add")}});
      continue;
    }
    const auto sp =
        multi(b, OpKind::kOnnxSplit, p + "split", {tr, ints(b, p + "sizes", {1, 1})}, {{"axis", int64_t{1}}}, 2);
    const int tok = b.node(OpKind::kOnnxSqueeze, p + "tok", {sp[0], ints(b, p + "ax0", {1})});
    const int slot = b.node(OpKind::kOnnxSqueeze, p + "slot", {sp[1], ints(b, p + "ax1", {1})});
    // weights[tok, slot] as Flatten + Gather of tok * K + slot.
    const int flat_s = b.node(OpKind::kOnnxFlatten, p + "flat_s", {s}, {{"axis", int64_t{2}}});
    const int kk = b.node(OpKind::kOnnxGather, p + "k_of",
                          {b.node(OpKind::kOnnxShape, p + "s_shape", {s}), ints(b, p + "one", {1})});
    const int lin = b.node(OpKind::kOnnxAdd, p + "lin", {slot, b.node(OpKind::kOnnxMul, p + "row", {tok, kk})});
    const int wg = b.node(OpKind::kOnnxGather, p + "w_gather", {flat_s, lin});
    const int wr = b.node(OpKind::kOnnxReshape, p + "w_flat", {wg, ints(b, p + "m1", {-1})});
    int w = b.node(OpKind::kOnnxUnsqueeze, p + "w", {wr, ints(b, p + "ax2", {1})});
    if (o.leak && slot_e == 2) b.g.mark_output(wr);
    if (o.scaled_weight) w = b.node(OpKind::kOnnxMul, p + "w2", {w, b.scalar(p + "two", 2.0, o.dt)});
    const int xe = b.node(OpKind::kOnnxGather, p + "rows", {xf, tok}, {{"axis", int64_t{0}}});
    const int ye = ffn(b, o, xe, e);
    const int u = b.node(OpKind::kOnnxMul, p + "weighted", {ye, w});
    const int tu = b.node(OpKind::kOnnxUnsqueeze, p + "tok_col", {tok, ints(b, p + "ax3", {1})});
    if (o.scatter_nd) {
      acc = b.node(OpKind::kOnnxScatterND, p + "scatter", {acc, tu, u}, {{"reduction", std::string("add")}});
    } else {
      const int ix = b.node(OpKind::kOnnxExpand, p + "tok_idx", {tu, b.node(OpKind::kOnnxShape, p + "u_shape", {u})});
      const int z = b.node(OpKind::kOnnxConstantOfShape, p + "zeros",
                           {b.node(OpKind::kOnnxShape, p + "acc_shape", {acc})}, {{"value_dtype", odt}});
      const int sc = b.node(OpKind::kOnnxScatterElements, p + "scatter", {z, ix, u}, {{"axis", int64_t{0}}});
      acc = b.node(OpKind::kOnnxAdd, p + "acc", {acc, sc});
    }
  }
  int y = acc;
  if (o.dynamo && !o.flat_input) {
    // [B, S, D] from the dims of other values: B from another input that
    // has the same size there, S from x, D a constant.
    const int other = b.input("other", {2, 5}, o.dt);
    auto dim = [&](const std::string& n, int v, int64_t a) {
      return b.node(OpKind::kOnnxShape, n, {v}, {{"start", a}, {"end", a + 1}});
    };
    const int bd = dim("b_dim", other, 0), sd = dim("s_dim", x, 1);
    std::vector<int> dims = {bd, sd, ints(b, "d_dim", {o.d})};
    if (o.dyn_swapped_back) std::swap(dims[0], dims[1]);
    y = b.node(OpKind::kOnnxReshape, "unflatten",
               {acc, b.node(OpKind::kOnnxConcat, "out_shape", dims, {{"axis", int64_t{0}}})});
  } else if (!o.flat_input) {
    const int xs = b.node(OpKind::kOnnxShape, "x_shape", {x});
    std::vector<int> dims;
    for (int i = 0; i < 3; ++i) {
      const int gi = b.node(OpKind::kOnnxGather, "dim" + std::to_string(i),
                            {xs, b.weight("i" + std::to_string(i), {}, {double(i)}, DType::kI64)});
      dims.push_back(
          b.node(OpKind::kOnnxUnsqueeze, "udim" + std::to_string(i), {gi, ints(b, "u" + std::to_string(i), {0})}));
    }
    y = b.node(OpKind::kOnnxReshape, "unflatten",
               {acc, b.node(OpKind::kOnnxConcat, "out_shape", dims, {{"axis", int64_t{0}}})});
  }
  if (o.dyn_swapped_back)
    b.g.mark_output(y);  // [S, B, D]: no residual Add with x
  else
    b.g.mark_output(b.node(OpKind::kOnnxAdd, "residual", {x, y}));
  EXPECT_TRUE(b.g.verify().ok()) << b.g.verify().message();
  return std::move(b.g);
}

// StaticDecodeModel.moe (form c): stacked [E, F, D] / [E, D, F] weights gathered by index.
ir::Graph build_gather(const Moe& o) {
  Builder b;
  const int64_t n = 3;
  const int x = b.input("x", {n, 1, o.d}, o.dt);
  const int xf = b.node(OpKind::kOnnxReshape, "flatten", {x, ints(b, "flat_shape", {n, o.d})});
  int s = -1, idx = -1;
  router(b, o, xf, s, idx);
  const int xv = b.node(OpKind::kOnnxUnsqueeze, "xv2",
                        {b.node(OpKind::kOnnxUnsqueeze, "xv1", {xf, ints(b, "a1", {1})}), ints(b, "a3", {3})});
  auto proj = [&](const std::string& name, std::vector<int64_t> shape, uint32_t seed, int rhs) {
    const int stack = rnd(b, name, std::move(shape), seed, 0.5, o.dt);
    const int gw = b.node(OpKind::kOnnxGather, name + "/gather", {stack, idx});
    return b.node(OpKind::kOnnxMatMul, name + "/matmul", {gw, rhs});
  };
  const int up = proj("up", {o.e, o.f, o.d}, 20, xv);
  int h = -1;
  if (o.swiglu) {
    const int g = proj("gate", {o.e, o.f, o.d}, 21, xv);
    const int silu = b.node(OpKind::kOnnxMul, "silu", {g, b.node(OpKind::kOnnxSigmoid, "sigmoid", {g})});
    h = b.node(OpKind::kOnnxMul, "glu", {silu, up});
  } else {
    h = b.node(o.relu_expert ? OpKind::kOnnxRelu : OpKind::kOnnxGelu, "act", {up});
  }
  const int down = proj("down", {o.e, o.d, o.f}, 22, h);
  const int sq = b.node(OpKind::kOnnxSqueeze, "squeeze", {down, ints(b, "am1", {-1})});
  const int w = b.node(OpKind::kOnnxUnsqueeze, "w", {s, ints(b, "am1b", {-1})});
  const int sum =
      b.node(OpKind::kOnnxReduceSum, "sum", {b.node(OpKind::kOnnxMul, "weighted", {sq, w}), ints(b, "ax1", {1})},
             {{"keepdims", int64_t{0}}});
  const int y = b.node(OpKind::kOnnxReshape, "unflatten", {sum, ints(b, "out_shape", {n, 1, o.d})});
  b.g.mark_output(b.node(OpKind::kOnnxAdd, "residual", {x, y}));
  EXPECT_TRUE(b.g.verify().ok()) << b.g.verify().message();
  return std::move(b.g);
}

// StaticPrefillModel.moe (form b, the article's dense one-hot mask): every
// expert on every token, mixed by ScatterElements(zeros [N, E], idx, s).
ir::Graph build_dense(const Moe& o) {
  Builder b;
  const int64_t n = 3;
  const int x = b.input("x", {1, n, o.d}, o.dt);
  const int xf = b.node(OpKind::kOnnxReshape, "flatten", {x, ints(b, "flat_shape", {n, o.d})});
  int s = -1, idx = -1;
  router(b, o, xf, s, idx);
  const int zeros = b.weight("zeros", {n, o.e}, std::vector<double>(static_cast<size_t>(n * o.e), o.dense_zero), o.dt);
  std::vector<ir::Attr> sc_attrs = {{"axis", int64_t{1}}};
  if (o.dense_add) sc_attrs.push_back({"reduction", std::string("add")});
  const int dense = b.node(OpKind::kOnnxScatterElements, "dense", {zeros, idx, s}, sc_attrs);
  const int xu = b.node(OpKind::kOnnxUnsqueeze, "xu", {xf, ints(b, "a0", {0})});
  auto stack = [&](const std::string& name, std::vector<int64_t> shape, uint32_t seed) {
    return o.dense_stack_input && name == "up" ? b.input(name, shape, o.dt)
                                               : rnd(b, name, std::move(shape), seed, 0.5, o.dt);
  };
  const int up = b.node(OpKind::kOnnxMatMul, "up", {xu, stack("up", {o.e, o.d, o.f}, 30)});
  int h = -1;
  if (o.swiglu) {
    const int g = b.node(OpKind::kOnnxMatMul, "gate_proj", {xu, stack("gate", {o.e, o.d, o.f}, 31)});
    const int silu = b.node(OpKind::kOnnxMul, "silu", {g, b.node(OpKind::kOnnxSigmoid, "sigmoid", {g})});
    h = b.node(OpKind::kOnnxMul, "glu", {silu, up});
  } else {
    h = b.node(OpKind::kOnnxGelu, "act", {up});
  }
  const int down = b.node(OpKind::kOnnxMatMul, "down", {h, stack("down", {o.e, o.f, o.d}, 32)});
  // [E, N, 1] (or, without the Transpose, [N, E, 1]: broadcasts only when N == E).
  const int mixed = o.dense_no_transpose
                        ? dense
                        : b.node(OpKind::kOnnxTranspose, "dense_t", {dense}, {{"perm", std::vector<int64_t>{1, 0}}});
  const int w = b.node(OpKind::kOnnxUnsqueeze, "w", {mixed, ints(b, "am1", {-1})});
  const int sum =
      b.node(OpKind::kOnnxReduceSum, "sum", {b.node(OpKind::kOnnxMul, "weighted", {down, w}), ints(b, "ax0", {0})},
             {{"keepdims", int64_t{o.dense_keepdims ? 1 : 0}}});
  const int y = b.node(OpKind::kOnnxReshape, "unflatten", {sum, ints(b, "out_shape", {1, n, o.d})});
  b.g.mark_output(b.node(OpKind::kOnnxAdd, "residual", {x, y}));
  EXPECT_TRUE(b.g.verify().ok()) << b.g.verify().message();
  return std::move(b.g);
}

FuseMoe run_checked(ir::Graph& g, bool want_change) {
  const ir::Graph before = g;
  FuseMoe pass;
  auto changed = pass.run(g);
  EXPECT_TRUE(changed.ok()) << changed.status().message();
  EXPECT_EQ(changed.ok() && *changed, want_change);
  EXPECT_TRUE(g.verify().ok()) << g.verify().message();
  if (!want_change) {
    EXPECT_EQ(g.nodes().size(), before.nodes().size());
  }
  expect_same_outputs(before, g);
  return pass;
}

// One k3.Moe with the right attributes, reading x itself, and only it and the residual Add left.
void expect_fused(ir::Graph g, const Moe& o, size_t nodes_left) {
  const FuseMoe pass = run_checked(g, true);
  EXPECT_EQ(pass.stats().matched, 1);
  EXPECT_EQ(pass.stats().applied, 1);
  ASSERT_EQ(count_op(g, OpKind::kK3Moe), 1);
  EXPECT_EQ(g.nodes().size(), nodes_left) << g.to_string();
  for (const ir::Node& n : g.nodes()) {
    if (n.op != OpKind::kK3Moe) continue;
    EXPECT_EQ(n.attr_int("n_experts"), o.e);
    EXPECT_EQ(n.attr_int("top_k"), o.k);
    EXPECT_EQ(n.attr_int("swiglu"), o.swiglu ? 1 : 0);
    EXPECT_EQ(n.inputs.size(), static_cast<size_t>(2 + o.e * (o.swiglu ? 3 : 2)));
    EXPECT_EQ(g.value(n.inputs[0]).name, "x");
    EXPECT_EQ(g.value(n.inputs[1]).shape, (std::vector<int64_t>{o.e, o.d}));
    EXPECT_EQ(g.value(n.inputs[2]).shape, (std::vector<int64_t>{o.f, o.d}));
    EXPECT_EQ(g.value(n.inputs.back()).shape, (std::vector<int64_t>{o.d, o.f}));
  }
}

void expect_not_fused(const ir::Graph& built, const std::string& note) {
  ir::Graph g = built;
  const FuseMoe pass = run_checked(g, false);
  EXPECT_EQ(count_op(g, OpKind::kK3Moe), 0);
  EXPECT_TRUE(any_note_has(pass.stats().notes, note))
      << "no note containing '" << note << "'; notes: " << (pass.stats().notes.empty() ? "" : pass.stats().notes[0]);
}

TEST(FuseMoe, NaiveGeluDispatchFuses) {
  Moe o;
  expect_fused(build_naive(o), o, 2);
}

TEST(FuseMoe, NaiveSwigluDispatchFuses) {
  Moe o;
  o.swiglu = true;
  o.k = 1;
  expect_fused(build_naive(o), o, 2);
}

TEST(FuseMoe, NaiveScatterNDAddFuses) {
  Moe o;
  o.scatter_nd = true;
  o.e = 3;
  expect_fused(build_naive(o), o, 2);
}

TEST(FuseMoe, NaiveDynamoFormFuses) {
  Moe o;
  o.dynamo = true;
  // Left: k3.Moe, the residual Add, and the shape pieces of the Reshape
  // back (Concat, two Shapes) that nothing reads any more.
  expect_fused(build_naive(o), o, 5);
}

TEST(FuseMoe, NaiveDynamoSwigluFuses) {
  Moe o;
  o.dynamo = true;
  o.swiglu = true;
  o.e = 3;
  expect_fused(build_naive(o), o, 5);
}

TEST(FuseMoe, DynamoRowsByTheSlotColumnAreNotFused) {
  // Columns swapped: rows gathered by NonZero's column 1 (k = 6 so that the
  // graph still runs with 6 tokens).
  Moe o;
  o.dynamo = true;
  o.flat_input = true;
  o.dyn_swap_cols = true;
  o.e = 8;
  o.k = 6;
  expect_not_fused(build_naive(o), "no Gather of the input rows by the token index");
}

TEST(FuseMoe, DynamoAccumulatorFromNonZeroIsNotFused) {
  Moe o;
  o.dynamo = true;
  o.dyn_zero = 1.0f;
  expect_not_fused(build_naive(o), "does not expand a zero f32 scalar");
}

TEST(FuseMoe, DynamoShapeBackThatIsNotXsShapeKeepsTheReshape) {
  // Shape pieces [S, B, D] instead of [B, S, D]: k3.Moe reads xf and the
  // Reshape stays.
  Moe o;
  o.dynamo = true;
  o.dyn_swapped_back = true;
  ir::Graph g = build_naive(o);
  run_checked(g, true);
  ASSERT_EQ(count_op(g, OpKind::kK3Moe), 1);
  EXPECT_EQ(count_op(g, OpKind::kOnnxReshape), 2);
  for (const ir::Node& n : g.nodes()) {
    if (n.op == OpKind::kK3Moe) {
      EXPECT_EQ(g.value(n.inputs[0]).name, "flatten");
    }
  }
}

TEST(FuseMoe, FlatInputWithoutReshapeBackFuses) {
  Moe o;
  o.flat_input = true;
  expect_fused(build_naive(o), o, 2);
}

TEST(FuseMoe, GatherByIndexGeluFuses) {
  Moe o;
  expect_fused(build_gather(o), o, 2);
}

TEST(FuseMoe, GatherByIndexSwigluFuses) {
  Moe o;
  o.swiglu = true;
  o.k = 3;
  expect_fused(build_gather(o), o, 2);
}

TEST(FuseMoe, DenseMaskGeluFuses) {
  Moe o;
  expect_fused(build_dense(o), o, 2);
}

TEST(FuseMoe, DenseMaskSwigluFuses) {
  Moe o;
  o.swiglu = true;
  o.e = 5;
  o.k = 3;
  expect_fused(build_dense(o), o, 2);
}

TEST(FuseMoe, DenseScatterWithReductionIsNotFused) {
  Moe o;
  o.dense_add = true;
  expect_not_fused(build_dense(o), "has a reduction");
}

TEST(FuseMoe, DenseScatterIntoNonZerosIsNotFused) {
  Moe o;
  o.dense_zero = 0.5f;
  expect_not_fused(build_dense(o), "is not all zeros");
}

TEST(FuseMoe, DenseMixWithoutTransposeIsNotFused) {
  Moe o;
  o.e = 3;  // N == E, so the untransposed [N, E, 1] mix still broadcasts
  o.k = 1;
  o.dense_no_transpose = true;
  expect_not_fused(build_dense(o), "not transposed");
}

TEST(FuseMoe, DenseStackNotConstantIsNotFused) {
  Moe o;
  o.dense_stack_input = true;
  expect_not_fused(build_dense(o), "not a MatMul by a constant");
}

TEST(FuseMoe, DenseSumWithKeepdimsIsNotFused) {
  Moe o;
  o.dense_keepdims = true;
  expect_not_fused(build_dense(o), "summed over the expert axis");
}

TEST(FuseMoe, GateWeightNotConstantIsNotFused) {
  Moe o;
  o.gate_is_input = true;
  expect_not_fused(build_naive(o), "is not a constant");
}

TEST(FuseMoe, TopKSmallestIsNotFused) {
  Moe o;
  o.largest = 0;
  expect_not_fused(build_naive(o), "largest=0");
}

TEST(FuseMoe, SoftmaxOverAllLogitsIsNotFused) {
  // Softmax then TopK: weights not renormalized over the chosen experts.
  Moe o;
  o.softmax_all = true;
  ir::Graph g = build_naive(o);
  const FuseMoe pass = run_checked(g, false);
  EXPECT_EQ(count_op(g, OpKind::kK3Moe), 0);
}

TEST(FuseMoe, ScaledRoutingWeightIsNotFused) {
  Moe o;
  o.scaled_weight = true;
  expect_not_fused(build_naive(o), "float arithmetic");
}

TEST(FuseMoe, ExpertFfnMismatchIsNotFused) {
  Moe o;
  o.relu_expert = true;
  expect_not_fused(build_naive(o), "not followed by onnx.Gelu");
  expect_not_fused(build_gather(o), "not followed by onnx.Gelu");
}

TEST(FuseMoe, MissingExpertIsNotFused) {
  Moe o;
  o.skip_expert = 2;
  expect_not_fused(build_naive(o), "expert 2 is not dispatched");
}

TEST(FuseMoe, DuplicateExpertIsNotFused) {
  Moe o;
  o.dup_expert = 1;  // slot 2 dispatches expert 1 again
  expect_not_fused(build_naive(o), "dispatched twice");
}

TEST(FuseMoe, IntermediateWithOutsideReaderIsNotFused) {
  Moe o;
  o.leak = true;
  expect_not_fused(build_naive(o), "graph output");
}

TEST(FuseMoe, NonF32IsNotFused) {
  Moe o;
  o.dt = DType::kF64;
  expect_not_fused(build_naive(o), "not f32");
}

}  // namespace
}  // namespace k3::passes
