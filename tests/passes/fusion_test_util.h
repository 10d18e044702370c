// Helpers for the onnx-dialect fusion pass tests: building small decomposed
// graphs by hand (weights owned by the graph) and checking that a pass
// leaves the O0 interpreter's outputs unchanged.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "runtime/interp/interpreter.h"

namespace k3::passes::test {

using ir::DType;
using ir::OpKind;

struct Builder {
  ir::Graph g;

  int input(const std::string& name, std::vector<int64_t> shape, DType dt = DType::kF32) {
    return g.add_input(name, dt, std::move(shape), ir::RowDim::kFixed);
  }
  // A constant: f32 or f64 (converted from `v`), or i64 (rounded).
  int weight(const std::string& name, std::vector<int64_t> shape, const std::vector<double>& v,
             DType dt = DType::kF32) {
    std::shared_ptr<void> buf;
    if (dt == DType::kF32) {
      auto b = std::make_shared<std::vector<float>>(v.begin(), v.end());
      buf = std::shared_ptr<void>(b, b->data());
    } else if (dt == DType::kF64) {
      auto b = std::make_shared<std::vector<double>>(v);
      buf = std::shared_ptr<void>(b, b->data());
    } else {
      auto b = std::make_shared<std::vector<int64_t>>();
      for (double x : v) b->push_back(static_cast<int64_t>(std::llround(x)));
      buf = std::shared_ptr<void>(b, b->data());
    }
    const int id = g.add_weight(name, dt, std::move(shape), buf.get());
    g.keep_alive.push_back(buf);
    return id;
  }
  int scalar(const std::string& name, double v, DType dt = DType::kF32) { return weight(name, {}, {v}, dt); }
  // [n] values 0.5 + 0.1 i (distinct, nonzero).
  int ramp(const std::string& name, std::vector<int64_t> shape, DType dt = DType::kF32) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<double> v;
    for (int64_t i = 0; i < n; ++i) v.push_back(0.5 + 0.1 * static_cast<double>(i));
    return weight(name, std::move(shape), v, dt);
  }
  int node(OpKind op, const std::string& name, std::vector<int> in, std::vector<ir::Attr> attrs = {}) {
    auto r = g.add_node(op, name, std::move(in), std::move(attrs));
    EXPECT_TRUE(r.ok()) << name << ": " << r.status().message();
    return r.ok() ? (*r)[0] : -1;
  }
};

inline int count_op(const ir::Graph& g, OpKind op) {
  return static_cast<int>(
      std::count_if(g.nodes().begin(), g.nodes().end(), [&](const ir::Node& n) { return n.op == op; }));
}

inline bool any_note_has(const std::vector<std::string>& notes, const std::string& s) {
  return std::any_of(notes.begin(), notes.end(), [&](const std::string& n) { return n.find(s) != std::string::npos; });
}

// Deterministic inputs for every graph input (f32/f64 values in about
// [-3, 3], not centred, so means and variances are not trivial).
inline std::vector<runtime::interp::NamedTensor> inputs_for(const ir::Graph& g) {
  std::vector<runtime::interp::NamedTensor> in;
  uint32_t s = 12345;
  for (int id : g.inputs()) {
    const ir::Value& v = g.value(id);
    ir::Tensor t = *ir::Tensor::zeros(v.dtype, v.shape);
    for (int64_t i = 0; i < t.numel(); ++i) {
      s = s * 1664525u + 1013904223u;
      const double x = (static_cast<double>(s >> 8) / 16777216.0) * 6.0 - 2.5 + 0.01 * static_cast<double>(i % 7);
      if (v.dtype == DType::kF32) t.mut<float>()[i] = static_cast<float>(x);
      if (v.dtype == DType::kF64) t.mut<double>()[i] = x;
    }
    in.push_back({v.name, std::move(t)});
  }
  return in;
}

// Runs both graphs on the same inputs through the O0 interpreter and checks
// every output agrees within 1e-5 (relative to max(1, |want|)).
inline void expect_same_outputs(const ir::Graph& before, const ir::Graph& after) {
  auto a = runtime::interp::Interpreter::create(before);
  ASSERT_TRUE(a.ok()) << a.status().message();
  auto b = runtime::interp::Interpreter::create(after);
  ASSERT_TRUE(b.ok()) << b.status().message();
  const auto in = inputs_for(before);
  auto ra = a->run(in);
  ASSERT_TRUE(ra.ok()) << ra.status().message();
  auto rb = b->run(in);
  ASSERT_TRUE(rb.ok()) << rb.status().message();
  ASSERT_EQ(ra->size(), rb->size());
  for (size_t o = 0; o < ra->size(); ++o) {
    const ir::Tensor& want = (*ra)[o].tensor;
    const ir::Tensor& got = (*rb)[o].tensor;
    ASSERT_EQ(want.shape(), got.shape()) << (*ra)[o].name;
    ASSERT_EQ(want.dtype(), got.dtype());
    double worst = 0;
    for (int64_t i = 0; i < want.numel(); ++i) {
      const double w = want.dtype() == DType::kF32 ? want.data<float>()[i] : want.data<double>()[i];
      const double x = got.dtype() == DType::kF32 ? got.data<float>()[i] : got.data<double>()[i];
      worst = std::max(worst, std::fabs(w - x) / std::max(1.0, std::fabs(w)));
    }
    EXPECT_LE(worst, 1e-5) << "output " << (*ra)[o].name;
  }
}

}  // namespace k3::passes::test
