// Reference kernels of K3's own ops with ONNX-style shapes (k3.*, see
// docs/onnx-lowering.md): what the fusion passes rewrite exported
// subgraphs into. The interpreter runs them, so a graph stays executable
// (and testable against the reference model) after every pass.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "kernels/onnx_ref/onnx_ref.h"

namespace k3::onnx_ref {

// x [B, S, H*hd], positions [B, S], cos/sin [L, hd/2] -> [B, S, H*hd].
// Rotate-half per head, in f32 with the exported graph's operation order
// (x1*c - x2*s, x2*c + x1*s), so results match the decomposed graph.
Status ref_K3Rope(KernelCtx& c) {
  const ir::Tensor &x = *c.in[0], &pos = *c.in[1], &cos = *c.in[2], &sin = *c.in[3];
  ir::Tensor& y = c.out[0];
  const int64_t hd = c.node.attr_int("head_dim"), half = hd / 2;
  const int64_t tokens = x.shape()[0] * x.shape()[1], width = x.shape()[2], table_len = cos.shape()[0];
  const std::vector<int64_t> p = index_values(pos);
  const float* xs = x.data<float>();
  float* ys = y.mut<float>();
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t at = p[static_cast<size_t>(t)];
    if (at < 0 || at >= table_len)
      return out_of_range("position " + std::to_string(at) + " is outside the rotary table of " +
                          std::to_string(table_len) + " positions");
    const float* cr = cos.data<float>() + at * half;
    const float* sr = sin.data<float>() + at * half;
    for (int64_t h = 0; h < width / hd; ++h) {
      const float* in = xs + t * width + h * hd;
      float* out = ys + t * width + h * hd;
      for (int64_t i = 0; i < half; ++i) {
        const float a = in[i] * cr[i];
        const float b = in[half + i] * sr[i];
        const float d = in[half + i] * cr[i];
        const float e = in[i] * sr[i];
        out[i] = a - b;
        out[half + i] = d + e;
      }
    }
  }
  return Status();
}

// q [B,S,Hq*hd], k, v [B,S,Hkv*hd], positions [B,S], past_k, past_v
// [B,Hkv,P,hd] -> out [B,S,Hq*hd], present_k, present_v [B,Hkv,P',hd].
// cache "concat": present = concat(past, new) on the position axis, key s
// sits at position s; "slot": present = past with token [b,t] written at
// slot positions[b,t]. Query [b,t] sees cache entries s <= positions[b,t];
// query head j reads kv head j / (Hq / Hkv). Softmax in double with the
// max subtracted. A position outside the cache is an error.
Status ref_K3Attention(KernelCtx& c) {
  const ir::Tensor &q = *c.in[0], &k = *c.in[1], &v = *c.in[2], &pos = *c.in[3], &pk = *c.in[4], &pv = *c.in[5];
  const int64_t hq = c.node.attr_int("n_heads"), hkv = c.node.attr_int("n_kv_heads"), hd = c.node.attr_int("head_dim");
  const double scale = c.node.attr_float("scale", 1.0);
  const auto* cache = c.node.find_attr("cache");
  const bool slot =
      cache != nullptr && std::get_if<std::string>(cache) != nullptr && *std::get_if<std::string>(cache) == "slot";
  const int64_t b_n = q.shape()[0], s_n = q.shape()[1], p_n = pk.shape()[2], p2 = c.out[1].shape()[2];
  const int64_t group = hq / hkv;
  const std::vector<int64_t> p = index_values(pos);
  // present = past (concat: at the front), then the new tokens.
  for (int which = 0; which < 2; ++which) {
    const ir::Tensor& past = which == 0 ? pk : pv;
    const ir::Tensor& nw = which == 0 ? k : v;
    float* pr = c.out[static_cast<size_t>(1 + which)].mut<float>();
    for (int64_t b = 0; b < b_n; ++b)
      for (int64_t h = 0; h < hkv; ++h) {
        float* dst = pr + (b * hkv + h) * p2 * hd;
        std::memcpy(dst, past.data<float>() + (b * hkv + h) * p_n * hd, static_cast<size_t>(p_n * hd) * sizeof(float));
        for (int64_t t = 0; t < s_n; ++t) {
          const int64_t at = slot ? p[static_cast<size_t>(b * s_n + t)] : p_n + t;
          if (at < 0 || at >= p2)
            return out_of_range("k3.Attention: position " + std::to_string(at) + " is outside the cache of " +
                                std::to_string(p2) + " entries");
          std::memcpy(dst + at * hd, nw.data<float>() + (b * s_n + t) * hkv * hd + h * hd,
                      static_cast<size_t>(hd) * sizeof(float));
        }
      }
  }
  const float* kc = c.out[1].data<float>();
  const float* vc = c.out[2].data<float>();
  float* o = c.out[0].mut<float>();
  std::vector<double> w(static_cast<size_t>(p2));
  for (int64_t b = 0; b < b_n; ++b)
    for (int64_t t = 0; t < s_n; ++t) {
      const int64_t at = p[static_cast<size_t>(b * s_n + t)];
      if (at < 0 || at >= p2)
        return out_of_range("k3.Attention: position " + std::to_string(at) + " is outside the cache of " +
                            std::to_string(p2) + " entries");
      for (int64_t j = 0; j < hq; ++j) {
        const int64_t h = j / group;
        const float* qr = q.data<float>() + (b * s_n + t) * hq * hd + j * hd;
        const float* kh = kc + (b * hkv + h) * p2 * hd;
        const float* vh = vc + (b * hkv + h) * p2 * hd;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t s = 0; s <= at; ++s) {
          double dot = 0;
          for (int64_t d = 0; d < hd; ++d) dot += static_cast<double>(qr[d]) * static_cast<double>(kh[s * hd + d]);
          w[static_cast<size_t>(s)] = dot * scale;
          mx = std::max(mx, w[static_cast<size_t>(s)]);
        }
        double sum = 0;
        for (int64_t s = 0; s <= at; ++s) sum += (w[static_cast<size_t>(s)] = std::exp(w[static_cast<size_t>(s)] - mx));
        float* orow = o + (b * s_n + t) * hq * hd + j * hd;
        for (int64_t d = 0; d < hd; ++d) {
          double acc = 0;
          for (int64_t s = 0; s <= at; ++s) acc += w[static_cast<size_t>(s)] * static_cast<double>(vh[s * hd + d]);
          orow[d] = static_cast<float>(acc / sum);
        }
      }
    }
  return Status();
}

// x [..., D] f32, scale (and bias for norm "layer") -> [..., D]: the ONNX
// norm op's result, then the activation on it. Runs the onnx.* reference
// kernels of the two ops it stands for, so its results are bit for bit those
// of the unfused graph (the norm in double rounded to f32, then the
// activation on the f32 values).
Status ref_K3NormAct(KernelCtx& c) {
  const auto* norm = std::get_if<std::string>(c.node.find_attr("norm"));
  const auto* act = std::get_if<std::string>(c.node.find_attr("activation"));
  if (norm == nullptr || act == nullptr) return invalid_argument("k3.NormAct needs string attrs norm and activation");
  const bool layer = *norm == "layer";
  const ir::Node norm_node{layer ? ir::OpKind::kOnnxLayerNormalization : ir::OpKind::kOnnxRMSNormalization,
                           c.node.name,
                           {},
                           {},
                           {{"axis", c.node.attr_int("axis", -1)}, {"epsilon", c.node.attr_float("epsilon", 1e-5)}}};
  ir::Node act_node{ir::OpKind::kOnnxRelu, c.node.name, {}, {}, {}};
  if (*act == "gelu" || *act == "gelu_tanh") {
    act_node.op = ir::OpKind::kOnnxGelu;
    act_node.attrs.push_back({"approximate", std::string(*act == "gelu" ? "none" : "tanh")});
  } else if (*act == "sigmoid") {
    act_node.op = ir::OpKind::kOnnxSigmoid;
  } else if (*act == "tanh") {
    act_node.op = ir::OpKind::kOnnxTanh;
  } else if (*act != "relu") {
    return invalid_argument("k3.NormAct: unknown activation " + *act);
  }
  std::optional<ir::Tensor> normed = ir::Tensor::zeros(c.out[0].dtype(), c.out[0].shape());
  if (!normed) return invalid_argument("k3.NormAct: cannot allocate the norm result");
  std::vector<ir::Tensor> mid;
  mid.push_back(std::move(*normed));
  KernelCtx nc{norm_node, c.in, mid};
  K3_RETURN_IF_ERROR(layer ? ref_OnnxLayerNormalization(nc) : ref_OnnxRMSNormalization(nc));
  KernelCtx ac{act_node, {&mid[0]}, c.out};
  switch (act_node.op) {
    case ir::OpKind::kOnnxGelu:
      return ref_OnnxGelu(ac);
    case ir::OpKind::kOnnxSigmoid:
      return ref_OnnxSigmoid(ac);
    case ir::OpKind::kOnnxTanh:
      return ref_OnnxTanh(ac);
    default:
      return ref_OnnxRelu(ac);
  }
}

}  // namespace k3::onnx_ref
