// Reference kernel of k3.Moe (docs/onnx-lowering.md), what the fuse-moe pass
// rewrites an exported MoE layer into: gate logits, top-k (ties to the lower
// expert index, like ONNX TopK), softmax over the chosen logits only, and
// the chosen experts' FFNs (exact-erf GeLU, or SwiGLU) mixed by those
// weights. Each matrix product accumulates in double and rounds to f32, like
// the onnx.MatMul reference, so the result matches the decomposed graph.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/onnx_ref/onnx_ref.h"

namespace k3::onnx_ref {
namespace {

// out[o] = f32(sum_i x[i] * w[o * n_in + i]) for a PyTorch [n_out, n_in] weight.
void linear(const float* x, const float* w, int64_t n_in, int64_t n_out, float* out) {
  for (int64_t o = 0; o < n_out; ++o) {
    double acc = 0.0;
    const float* row = w + o * n_in;
    for (int64_t i = 0; i < n_in; ++i) acc += static_cast<double>(x[i]) * static_cast<double>(row[i]);
    out[o] = static_cast<float>(acc);
  }
}

}  // namespace

// x [..., D], gate [E, D], per expert up [F, D] (gate [F, D]) down [D, F] -> [..., D].
Status ref_K3Moe(KernelCtx& c) {
  const int64_t n_exp = c.node.attr_int("n_experts"), top_k = c.node.attr_int("top_k");
  const bool swiglu = c.node.attr_int("swiglu") != 0;
  const int64_t per = swiglu ? 3 : 2;
  const ir::Tensor& x = *c.in[0];
  const int64_t d = x.shape().back(), f = c.in[2]->shape()[0];
  const int64_t rows = d == 0 ? 0 : x.numel() / d;
  std::vector<float> logits(static_cast<size_t>(n_exp)), h(static_cast<size_t>(f)), g(static_cast<size_t>(f)),
      y(static_cast<size_t>(d));
  std::vector<int64_t> order(static_cast<size_t>(n_exp));
  std::vector<double> acc(static_cast<size_t>(d));
  float* out = c.out[0].mut<float>();
  for (int64_t t = 0; t < rows; ++t) {
    const float* xr = x.data<float>() + t * d;
    linear(xr, c.in[1]->data<float>(), d, n_exp, logits.data());
    std::iota(order.begin(), order.end(), int64_t{0});
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)];
    });
    const double mx = logits[static_cast<size_t>(order[0])];
    double sum = 0.0;
    for (int64_t j = 0; j < top_k; ++j)
      sum += std::exp(logits[static_cast<size_t>(order[static_cast<size_t>(j)])] - mx);
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t j = 0; j < top_k; ++j) {
      const int64_t e = order[static_cast<size_t>(j)];
      const float wgt = static_cast<float>(std::exp(logits[static_cast<size_t>(e)] - mx) / sum);
      const ir::Tensor* const* w = c.in.data() + 2 + e * per;
      linear(xr, w[0]->data<float>(), d, f, h.data());
      if (swiglu) {
        linear(xr, w[1]->data<float>(), d, f, g.data());
        for (int64_t i = 0; i < f; ++i) {
          const double gi = g[static_cast<size_t>(i)];
          h[static_cast<size_t>(i)] = static_cast<float>(gi / (1.0 + std::exp(-gi)) * h[static_cast<size_t>(i)]);
        }
      } else {
        for (int64_t i = 0; i < f; ++i) {
          const double hi = h[static_cast<size_t>(i)];
          h[static_cast<size_t>(i)] = static_cast<float>(0.5 * hi * (1.0 + std::erf(hi / std::sqrt(2.0))));
        }
      }
      linear(h.data(), w[per - 1]->data<float>(), f, d, y.data());
      for (int64_t i = 0; i < d; ++i)
        acc[static_cast<size_t>(i)] += static_cast<double>(wgt) * y[static_cast<size_t>(i)];
    }
    for (int64_t i = 0; i < d; ++i) out[t * d + i] = static_cast<float>(acc[static_cast<size_t>(i)]);
  }
  return Status();
}

}  // namespace k3::onnx_ref
