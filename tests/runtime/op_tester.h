// A harness that runs one IR node through its optimized and its reference
// implementation on the same random inputs and compares every output (and
// every state buffer the op writes, such as the KV cache).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "runtime/ops/fast_ops.h"
#include "runtime/ops/op_call.h"
#include "util/aligned_buffer.h"
#include "util/half.h"
#include "util/panel.h"
#include "util/quant.h"

namespace k3::runtime::testing {

class OpTester {
 public:
  explicit OpTester(uint32_t seed = 1) : rng_(seed) {}

  int f32(const std::string& name, std::vector<int64_t> shape, ir::RowDim rd = ir::RowDim::kFixed, float scale = 1.0f) {
    int id = g_.add_input(name, ir::DType::kF32, shape, rd);
    std::vector<float> v(static_cast<size_t>(g_.value(id).numel()));
    std::uniform_real_distribution<float> u(-scale, scale);
    for (float& x : v) x = u(rng_);
    set(id, v.data(), v.size() * 4);
    return id;
  }
  // A [N, K] weight of dtype dt from random values in [-1, 1]: int8 blocks
  // (util/quant.h) for kQ8, bf16 bits for kBF16 / kBF16Dot, and the panel
  // layouts of f32 or bf16 values (util/panel.h) for kF32P16 / kBF16P16 /
  // kBF16DotP16.
  int weight(const std::string& name, std::vector<int64_t> shape, ir::DType dt) {
    if (dt == ir::DType::kF32) return f32(name, std::move(shape));
    const int64_t n = shape[0], k = shape[1];
    std::vector<float> v(static_cast<size_t>(n * k));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (float& x : v) x = u(rng_);
    int id = g_.add_input(name, dt, shape, ir::RowDim::kFixed);
    std::vector<uint8_t> bytes(g_.value(id).bytes());
    if (dt == ir::DType::kQ8) {
      const auto rb = static_cast<int64_t>(ir::q8_row_bytes(static_cast<uint64_t>(k)));
      for (int64_t r = 0; r < n; ++r) quantize_q8_row(v.data() + r * k, k, bytes.data() + r * rb);
    } else if (dt == ir::DType::kF32P16) {  // util/panel.h
      pack_panels(v.data(), n, k, reinterpret_cast<float*>(bytes.data()));
    } else if (dt == ir::DType::kBF16P16 || dt == ir::DType::kBF16DotP16) {
      std::vector<uint16_t> h(v.size());
      for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
      pack_panels(h.data(), n, k, reinterpret_cast<uint16_t*>(bytes.data()));
    } else {
      for (size_t i = 0; i < v.size(); ++i) {
        const uint16_t h = f32_to_bf16(v[i]);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
      }
    }
    set(id, bytes.data(), bytes.size());
    return id;
  }
  int f32_values(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v,
                 ir::RowDim rd = ir::RowDim::kFixed) {
    int id = g_.add_input(name, ir::DType::kF32, shape, rd);
    set(id, v.data(), v.size() * 4);
    return id;
  }
  int i32(const std::string& name, const std::vector<int32_t>& v, ir::RowDim rd) {
    int id = g_.add_input(name, ir::DType::kI32, {static_cast<int64_t>(v.size())}, rd);
    set(id, v.data(), v.size() * 4);
    return id;
  }
  // A state (KV cache) of f32 or bf16 elements, filled with random values.
  int state(const std::string& name, std::vector<int64_t> shape, ir::DType dtype = ir::DType::kF32) {
    int id = g_.add_state(name, dtype, shape);
    std::vector<float> v(static_cast<size_t>(g_.value(id).numel()));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (float& x : v) x = u(rng_);
    if (dtype == ir::DType::kBF16) {
      std::vector<uint16_t> h(v.size());
      for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
      set(id, h.data(), h.size() * 2);
    } else {
      set(id, v.data(), v.size() * 4);
    }
    return id;
  }
  void node(ir::OpKind op, std::vector<int> inputs, std::vector<ir::Attr> attrs = {}) {
    auto r = g_.add_node(op, "node", std::move(inputs), std::move(attrs));
    ASSERT_TRUE(r.ok()) << r.status().message();
    ASSERT_TRUE(g_.verify().ok());
  }

  // Runs fast and reference with `tokens` / `out_rows` rows and compares
  // outputs and state with |fast - ref| <= tol * max(1, |ref|).
  void check(int64_t tokens, int64_t out_rows, float tol, int threads = 2) {
    ThreadPool pool(threads);
    const auto fast = run(fast_op(g_.nodes()[0].op), tokens, out_rows, pool);
    const auto ref = run(ref_op(g_.nodes()[0].op), tokens, out_rows, pool);
    ASSERT_EQ(fast.size(), ref.size());
    double worst = 0;
    for (size_t b = 0; b < fast.size(); ++b)
      for (size_t i = 0; i < fast[b].size(); ++i) {
        const double err = std::fabs(fast[b][i] - ref[b][i]) / std::max(1.0, std::fabs(static_cast<double>(ref[b][i])));
        worst = std::max(worst, err);
        ASSERT_LE(err, tol) << "buffer " << b << " element " << i << ": fast " << fast[b][i] << " ref " << ref[b][i];
      }
    last_worst_ = worst;
  }
  double last_worst() const { return last_worst_; }
  // The fast op's outputs (then states) on `threads` threads.
  std::vector<std::vector<float>> fast_outputs(int64_t tokens, int64_t out_rows, int threads) {
    ThreadPool pool(threads);
    return run(fast_op(g_.nodes()[0].op), tokens, out_rows, pool);
  }
  ir::Graph& graph() { return g_; }
  // The split a Moe node's fast op took on `threads` threads
  // (moe_split_taken, read from the op's workspace after the call).
  MoeSplit fast_split(int64_t tokens, int threads) {
    MoeSplit split = MoeSplit::kColumns;
    fast_inspect(tokens, threads, [&](const OpCall& c) { split = moe_split_taken(c); });
    return split;
  }
  // Runs the fast op on `threads` threads, then hands its call (workspace
  // included) to `after`.
  void fast_inspect(int64_t tokens, int threads, const std::function<void(const OpCall&)>& after) {
    ThreadPool pool(threads);
    run(fast_op(g_.nodes()[0].op), tokens, 0, pool, after);
  }

 private:
  void set(int id, const void* data, size_t bytes) {
    if (data_.size() <= static_cast<size_t>(id)) data_.resize(static_cast<size_t>(id) + 1);
    data_[static_cast<size_t>(id)].assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + bytes);
  }

  // Returns the outputs (rows in use only) followed by the state buffers.
  std::vector<std::vector<float>> run(OpFn fn, int64_t tokens, int64_t out_rows, ThreadPool& pool,
                                      const std::function<void(const OpCall&)>& after = nullptr) {
    const ir::Node& n = g_.nodes()[0];
    std::vector<std::vector<uint8_t>> bufs = data_;
    bufs.resize(g_.values().size());
    auto rows_of = [&](const ir::Value& v) {
      return v.row_dim == ir::RowDim::kTokens ? tokens : v.row_dim == ir::RowDim::kOutRows ? out_rows : v.shape[0];
    };
    std::vector<TensorArg> args;
    for (int id : n.inputs) args.push_back({bufs[static_cast<size_t>(id)].data(), &g_.value(id), rows_of(g_.value(id))});
    for (int id : n.outputs) {
      bufs[static_cast<size_t>(id)].assign(g_.value(id).bytes(), 0xff);  // garbage, so unwritten rows show
      args.push_back({bufs[static_cast<size_t>(id)].data(), &g_.value(id), rows_of(g_.value(id))});
    }
    AlignedBuffer ws;
    EXPECT_TRUE(ws.allocate(op_workspace_bytes(g_, n)));
    OpCall call{&n, args.data(), args.data() + n.inputs.size(), ws.data(), &pool, &kernels::best_table()};
    fn(call);
    if (after) after(call);
    std::vector<std::vector<float>> out;
    for (int id : n.outputs) {
      const ir::Value& v = g_.value(id);
      const size_t count = static_cast<size_t>(rows_of(v) * (v.numel() / v.shape[0]));
      std::vector<float> f(count);
      std::memcpy(f.data(), bufs[static_cast<size_t>(id)].data(), count * 4);
      out.push_back(std::move(f));
    }
    for (int id : n.inputs)
      if (g_.value(id).kind == ir::ValueKind::kState) {
        std::vector<float> f(static_cast<size_t>(g_.value(id).numel()));
        const uint8_t* b = bufs[static_cast<size_t>(id)].data();
        if (g_.value(id).dtype == ir::DType::kBF16) {
          for (size_t i = 0; i < f.size(); ++i) {
            uint16_t h;
            std::memcpy(&h, b + 2 * i, 2);
            f[i] = bf16_to_f32(h);
          }
        } else {
          std::memcpy(f.data(), b, f.size() * 4);
        }
        out.push_back(std::move(f));
      }
    return out;
  }

  ir::Graph g_;
  std::mt19937 rng_;
  std::vector<std::vector<uint8_t>> data_;
  double last_worst_ = 0;
};

}  // namespace k3::runtime::testing
