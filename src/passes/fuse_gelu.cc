// fuse-gelu: folds the primitive-op GeLU that PyTorch's exporters write for
// F.gelu (opset < 20 has no Gelu op) into one onnx.Gelu.
//
// erf form, approximate="none":  y = x * 0.5 * (1 + erf(x / sqrt(2)))
//
//   x --+--> Div(x, 1.4142135) | Mul(x, 0.70710677) --> Erf --> Add(., 1) --> a
//       |
//       +--> tail(x, a)
//
// tanh form, approximate="tanh":
//   y = x * 0.5 * (1 + tanh(0.7978846 * (x + 0.044715 * x^3)))
//
//   x --+--> Pow(x, 3) | Mul(x, Mul(x, x)) --> Mul(., 0.044715) --> Add(x, .)
//       |      --> Mul(., 0.7978846) --> Tanh --> Add(., 1) --> a
//       +--> tail(x, a)
//
// tail(x, a), the orders the exporters write the product of x, 0.5 and a:
//   (A) Mul(Mul(x, a), 0.5)        TorchScript
//   (B) Mul(x, Mul(0.5, a))        dynamo
//   (C) Mul(Mul(x, 0.5), a)
// Every Mul and Add may have its operands in either order. The fused node
// takes the place of the last matched node.
//
// Guards (each has a must-not-match test in tests/passes/test_fuse_gelu.cc):
//   - every constant (sqrt(2), 1/sqrt(2), 1, 0.5, 3, 0.044715,
//     sqrt(2/pi)) is a constant holding one number (rank <= rank of x) equal
//     to the expected value within 1e-6 relative;
//   - x is f32;
//   - every intermediate is read only by the next matched node and is not a
//     graph output (x itself may have any readers).
// An Erf/Tanh whose input is x scaled by a constant, that then fails a
// guard, is left alone and noted in the stats.
#include "passes/fuse_gelu.h"

#include <algorithm>
#include <cmath>

#include "passes/onnx_match.h"

namespace k3::passes {
namespace {

using ir::OpKind;

constexpr double kSqrt2 = 1.4142135623730951;
constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kTanhCubic = 0.044715;

const ir::Node& at(const ir::Graph& g, int i) {
  return g.nodes()[static_cast<size_t>(i)];
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// A two-input node `n` of op `op` with one constant operand (rank <= rank)
// and the other operand; false when neither operand is constant.
bool const_operand(const ir::Graph& g, const ir::Node& n, OpKind op, size_t rank, int& other, double& c) {
  if (n.op != op || n.inputs.size() != 2) return false;
  for (int k = 1; k >= 0; --k) {
    if (auto v = constant_scalar(g, n.inputs[static_cast<size_t>(k)], rank)) {
      c = *v;
      other = n.inputs[static_cast<size_t>(1 - k)];
      return true;
    }
  }
  return false;
}

struct Matcher {
  ir::Graph& g;
  const Readers& rd;
  std::string why;
  std::vector<int> nodes;

  bool fail(std::string msg) {
    why = std::move(msg);
    return false;
  }
  // Both forms end alike: a = 1 + act, then the product of x, 0.5 and a
  // (tail); the fused onnx.Gelu takes the place of the last matched node.
  std::optional<Fusion> finish(int x, int act, size_t rank, const char* approximate);
  // The single reader of `v` when it is op `op`, else -1 (with a reason).
  int next(int v, OpKind op, const char* what) {
    const int r = rd.only_reader(v);
    if (r < 0 || at(g, r).op != op) {
      fail(std::string(what) + " is not read by one " + std::string(ir::op_name(op)).substr(5) + " only");
      return -1;
    }
    nodes.push_back(r);
    return r;
  }
  bool want(double got, double expected, const char* what) {
    if (near_value(got, expected)) return true;
    return fail(std::string(what) + " is " + num(got) + ", not " + num(expected));
  }

  // a = 1 + f(x) read by Add(., 1): the Add node index or -1.
  int plus_one(int f_out, size_t rank) {
    const int add_i = next(f_out, OpKind::kOnnxAdd, "the Erf/Tanh result");
    if (add_i < 0) return -1;
    const auto one = constant_scalar(g, other_input(at(g, add_i), f_out), rank);
    if (!one) return fail("1 + erf: the 1 is not a constant scalar"), -1;
    if (!want(*one, 1.0, "the constant added")) return -1;
    return add_i;
  }

  // The product of x, 0.5 and a; returns y or -1.
  int tail(int x, int a, size_t rank) {
    const int r1 = rd.only_reader(a);
    if (r1 < 0 || at(g, r1).op != OpKind::kOnnxMul) return fail("1 + erf is not read by one Mul only"), -1;
    nodes.push_back(r1);
    const int o = other_input(at(g, r1), a);
    const int m = at(g, r1).outputs[0];
    if (o == x) {  // (A) Mul(Mul(x, a), 0.5)
      const int r2 = next(m, OpKind::kOnnxMul, "x * (1 + erf)");
      if (r2 < 0) return -1;
      const auto h = constant_scalar(g, other_input(at(g, r2), m), rank);
      if (!h) return fail("x * (1 + erf) is not multiplied by a constant"), -1;
      if (!want(*h, 0.5, "the half")) return -1;
      return at(g, r2).outputs[0];
    }
    if (auto h = constant_scalar(g, o, rank)) {  // (B) Mul(x, Mul(0.5, a))
      if (!want(*h, 0.5, "the half")) return -1;
      const int r2 = next(m, OpKind::kOnnxMul, "0.5 * (1 + erf)");
      if (r2 < 0) return -1;
      if (other_input(at(g, r2), m) != x) return fail("0.5 * (1 + erf) is not multiplied by x"), -1;
      return at(g, r2).outputs[0];
    }
    // (C) Mul(Mul(x, 0.5), a)
    const int hp = o >= 0 ? g.value(o).producer : -1;
    int hx = -1;
    double c = 0;
    if (hp < 0 || !const_operand(g, at(g, hp), OpKind::kOnnxMul, rank, hx, c) || hx != x)
      return fail("1 + erf is multiplied by neither x, 0.5 nor x * 0.5"), -1;
    if (!want(c, 0.5, "the half")) return -1;
    if (!rd.single(o)) return fail("x * 0.5 has other readers"), -1;
    nodes.push_back(hp);
    return m;
  }
};

// erf form anchored at Erf node `i`.
std::optional<Fusion> Matcher::finish(int x, int act, size_t rank, const char* approximate) {
  const int add_i = plus_one(act, rank);
  if (add_i < 0) return std::nullopt;
  const int y = tail(x, at(g, add_i).outputs[0], rank);
  if (y < 0) return std::nullopt;
  Fusion f;
  f.nodes = nodes;
  f.fused.op = OpKind::kOnnxGelu;
  f.fused.name = at(g, *std::max_element(nodes.begin(), nodes.end())).name;
  f.fused.inputs = {x};
  f.fused.outputs = {y};
  f.fused.attrs = {{"approximate", std::string(approximate)}};
  return f;
}

std::optional<Fusion> match_erf(ir::Graph& g, const Readers& rd, int i, std::string& why) {
  const ir::Node& erf = at(g, i);
  if (erf.inputs.size() != 1) return std::nullopt;
  const int u = erf.inputs[0];
  const int up = g.value(u).producer;
  if (up < 0) return std::nullopt;
  const ir::Node& scale = at(g, up);
  int x = -1;
  double c = 0;
  const bool div = scale.op == OpKind::kOnnxDiv && scale.inputs.size() == 2;
  if (div) {
    x = scale.inputs[0];
    const auto v = constant_scalar(g, scale.inputs[1], g.value(x).shape.size());
    if (!v) return std::nullopt;
    c = *v;
  } else if (!const_operand(g, scale, OpKind::kOnnxMul, g.value(u).shape.size(), x, c)) {
    return std::nullopt;
  }
  const size_t rank = g.value(x).shape.size();
  Matcher m{g, rd, "", {up, i}};
  auto out = [&]() -> std::optional<Fusion> {
    if (!(div ? m.want(c, kSqrt2, "the divisor") : m.want(c, 1 / kSqrt2, "the factor"))) return std::nullopt;
    if (!is_f32(g, x))
      return m.fail("x is " + std::string(ir::dtype_name(g.value(x).dtype)) + ", not f32"), std::nullopt;
    if (!rd.single(u)) return m.fail("x / sqrt(2) has other readers"), std::nullopt;
    return m.finish(x, erf.outputs[0], rank, "none");
  }();
  why = m.why;
  return out;
}

// tanh form anchored at Tanh node `i`.
std::optional<Fusion> match_tanh(ir::Graph& g, const Readers& rd, int i, std::string& why) {
  const ir::Node& tanh = at(g, i);
  if (tanh.inputs.size() != 1) return std::nullopt;
  // u = inner * sqrt(2/pi); inner = x + k; k = cube * 0.044715.
  const int u = tanh.inputs[0];
  const size_t rank = g.value(u).shape.size();
  const int up = g.value(u).producer;
  int inner = -1;
  double c_outer = 0;
  if (up < 0 || !const_operand(g, at(g, up), OpKind::kOnnxMul, rank, inner, c_outer)) return std::nullopt;
  const int ip = inner >= 0 ? g.value(inner).producer : -1;
  if (ip < 0 || at(g, ip).op != OpKind::kOnnxAdd || at(g, ip).inputs.size() != 2) return std::nullopt;
  // One operand of the Add is k = Mul(cube, c); the other is x.
  int x = -1, k = -1, kp = -1, cube = -1;
  double c_cubic = 0;
  for (int s = 0; s < 2 && kp < 0; ++s) {
    const int cand = at(g, ip).inputs[static_cast<size_t>(s)];
    const int p = cand >= 0 ? g.value(cand).producer : -1;
    if (p >= 0 && const_operand(g, at(g, p), OpKind::kOnnxMul, rank, cube, c_cubic)) {
      k = cand;
      kp = p;
      x = at(g, ip).inputs[static_cast<size_t>(1 - s)];
    }
  }
  if (kp < 0) return std::nullopt;
  Matcher m{g, rd, "", {up, i, ip, kp}};
  auto out = [&]() -> std::optional<Fusion> {
    // cube = Pow(x, 3) | Mul(x, Mul(x, x)) | Mul(Mul(x, x), x)
    const int cp = cube >= 0 ? g.value(cube).producer : -1;
    if (cp < 0) return m.fail("x^3 is not computed from x"), std::nullopt;
    const ir::Node& cn = at(g, cp);
    m.nodes.push_back(cp);
    if (cn.op == OpKind::kOnnxPow && cn.inputs.size() == 2 && cn.inputs[0] == x) {
      const auto e = constant_scalar(g, cn.inputs[1], rank);
      if (!e || *e != 3.0) return m.fail("Pow exponent is not a constant 3"), std::nullopt;
    } else if (cn.op == OpKind::kOnnxMul && cn.inputs.size() == 2 && other_input(cn, x) >= 0) {
      const int sq = other_input(cn, x);
      const int sp = sq >= 0 ? g.value(sq).producer : -1;
      if (sp < 0 || at(g, sp).op != OpKind::kOnnxMul || at(g, sp).inputs[0] != x || at(g, sp).inputs[1] != x)
        return m.fail("x^3 is not x * x * x"), std::nullopt;
      if (!rd.single(sq)) return m.fail("x * x has other readers"), std::nullopt;
      m.nodes.push_back(sp);
    } else {
      return m.fail("x^3 is not Pow(x, 3) or x * x * x"), std::nullopt;
    }
    if (!m.want(c_cubic, kTanhCubic, "the cubic coefficient")) return std::nullopt;
    if (!m.want(c_outer, kSqrt2OverPi, "the tanh scale")) return std::nullopt;
    if (!is_f32(g, x))
      return m.fail("x is " + std::string(ir::dtype_name(g.value(x).dtype)) + ", not f32"), std::nullopt;
    for (int v : {cube, k, inner, u})
      if (!rd.single(v)) return m.fail(g.value(v).name + " has other readers"), std::nullopt;
    return m.finish(x, tanh.outputs[0], rank, "tanh");
  }();
  why = m.why;
  return out;
}

}  // namespace

StatusOr<bool> FuseGelu::run(ir::Graph& g) {
  return run_anchored_fusions(
      g, {ir::OpKind::kOnnxErf, ir::OpKind::kOnnxTanh}, "GeLU",
      [](ir::Graph& gr, const Readers& rd, int i, std::string& why) {
        return gr.nodes()[static_cast<size_t>(i)].op == ir::OpKind::kOnnxErf ? match_erf(gr, rd, i, why)
                                                                             : match_tanh(gr, rd, i, why);
      },
      stats_);
}

}  // namespace k3::passes
