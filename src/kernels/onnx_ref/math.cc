// Reference kernels: MatMul, Gemm, Softmax, LayerNormalization,
// RMSNormalization, reductions, ArgMax, TopK, Trilu. Float sums accumulate
// in double.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <type_traits>

#include "kernels/onnx_ref/onnx_ref.h"

namespace k3::onnx_ref {
namespace {

using ir::Tensor;

template <typename T>
using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;

// Splits a shape at `axis` into (outer, dim, inner) element counts.
void split_at(const Shape& s, int64_t axis, int64_t& outer, int64_t& dim, int64_t& inner) {
  outer = 1;
  inner = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= s[static_cast<size_t>(i)];
  dim = s[static_cast<size_t>(axis)];
  for (size_t i = static_cast<size_t>(axis) + 1; i < s.size(); ++i) inner *= s[i];
}

// Reduced axes of a Reduce* node (attribute or input 1), normalized;
// empty with `noop` set when the node reduces nothing.
std::vector<int64_t> reduce_axes(const KernelCtx& c, int64_t r, bool& noop) {
  std::vector<int64_t> axes;
  noop = false;
  if (const auto* a = c.node.attr_ints("axes"))
    axes = *a;
  else if (c.in.size() > 1 && c.in[1] != nullptr)
    axes = index_values(*c.in[1]);
  if (axes.empty()) {
    if (c.node.attr_int("noop_with_empty_axes", 0) != 0) {
      noop = true;
      return axes;
    }
    for (int64_t i = 0; i < r; ++i) axes.push_back(i);
  }
  for (auto& a : axes) a = norm_axis(a, r);
  return axes;
}

enum class Red { kSum, kMean, kMax };

Status reduce(KernelCtx& c, Red kind) {
  const Tensor& x = *c.in[0];
  const int64_t r = x.rank();
  bool noop = false;
  const std::vector<int64_t> axes = reduce_axes(c, r, noop);
  return visit_numeric(x.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* py = c.out[0].mut<T>();
    if (noop) {
      std::memcpy(py, px, x.nbytes());
      return Status();
    }
    // Walk the input; each element lands in the output slot with the
    // reduced axes' strides zeroed.
    Shape kept(static_cast<size_t>(r));
    int64_t group = 1;
    for (int64_t i = 0; i < r; ++i) {
      const bool red = std::find(axes.begin(), axes.end(), i) != axes.end();
      kept[static_cast<size_t>(i)] = red ? 1 : x.shape()[static_cast<size_t>(i)];
      if (red) group *= x.shape()[static_cast<size_t>(i)];
    }
    const Shape out_strides = broadcast_strides(kept, x.shape());
    const int64_t n_out = c.out[0].numel();
    std::vector<Acc<T>> acc(static_cast<size_t>(n_out), kind == Red::kMax ? Acc<T>(0) : Acc<T>(0));
    std::vector<bool> seen(static_cast<size_t>(n_out), false);
    for_each_index<1>(x.shape(), {out_strides}, [&](int64_t i, const std::array<int64_t, 1>& o) {
      auto& a = acc[static_cast<size_t>(o[0])];
      const Acc<T> v = static_cast<Acc<T>>(px[i]);
      if (kind == Red::kMax) {
        if (!seen[static_cast<size_t>(o[0])] || v > a || v != v) a = v;
        seen[static_cast<size_t>(o[0])] = true;
      } else {
        a += v;
      }
    });
    for (int64_t i = 0; i < n_out; ++i) {
      Acc<T> v = acc[static_cast<size_t>(i)];
      if (kind == Red::kMean) v = group > 0 ? static_cast<Acc<T>>(v / static_cast<Acc<T>>(group)) : v;
      if (kind == Red::kMax && group == 0) v = static_cast<Acc<T>>(std::numeric_limits<T>::lowest());
      py[i] = static_cast<T>(v);
    }
    return Status();
  });
}

Status softmax(KernelCtx& c, bool log) {
  const Tensor& x = *c.in[0];
  const int64_t axis = norm_axis(c.node.attr_int("axis", -1), x.rank());
  int64_t outer, dim, inner;
  split_at(x.shape(), axis, outer, dim, inner);
  return visit_float(x.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* py = c.out[0].mut<T>();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t in = 0; in < inner; ++in) {
        const int64_t base = o * dim * inner + in;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t d = 0; d < dim; ++d) mx = std::max(mx, static_cast<double>(px[base + d * inner]));
        double sum = 0;
        for (int64_t d = 0; d < dim; ++d) sum += std::exp(static_cast<double>(px[base + d * inner]) - mx);
        for (int64_t d = 0; d < dim; ++d) {
          const double z = static_cast<double>(px[base + d * inner]) - mx;
          py[base + d * inner] = static_cast<T>(log ? z - std::log(sum) : std::exp(z) / sum);
        }
      }
    return Status();
  });
}

}  // namespace

Status ref_OnnxMatMul(KernelCtx& c) {
  Shape a = c.in[0]->shape(), b = c.in[1]->shape();
  const bool a1 = a.size() == 1, b1 = b.size() == 1;
  if (a1) a.insert(a.begin(), 1);
  if (b1) b.push_back(1);
  const int64_t m = a[a.size() - 2], k = a.back(), n = b.back();
  Shape batch = c.out[0].shape();
  if (!b1) batch.pop_back();
  if (!a1) batch.pop_back();
  // Batch strides (in matrices) of each operand, broadcast to `batch`.
  const Shape ab(a.begin(), a.end() - 2), bb(b.begin(), b.end() - 2);
  const Shape sa = broadcast_strides(ab, batch), sb = broadcast_strides(bb, batch);
  return visit_numeric(c.in[0]->dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    const T* pa = c.in[0]->data<T>();
    const T* pb = c.in[1]->data<T>();
    T* py = c.out[0].mut<T>();
    for_each_index<2>(batch, {sa, sb}, [&](int64_t bi, const std::array<int64_t, 2>& off) {
      const T* ma = pa + off[0] * m * k;
      const T* mb = pb + off[1] * k * n;
      T* my = py + bi * m * n;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          Acc<T> s = 0;
          for (int64_t p = 0; p < k; ++p) s += static_cast<Acc<T>>(ma[i * k + p]) * static_cast<Acc<T>>(mb[p * n + j]);
          my[i * n + j] = static_cast<T>(s);
        }
    });
    return Status();
  });
}

Status ref_OnnxGemm(KernelCtx& c) {
  const bool ta = c.node.attr_int("transA", 0) != 0, tb = c.node.attr_int("transB", 0) != 0;
  const double alpha = c.node.attr_float("alpha", 1.0), beta = c.node.attr_float("beta", 1.0);
  const Shape& as = c.in[0]->shape();
  const int64_t m = c.out[0].shape()[0], n = c.out[0].shape()[1], k = ta ? as[0] : as[1];
  const Tensor* cc = c.in.size() > 2 ? c.in[2] : nullptr;
  return visit_numeric(c.in[0]->dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    const T* pa = c.in[0]->data<T>();
    const T* pb = c.in[1]->data<T>();
    T* py = c.out[0].mut<T>();
    Shape cs;
    if (cc != nullptr) cs = broadcast_strides(cc->shape(), {m, n});
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p)
          s +=
              static_cast<double>(pa[ta ? p * m + i : i * k + p]) * static_cast<double>(pb[tb ? j * k + p : p * n + j]);
        s *= alpha;
        if (cc != nullptr) s += beta * static_cast<double>(cc->data<T>()[i * cs[0] + j * cs[1]]);
        py[i * n + j] = static_cast<T>(s);
      }
    return Status();
  });
}

Status ref_OnnxSoftmax(KernelCtx& c) {
  return softmax(c, false);
}
Status ref_OnnxLogSoftmax(KernelCtx& c) {
  return softmax(c, true);
}

Status ref_OnnxLayerNormalization(KernelCtx& c) {
  const Tensor& x = *c.in[0];
  const int64_t axis = norm_axis(c.node.attr_int("axis", -1), x.rank());
  const double eps = c.node.attr_float("epsilon", 1e-5);
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < x.rank(); ++i) (i < axis ? outer : inner) *= x.shape()[static_cast<size_t>(i)];
  const Shape norm(x.shape().begin() + axis, x.shape().end());
  const Tensor* scale = c.in[1];
  const Tensor* bias = c.in.size() > 2 ? c.in[2] : nullptr;
  return visit_float(x.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    // Scale/bias broadcast over the normalized dims: expand their offsets once.
    std::vector<int64_t> so(static_cast<size_t>(inner)), bo(static_cast<size_t>(inner));
    for_each_index<2>(norm,
                      {broadcast_strides(scale->shape(), norm),
                       bias ? broadcast_strides(bias->shape(), norm) : Shape(norm.size(), 0)},
                      [&](int64_t i, const std::array<int64_t, 2>& o) {
                        so[static_cast<size_t>(i)] = o[0];
                        bo[static_cast<size_t>(i)] = o[1];
                      });
    const T* px = x.data<T>();
    T* py = c.out[0].mut<T>();
    for (int64_t r = 0; r < outer; ++r) {
      const T* row = px + r * inner;
      double mean = 0;
      for (int64_t i = 0; i < inner; ++i) mean += static_cast<double>(row[i]);
      mean /= static_cast<double>(std::max<int64_t>(inner, 1));
      double var = 0;
      for (int64_t i = 0; i < inner; ++i)
        var += (static_cast<double>(row[i]) - mean) * (static_cast<double>(row[i]) - mean);
      var /= static_cast<double>(std::max<int64_t>(inner, 1));
      const double inv = 1.0 / std::sqrt(var + eps);
      for (int64_t i = 0; i < inner; ++i) {
        double v = (static_cast<double>(row[i]) - mean) * inv *
                   static_cast<double>(scale->data<T>()[so[static_cast<size_t>(i)]]);
        if (bias != nullptr) v += static_cast<double>(bias->data<T>()[bo[static_cast<size_t>(i)]]);
        py[r * inner + i] = static_cast<T>(v);
      }
      if (c.out.size() > 1) c.out[1].mut<float>()[r] = static_cast<float>(mean);
      if (c.out.size() > 2) c.out[2].mut<float>()[r] = static_cast<float>(inv);
    }
    return Status();
  });
}

// Opset 23: Y = X / sqrt(mean(X^2 over axes [axis, rank)) + epsilon) * scale,
// computed in double.
Status ref_OnnxRMSNormalization(KernelCtx& c) {
  const Tensor& x = *c.in[0];
  const int64_t axis = norm_axis(c.node.attr_int("axis", -1), x.rank());
  const double eps = c.node.attr_float("epsilon", 1e-5);
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < x.rank(); ++i) (i < axis ? outer : inner) *= x.shape()[static_cast<size_t>(i)];
  const Shape norm(x.shape().begin() + axis, x.shape().end());
  const Tensor& scale = *c.in[1];
  return visit_float(x.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    // Scale broadcast over the normalized dims: expand its offsets once.
    std::vector<int64_t> so(static_cast<size_t>(inner));
    for_each_index<1>(norm, {broadcast_strides(scale.shape(), norm)},
                      [&](int64_t i, const std::array<int64_t, 1>& o) { so[static_cast<size_t>(i)] = o[0]; });
    const T* px = x.data<T>();
    const T* ps = scale.data<T>();
    T* py = c.out[0].mut<T>();
    for (int64_t r = 0; r < outer; ++r) {
      const T* row = px + r * inner;
      double ms = 0;
      for (int64_t i = 0; i < inner; ++i) ms += static_cast<double>(row[i]) * static_cast<double>(row[i]);
      ms /= static_cast<double>(std::max<int64_t>(inner, 1));
      const double inv = 1.0 / std::sqrt(ms + eps);
      for (int64_t i = 0; i < inner; ++i)
        py[r * inner + i] =
            static_cast<T>(static_cast<double>(row[i]) * inv * static_cast<double>(ps[so[static_cast<size_t>(i)]]));
    }
    return Status();
  });
}

Status ref_OnnxReduceMean(KernelCtx& c) {
  return reduce(c, Red::kMean);
}
Status ref_OnnxReduceSum(KernelCtx& c) {
  return reduce(c, Red::kSum);
}
Status ref_OnnxReduceMax(KernelCtx& c) {
  return reduce(c, Red::kMax);
}

Status ref_OnnxArgMax(KernelCtx& c) {
  const Tensor& x = *c.in[0];
  const int64_t axis = norm_axis(c.node.attr_int("axis", 0), x.rank());
  const bool last = c.node.attr_int("select_last_index", 0) != 0;
  int64_t outer, dim, inner;
  split_at(x.shape(), axis, outer, dim, inner);
  if (dim == 0) return invalid_argument("ArgMax over an empty axis");
  return visit_numeric(x.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    const T* px = x.data<T>();
    int64_t* py = c.out[0].mut<int64_t>();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t in = 0; in < inner; ++in) {
        const T* p = px + o * dim * inner + in;
        int64_t best = 0;
        for (int64_t d = 1; d < dim; ++d)
          if (p[d * inner] > p[best * inner] || (last && p[d * inner] == p[best * inner])) best = d;
        py[o * inner + in] = best;
      }
    return Status();
  });
}

Status ref_OnnxTopK(KernelCtx& c) {
  const Tensor& x = *c.in[0];
  const int64_t axis = norm_axis(c.node.attr_int("axis", -1), x.rank());
  const bool largest = c.node.attr_int("largest", 1) != 0;
  const int64_t k = c.out[0].shape()[static_cast<size_t>(axis)];
  int64_t outer, dim, inner;
  split_at(x.shape(), axis, outer, dim, inner);
  return visit_numeric(x.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* pv = c.out[0].mut<T>();
    int64_t* pi = c.out[1].mut<int64_t>();
    std::vector<int64_t> idx(static_cast<size_t>(dim));
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t in = 0; in < inner; ++in) {
        const T* p = px + o * dim * inner + in;
        std::iota(idx.begin(), idx.end(), 0);
        // Ties keep the lower index first (ONNX); the sorted order is
        // always produced, which also satisfies sorted=0.
        std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) {
          return largest ? p[a * inner] > p[b * inner] : p[a * inner] < p[b * inner];
        });
        for (int64_t j = 0; j < k; ++j) {
          const int64_t at = o * k * inner + j * inner + in;
          pv[at] = p[idx[static_cast<size_t>(j)] * inner];
          pi[at] = idx[static_cast<size_t>(j)];
        }
      }
    return Status();
  });
}

Status ref_OnnxTrilu(KernelCtx& c) {
  const Tensor& x = *c.in[0];
  const bool upper = c.node.attr_int("upper", 1) != 0;
  const int64_t k = c.in.size() > 1 && c.in[1] != nullptr ? c.in[1]->data<int64_t>()[0] : 0;
  const int64_t rows = x.shape()[static_cast<size_t>(x.rank() - 2)], cols = x.shape().back();
  const size_t es = ir::dtype_size(x.dtype());
  const auto* px = static_cast<const uint8_t*>(x.raw());
  auto* py = static_cast<uint8_t*>(c.out[0].raw_mut());
  const int64_t n = x.numel();
  for (int64_t e = 0; e < n; ++e) {
    const int64_t j = e % cols, i = (e / cols) % std::max<int64_t>(rows, 1);
    const bool keep = upper ? j - i >= k : j - i <= k;
    if (keep)
      std::memcpy(py + e * static_cast<int64_t>(es), px + e * static_cast<int64_t>(es), es);
    else
      std::memset(py + e * static_cast<int64_t>(es), 0, es);
  }
  return Status();
}

}  // namespace k3::onnx_ref
