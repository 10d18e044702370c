// Scalar reference implementation of every op in ir/op_table.h.
//
// Written for obviousness, not speed: the direct transcription of the math in
// docs/model-format.md. MoE here computes only the chosen experts per token,
// one token at a time; attention uses a two-pass softmax in double.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "runtime/ops/op_call.h"
#include "util/half.h"
#include "util/panel.h"
#include "util/q8_panel.h"
#include "util/quant.h"
#include "util/tiles.h"

namespace k3::runtime {
namespace {

void ref_Embedding(const OpCall& c) {
  const float* table = c.in[0].f32();
  const int32_t* ids = c.in[1].i32();
  const int64_t d = c.out[0].cols();
  const float scale = static_cast<float>(c.node->attr_float("scale", 1.0));
  for (int64_t t = 0; t < c.out[0].rows; ++t)
    for (int64_t i = 0; i < d; ++i) c.out[0].f32()[t * d + i] = table[static_cast<int64_t>(ids[t]) * d + i] * scale;
}

float clip_to(float v, double clip) {
  return clip > 0.0 ? static_cast<float>(std::clamp(static_cast<double>(v), -clip, clip)) : v;
}

void ref_norm(const OpCall& c, bool layer_norm) {
  // Each row is `groups` independent groups of d values (RmsNorm's group attr).
  const int64_t width = c.in[0].cols(), d = layer_norm ? width : c.node->attr_int("group", width);
  const float eps = static_cast<float>(c.node->attr_float("eps"));
  const double clip = c.node->attr_float("clip", 0.0);
  const float* w = c.in[1].f32();
  const float* b = layer_norm ? c.in[2].f32() : nullptr;
  for (int64_t t = 0; t < c.in[0].rows * (width / d); ++t) {
    const float* x = c.in[0].f32() + t * d;
    float* y = c.out[0].f32() + t * d;
    double mean = 0.0, var = 0.0;
    if (layer_norm) {
      for (int64_t i = 0; i < d; ++i) mean += x[i];
      mean /= static_cast<double>(d);
    }
    for (int64_t i = 0; i < d; ++i) var += (x[i] - mean) * (x[i] - mean);
    var /= static_cast<double>(d);
    const double inv = 1.0 / std::sqrt(var + eps);
    for (int64_t i = 0; i < d; ++i)
      y[i] = clip_to(static_cast<float>((x[i] - mean) * inv * w[i] + (b ? b[i] : 0.0)), clip);
  }
}

void ref_LayerNorm(const OpCall& c) { ref_norm(c, true); }
void ref_RmsNorm(const OpCall& c) { ref_norm(c, false); }

// y[t, n] = sum_k x[t, k] * w[n, k], accumulated in double.
void linear_rows(const float* x, int64_t rows, int64_t k_dim, const float* w, int64_t n_dim, float* y) {
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t n = 0; n < n_dim; ++n) {
      double acc = 0.0;
      for (int64_t k = 0; k < k_dim; ++k) acc += static_cast<double>(x[t * k_dim + k]) * w[n * k_dim + k];
      y[t * n_dim + n] = static_cast<float>(acc);
    }
}

// A weight argument as f32: in place for f32, widened (exactly) into a copy
// for bf16, dequantized (float(q) * scale, as the kernels do) for int8. The
// reference allocates freely; it is the oracle, not the hot path.
struct WeightF32 {
  std::vector<float> owned;
  const float* data;
};

WeightF32 weight_f32(const TensorArg& w) {
  const int64_t n = w.dim(0) * w.cols();
  if (w.value->dtype == ir::DType::kQ8) {
    WeightF32 out{std::vector<float>(static_cast<size_t>(n)), nullptr};
    const auto row_bytes = static_cast<int64_t>(ir::q8_row_bytes(static_cast<uint64_t>(w.cols())));
    for (int64_t r = 0; r < w.dim(0); ++r)
      dequantize_q8_row(static_cast<const uint8_t*>(w.data) + r * row_bytes, w.cols(), out.owned.data() + r * w.cols());
    out.data = out.owned.data();
    return out;
  }
  if (w.value->dtype == ir::DType::kQ8P16 || w.value->dtype == ir::DType::kQ8CP16) {
    WeightF32 out{std::vector<float>(static_cast<size_t>(n)), nullptr};
    const auto* base = static_cast<const uint8_t*>(w.data);
    const bool channel = w.value->dtype == ir::DType::kQ8CP16;
    for (int64_t r = 0; r < w.dim(0); ++r)
      for (int64_t k = 0; k < w.cols(); ++k)
        out.owned[static_cast<size_t>(r * w.cols() + k)] =
            channel ? q8c_panel_weight(base, w.cols(), r, k) : q8_panel_weight(base, w.cols(), r, k);
    out.data = out.owned.data();
    return out;
  }
  if (w.value->dtype == ir::DType::kF32P16 || w.value->dtype == ir::DType::kBF16P16 ||
      w.value->dtype == ir::DType::kBF16DotP16) {
    std::vector<float> rows(static_cast<size_t>(n));
    if (w.value->dtype == ir::DType::kF32P16) {
      unpack_panels(static_cast<const float*>(w.data), w.dim(0), w.cols(), rows.data());
    } else {
      std::vector<uint16_t> h(static_cast<size_t>(n));
      unpack_panels(static_cast<const uint16_t*>(w.data), w.dim(0), w.cols(), h.data());
      for (int64_t i = 0; i < n; ++i) rows[static_cast<size_t>(i)] = bf16_to_f32(h[static_cast<size_t>(i)]);
    }
    WeightF32 out{std::move(rows), nullptr};
    out.data = out.owned.data();
    return out;
  }
  if (w.value->dtype == ir::DType::kBF16DotT16) {
    std::vector<uint16_t> h(static_cast<size_t>(n));
    unpack_tile_rows(static_cast<const uint16_t*>(w.data), 0, w.dim(0), w.cols(), h.data());
    WeightF32 out{std::vector<float>(static_cast<size_t>(n)), nullptr};
    for (int64_t i = 0; i < n; ++i) out.owned[static_cast<size_t>(i)] = bf16_to_f32(h[static_cast<size_t>(i)]);
    out.data = out.owned.data();
    return out;
  }
  if (w.value->dtype != ir::DType::kBF16 && w.value->dtype != ir::DType::kBF16Dot) return {{}, w.f32()};
  WeightF32 out{std::vector<float>(static_cast<size_t>(n)), nullptr};
  const auto* h = static_cast<const uint16_t*>(w.data);
  for (int64_t i = 0; i < n; ++i) out.owned[static_cast<size_t>(i)] = bf16_to_f32(h[i]);
  out.data = out.owned.data();
  return out;
}

// linear_rows against a weight argument, as the fast kernels compute it: for
// int8 weights the activations are rounded to int8 per block of 32 first
// (util/quant.h, quantize_a8_row; kernels.h, gemm_nt_q8: W8A8), for bf16dot
// weights to bf16 (kernels.h, gemm_nt_bf16dot), so only the summation order
// differs from the kernels.
void linear_weight(const float* x, int64_t rows, int64_t k_dim, const TensorArg& w, int64_t n_dim, float* y) {
  const WeightF32 wf = weight_f32(w);
  if (w.value->dtype == ir::DType::kBF16Dot || w.value->dtype == ir::DType::kBF16DotT16 ||
      w.value->dtype == ir::DType::kBF16DotP16) {
    std::vector<float> xr(static_cast<size_t>(rows * k_dim));
    for (size_t i = 0; i < xr.size(); ++i) xr[i] = bf16_to_f32(f32_to_bf16(x[i]));
    return linear_rows(xr.data(), rows, k_dim, wf.data, n_dim, y);
  }
  if (!ir::dtype_is_q8(w.value->dtype)) return linear_rows(x, rows, k_dim, wf.data, n_dim, y);
  std::vector<float> xq(static_cast<size_t>(rows * k_dim));
  std::vector<int8_t> q(static_cast<size_t>(k_dim));
  std::vector<float> scales(static_cast<size_t>(k_dim / ir::kQ8Block));
  for (int64_t t = 0; t < rows; ++t) {
    quantize_a8_row(x + t * k_dim, k_dim, q.data(), scales.data());
    for (int64_t k = 0; k < k_dim; ++k)
      xq[static_cast<size_t>(t * k_dim + k)] =
          static_cast<float>(q[static_cast<size_t>(k)]) * scales[static_cast<size_t>(k / ir::kQ8Block)];
  }
  linear_rows(xq.data(), rows, k_dim, wf.data, n_dim, y);
}

void ref_Linear(const OpCall& c) {
  // The whole [T, N] product, then its column ranges to the outputs (one
  // output unless attr splits).
  const int64_t n = c.in[1].dim(0), rows = c.in[0].rows;
  std::vector<float> y(static_cast<size_t>(rows * n));
  linear_weight(c.in[0].f32(), rows, c.in[0].cols(), c.in[1], n, y.data());
  const float* bias = ir::linear_has_bias(*c.node) ? c.in[2].f32() : nullptr;
  const float scale = static_cast<float>(c.node->attr_float("scale", 1.0));
  const double clip = c.node->attr_float("clip", 0.0);
  // The residual (one output only), added last: as the Add it replaces.
  const int res = ir::residual_input(*c.node);
  const float* r = res >= 0 ? c.in[res].f32() : nullptr;
  int64_t o = 0;
  for (size_t i = 0; i < c.node->outputs.size(); ++i) {
    const int64_t width = c.out[i].cols();
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t j = 0; j < width; ++j) {
        float& out = c.out[i].f32()[t * width + j];
        out = clip_to((y[static_cast<size_t>(t * n + o + j)] + (bias ? bias[o + j] : 0.0f)) * scale, clip);
        if (r != nullptr) out += r[t * width + j];
      }
    o += width;
  }
}

void ref_Add(const OpCall& c) {
  const int64_t n = c.out[0].rows * c.out[0].cols();
  const float scale = static_cast<float>(c.node->attr_float("scale", 1.0));
  for (int64_t i = 0; i < n; ++i) c.out[0].f32()[i] = c.in[0].f32()[i] + scale * c.in[1].f32()[i];
}

void ref_Rope(const OpCall& c) {
  const int64_t width = c.in[0].cols(), hd = c.node->attr_int("head_dim"), half = hd / 2;
  const float* cos_t = c.in[2].f32();
  const float* sin_t = c.in[3].f32();
  for (int64_t t = 0; t < c.in[0].rows; ++t) {
    const int64_t p = c.in[1].i32()[t];
    for (int64_t h = 0; h < width / hd; ++h) {
      const float* u = c.in[0].f32() + t * width + h * hd;
      float* o = c.out[0].f32() + t * width + h * hd;
      for (int64_t i = 0; i < half; ++i) {
        const float cs = cos_t[p * half + i], sn = sin_t[p * half + i];
        o[i] = u[i] * cs - u[i + half] * sn;
        o[i + half] = u[i + half] * cs + u[i] * sn;
      }
    }
  }
}

void ref_CachedAttention(const OpCall& c) {
  const int64_t hq = c.node->attr_int("n_heads"), hkv = c.node->attr_int("n_kv_heads"), hd = c.node->attr_int("head_dim");
  const int64_t max_seq = c.in[5].dim(2);
  // f32 cache, or bf16 (rounded to nearest even as written, widened as read).
  const bool bf16 = c.in[5].value->dtype == ir::DType::kBF16;
  const int64_t rows = c.in[0].rows;
  // Cache layout [slot, kv_head, position, head_dim]; element offset of a row.
  auto at = [&](int64_t slot, int64_t h, int64_t p) { return ((slot * hkv + h) * max_seq + p) * hd; };
  auto store = [&](void* cache, int64_t off, const float* src) {
    for (int64_t i = 0; i < hd; ++i) {
      if (bf16)
        static_cast<uint16_t*>(cache)[off + i] = f32_to_bf16(src[i]);
      else
        static_cast<float*>(cache)[off + i] = src[i];
    }
  };
  auto load = [&](const void* cache, int64_t off) {
    return bf16 ? bf16_to_f32(static_cast<const uint16_t*>(cache)[off]) : static_cast<const float*>(cache)[off];
  };
  void* kc = c.in[5].data;
  void* vc = c.in[6].data;
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t h = 0; h < hkv; ++h) {
      const int64_t s = c.in[4].i32()[t], p = c.in[3].i32()[t];
      store(kc, at(s, h, p), c.in[1].f32() + t * hkv * hd + h * hd);
      store(vc, at(s, h, p), c.in[2].f32() + t * hkv * hd + h * hd);
    }
  const double scale = c.node->attr_float("scale", 1.0 / std::sqrt(static_cast<double>(hd)));
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t s = c.in[4].i32()[t], p = c.in[3].i32()[t];
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t g = h / (hq / hkv);
      const float* q = c.in[0].f32() + t * hq * hd + h * hd;
      std::vector<double> score(static_cast<size_t>(p + 1));
      double mx = -INFINITY;
      for (int64_t j = 0; j <= p; ++j) {
        double dot = 0.0;
        const int64_t k = at(s, g, j);
        for (int64_t i = 0; i < hd; ++i) dot += static_cast<double>(q[i]) * load(kc, k + i);
        score[static_cast<size_t>(j)] = dot * scale;
        mx = std::max(mx, dot * scale);
      }
      double sum = 0.0;
      for (double& sc : score) sum += (sc = std::exp(sc - mx));
      float* o = c.out[0].f32() + t * hq * hd + h * hd;
      for (int64_t i = 0; i < hd; ++i) {
        double acc = 0.0;
        for (int64_t j = 0; j <= p; ++j) acc += score[static_cast<size_t>(j)] * load(vc, at(s, g, j) + i);
        o[i] = static_cast<float>(acc / sum);
      }
    }
  }
}

void ref_Moe(const OpCall& c) {
  const int64_t n_exp = c.node->attr_int("n_experts"), top_k = c.node->attr_int("top_k");
  const bool swiglu = c.node->attr_int("swiglu") != 0;
  const bool renormalize = c.node->attr_int("renormalize", 1) != 0, shared = c.node->attr_int("shared", 0) != 0;
  const int64_t per = swiglu ? 3 : 2, d = c.in[0].cols(), f = c.in[2].dim(0);
  std::vector<float> logits(static_cast<size_t>(n_exp)), h(static_cast<size_t>(f)), g(static_cast<size_t>(f)),
      y(static_cast<size_t>(d));
  for (int64_t t = 0; t < c.in[0].rows; ++t) {
    const float* x = c.in[0].f32() + t * d;
    linear_rows(x, 1, d, c.in[1].f32(), n_exp, logits.data());
    // Top-k by logit, ties to the lower index (stable sort, descending).
    std::vector<int64_t> order(static_cast<size_t>(n_exp));
    for (int64_t e = 0; e < n_exp; ++e) order[static_cast<size_t>(e)] = e;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
    // Softmax over the chosen experts, or over all of them (renormalize 0).
    double mx = logits[static_cast<size_t>(order[0])], sum = 0.0;
    for (int64_t j = 0; j < (renormalize ? top_k : n_exp); ++j)
      sum += std::exp(static_cast<double>(logits[static_cast<size_t>(order[j])]) - mx);
    float* out = c.out[0].f32() + t * d;
    std::vector<double> acc(static_cast<size_t>(d), 0.0);
    for (int64_t j = 0; j < top_k; ++j) {
      const int64_t e = order[static_cast<size_t>(j)];
      const double wgt = std::exp(static_cast<double>(logits[static_cast<size_t>(e)]) - mx) / sum;
      const TensorArg* w = c.in + 2 + e * per;
      linear_weight(x, 1, d, w[0], f, h.data());
      if (swiglu) {
        linear_weight(x, 1, d, w[1], f, g.data());
        for (int64_t i = 0; i < f; ++i) h[i] = static_cast<float>(g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * h[i]);
      } else {
        for (int64_t i = 0; i < f; ++i) h[i] = static_cast<float>(0.5 * h[i] * (1.0 + std::erf(h[i] / std::sqrt(2.0))));
      }
      linear_weight(h.data(), 1, f, w[per - 1], d, y.data());
      for (int64_t i = 0; i < d; ++i) acc[i] += wgt * y[i];
    }
    if (shared) {
      // SwiGLU shared expert, weighted by sigmoid of its own [1, D] gate.
      const TensorArg* w = c.in + 2 + n_exp * per;
      const int64_t s = w[0].dim(0);
      std::vector<float> hs(static_cast<size_t>(s)), gs(static_cast<size_t>(s));
      float gate_logit = 0.0f;
      linear_weight(x, 1, d, w[0], s, hs.data());
      linear_weight(x, 1, d, w[1], s, gs.data());
      for (int64_t i = 0; i < s; ++i)
        hs[i] = static_cast<float>(gs[i] / (1.0 + std::exp(-static_cast<double>(gs[i]))) * hs[i]);
      linear_weight(hs.data(), 1, s, w[2], d, y.data());
      linear_weight(x, 1, d, w[3], 1, &gate_logit);
      const double sig = 1.0 / (1.0 + std::exp(-static_cast<double>(gate_logit)));
      for (int64_t i = 0; i < d; ++i) acc[i] += sig * y[i];
    }
    // The residual, if any, added to the rounded sum (as the Add it replaces).
    const int res = ir::residual_input(*c.node);
    for (int64_t i = 0; i < d; ++i) {
      out[i] = static_cast<float>(acc[i]);
      if (res >= 0) out[i] += c.in[res].f32()[t * d + i];
    }
  }
}

void ref_GatherRows(const OpCall& c) {
  const int64_t d = c.out[0].cols();
  for (int64_t r = 0; r < c.out[0].rows; ++r)
    std::memcpy(c.out[0].f32() + r * d, c.in[0].f32() + static_cast<int64_t>(c.in[1].i32()[r]) * d, static_cast<size_t>(d) * 4);
}

}  // namespace

OpFn ref_op(ir::OpKind op) {
  switch (op) {
#define K3_OP_REF(e, name) \
  case ir::OpKind::k##e:   \
    return &ref_##e;
    K3_OP_LIST(K3_OP_REF)
#undef K3_OP_REF
    default: break;  // onnx.* ops: the O0 interpreter's kernels (runtime/interp)
  }
  return nullptr;
}

}  // namespace k3::runtime
