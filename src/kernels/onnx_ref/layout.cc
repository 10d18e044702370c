// Reference kernels: indexing (Gather*, Scatter*, NonZero), layout
// (Concat, Slice, Split, Reshape, Transpose, ...) and shape arithmetic
// (Shape, Size, Cast, Range, ConstantOfShape). Data movement is done per
// element with memcpy of the element size, so it is dtype-agnostic.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "ir/onnx_shape.h"
#include "kernels/onnx_ref/onnx_ref.h"
#include "util/half.h"

namespace k3::onnx_ref {
namespace {

using ir::DType;
using ir::Tensor;

const uint8_t* bytes(const Tensor& t) {
  return static_cast<const uint8_t*>(t.raw());
}
uint8_t* bytes(Tensor& t) {
  return static_cast<uint8_t*>(t.raw_mut());
}
int64_t esize(const Tensor& t) {
  return static_cast<int64_t>(ir::dtype_size(t.dtype()));
}

Status copy_all(KernelCtx& c) {
  std::memcpy(c.out[0].raw_mut(), c.in[0]->raw(), c.in[0]->nbytes());
  return Status();
}

// Strided copy: out element i (row-major over out shape) comes from input
// element base + sum(idx[d] * strides[d]).
void strided_copy(const Tensor& in, Tensor& out, int64_t base, const Shape& strides) {
  const int64_t es = esize(in);
  const uint8_t* src = bytes(in);
  uint8_t* dst = bytes(out);
  for_each_index<1>(out.shape(), {strides}, [&](int64_t i, const std::array<int64_t, 1>& o) {
    std::memcpy(dst + i * es, src + (base + o[0]) * es, static_cast<size_t>(es));
  });
}

// Element read/write through double or int64 for Cast.
double read_f(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::kF32:
      return t.data<float>()[i];
    case DType::kF64:
      return t.data<double>()[i];
    case DType::kF16:
      return f16_to_f32(t.data<uint16_t>()[i]);
    case DType::kBF16:
      return bf16_to_f32(t.data<uint16_t>()[i]);
    default:
      return 0;
  }
}
int64_t read_i(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::kI32:
      return t.data<int32_t>()[i];
    case DType::kI64:
      return t.data<int64_t>()[i];
    case DType::kI8:
      return t.data<int8_t>()[i];
    case DType::kU8:
      return t.data<uint8_t>()[i];
    case DType::kBool:
      return t.data<uint8_t>()[i] != 0;
    default:
      return 0;
  }
}
template <typename T>
T clamp_to(double v) {
  // Out-of-range float -> int is undefined in C++; saturate (NaN -> 0).
  if (std::isnan(v)) return 0;
  if (v <= static_cast<double>(std::numeric_limits<T>::lowest())) return std::numeric_limits<T>::lowest();
  if (v >= static_cast<double>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
  return static_cast<T>(v);
}
void write_elem(Tensor& t, int64_t i, bool src_float, double f, int64_t n) {
  switch (t.dtype()) {
    case DType::kF32:
      t.mut<float>()[i] = static_cast<float>(src_float ? f : static_cast<double>(n));
      break;
    case DType::kF64:
      t.mut<double>()[i] = src_float ? f : static_cast<double>(n);
      break;
    case DType::kF16:
      t.mut<uint16_t>()[i] = f32_to_f16(static_cast<float>(src_float ? f : static_cast<double>(n)));
      break;
    case DType::kBF16:
      t.mut<uint16_t>()[i] = f32_to_bf16(static_cast<float>(src_float ? f : static_cast<double>(n)));
      break;
    case DType::kI32:
      t.mut<int32_t>()[i] = src_float ? clamp_to<int32_t>(f) : static_cast<int32_t>(n);
      break;
    case DType::kI64:
      t.mut<int64_t>()[i] = src_float ? clamp_to<int64_t>(f) : n;
      break;
    case DType::kI8:
      t.mut<int8_t>()[i] = src_float ? clamp_to<int8_t>(f) : static_cast<int8_t>(n);
      break;
    case DType::kU8:
      t.mut<uint8_t>()[i] = src_float ? clamp_to<uint8_t>(f) : static_cast<uint8_t>(n);
      break;
    case DType::kBool:
      t.mut<uint8_t>()[i] = src_float ? (f != 0) : (n != 0);
      break;
    case DType::kQ8:  // compiler weight formats, never an ONNX tensor
    case DType::kF32P16:
    case DType::kBF16P16:
    case DType::kBF16Dot:
    case DType::kBF16DotT16:
    case DType::kQ8P16:
    case DType::kQ8CP16:
    case DType::kBF16DotP16:
      break;
  }
}

Status cast_to(const Tensor& in, Tensor& out) {
  const bool src_float = ir::dtype_is_float(in.dtype());
  for (int64_t i = 0; i < in.numel(); ++i)
    write_elem(out, i, src_float, src_float ? read_f(in, i) : 0.0, src_float ? 0 : read_i(in, i));
  return Status();
}

template <typename T>
void reduce_into(T& dst, T src, const std::string& red) {
  if (red == "add")
    dst = static_cast<T>(dst + src);
  else if (red == "mul")
    dst = static_cast<T>(dst * src);
  else if (red == "max")
    dst = std::max(dst, src);
  else if (red == "min")
    dst = std::min(dst, src);
  else
    dst = src;
}

std::string reduction_of(const ir::Node& n) {
  const ir::AttrValue* a = n.find_attr("reduction");
  const auto* s = a ? std::get_if<std::string>(a) : nullptr;
  return s ? *s : "none";
}

}  // namespace

Status ref_OnnxGather(KernelCtx& c) {
  const Tensor& data = *c.in[0];
  const int64_t axis = norm_axis(c.node.attr_int("axis", 0), data.rank());
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < data.rank(); ++i)
    if (i != axis) (i < axis ? outer : inner) *= data.shape()[static_cast<size_t>(i)];
  const int64_t dim = data.shape()[static_cast<size_t>(axis)];
  std::vector<int64_t> idx = index_values(*c.in[1]);
  for (auto& i : idx) K3_RETURN_IF_ERROR(norm_index(i, dim));
  const int64_t es = esize(data), block = inner * es;
  const int64_t nidx = static_cast<int64_t>(idx.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < nidx; ++j)
      std::memcpy(bytes(c.out[0]) + (o * nidx + j) * block,
                  bytes(data) + (o * dim + idx[static_cast<size_t>(j)]) * block, static_cast<size_t>(block));
  return Status();
}

namespace {

// GatherElements/ScatterElements: data strides with the axis' zeroed (an
// index replaces that coordinate), the axis' own stride and size, after
// checking that the indices fit the data off the axis.
struct ElementsAxis {
  Shape strides;
  int64_t axis_stride, dim;
};

StatusOr<ElementsAxis> elements_axis(const KernelCtx& c, const char* op) {
  const Tensor& data = *c.in[0];
  const int64_t axis = norm_axis(c.node.attr_int("axis", 0), data.rank());
  const Shape& is = c.in[1]->shape();
  for (size_t d = 0; d < is.size(); ++d)
    if (static_cast<int64_t>(d) != axis && is[d] > data.shape()[d])
      return invalid_argument(std::string(op) + " indices shape exceeds the data shape off the axis");
  ElementsAxis ax{strides_of(data.shape()), 0, data.shape()[static_cast<size_t>(axis)]};
  ax.axis_stride = ax.strides[static_cast<size_t>(axis)];
  ax.strides[static_cast<size_t>(axis)] = 0;
  return ax;
}

}  // namespace

Status ref_OnnxGatherElements(KernelCtx& c) {
  const Tensor& data = *c.in[0];
  const std::vector<int64_t> idx = index_values(*c.in[1]);
  const Shape& is = c.in[1]->shape();
  K3_ASSIGN_OR_RETURN(const ElementsAxis ax, elements_axis(c, "GatherElements"));
  const Shape& ds = ax.strides;
  const int64_t axis_stride = ax.axis_stride, dim = ax.dim;
  const int64_t es = esize(data);
  Status st;
  for_each_index<1>(is, {ds}, [&](int64_t i, const std::array<int64_t, 1>& o) {
    int64_t k = idx[static_cast<size_t>(i)];
    if (!st.ok()) return;
    st = norm_index(k, dim);
    if (st.ok())
      std::memcpy(bytes(c.out[0]) + i * es, bytes(data) + (o[0] + k * axis_stride) * es, static_cast<size_t>(es));
  });
  return st;
}

Status ref_OnnxGatherND(KernelCtx& c) {
  const Tensor& data = *c.in[0];
  const Shape& ds = data.shape();
  const Shape& is = c.in[1]->shape();
  const int64_t b = c.node.attr_int("batch_dims", 0), last = is.back();
  const std::vector<int64_t> idx = index_values(*c.in[1]);
  int64_t batch = 1, per_batch = 1, inner = 1;
  for (int64_t i = 0; i < b; ++i) batch *= is[static_cast<size_t>(i)];
  for (size_t i = static_cast<size_t>(b); i + 1 < is.size(); ++i) per_batch *= is[i];
  for (size_t i = static_cast<size_t>(b + last); i < ds.size(); ++i) inner *= ds[i];
  const Shape dstr = strides_of(ds);
  const int64_t data_batch = b > 0 ? dstr[static_cast<size_t>(b - 1)] : 0;
  const int64_t es = esize(data);
  for (int64_t bi = 0; bi < batch; ++bi)
    for (int64_t q = 0; q < per_batch; ++q) {
      const int64_t* tup = idx.data() + (bi * per_batch + q) * last;
      int64_t off = bi * data_batch;
      for (int64_t j = 0; j < last; ++j) {
        int64_t k = tup[j];
        K3_RETURN_IF_ERROR(norm_index(k, ds[static_cast<size_t>(b + j)]));
        off += k * dstr[static_cast<size_t>(b + j)];
      }
      std::memcpy(bytes(c.out[0]) + (bi * per_batch + q) * inner * es, bytes(data) + off * es,
                  static_cast<size_t>(inner * es));
    }
  return Status();
}

Status ref_OnnxScatterND(KernelCtx& c) {
  K3_RETURN_IF_ERROR(copy_all(c));
  const Shape& ds = c.in[0]->shape();
  const Shape& is = c.in[1]->shape();
  const int64_t last = is.back();
  const std::vector<int64_t> idx = index_values(*c.in[1]);
  int64_t n = 1, inner = 1;
  for (size_t i = 0; i + 1 < is.size(); ++i) n *= is[i];
  for (size_t i = static_cast<size_t>(last); i < ds.size(); ++i) inner *= ds[i];
  const Shape dstr = strides_of(ds);
  const std::string red = reduction_of(c.node);
  return visit_all(c.in[0]->dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    T* out = c.out[0].mut<T>();
    const T* upd = c.in[2]->data<T>();
    for (int64_t u = 0; u < n; ++u) {
      int64_t off = 0;
      for (int64_t j = 0; j < last; ++j) {
        int64_t k = idx[static_cast<size_t>(u * last + j)];
        K3_RETURN_IF_ERROR(norm_index(k, ds[static_cast<size_t>(j)]));
        off += k * dstr[static_cast<size_t>(j)];
      }
      for (int64_t e = 0; e < inner; ++e) reduce_into(out[off + e], upd[u * inner + e], red);
    }
    return Status();
  });
}

Status ref_OnnxScatterElements(KernelCtx& c) {
  K3_RETURN_IF_ERROR(copy_all(c));
  const Tensor& data = *c.in[0];
  const std::vector<int64_t> idx = index_values(*c.in[1]);
  const Shape& is = c.in[1]->shape();
  K3_ASSIGN_OR_RETURN(const ElementsAxis ax, elements_axis(c, "ScatterElements"));
  const Shape& ds = ax.strides;
  const int64_t axis_stride = ax.axis_stride, dim = ax.dim;
  const std::string red = reduction_of(c.node);
  return visit_all(data.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    T* out = c.out[0].mut<T>();
    const T* upd = c.in[2]->data<T>();
    Status st;
    for_each_index<1>(is, {ds}, [&](int64_t i, const std::array<int64_t, 1>& o) {
      int64_t k = idx[static_cast<size_t>(i)];
      if (!st.ok()) return;
      st = norm_index(k, dim);
      if (st.ok()) reduce_into(out[o[0] + k * axis_stride], upd[i], red);
    });
    return st;
  });
}

Status ref_OnnxNonZero(KernelCtx& c) {
  const Tensor& x = *c.in[0];
  const int64_t n = x.numel(), r = x.rank();
  std::vector<int64_t> hits;
  K3_RETURN_IF_ERROR(visit_all(x.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    for (int64_t i = 0; i < n; ++i)
      if (x.data<T>()[i] != T(0)) hits.push_back(i);
    return Status();
  }));
  const int64_t cnt = static_cast<int64_t>(hits.size());
  auto t = Tensor::zeros(DType::kI64, {r, cnt});
  if (!t) return out_of_range("NonZero output too large");
  const Shape st = strides_of(x.shape());
  for (int64_t j = 0; j < cnt; ++j)
    for (int64_t d = 0; d < r; ++d)
      t->mut<int64_t>()[d * cnt + j] =
          (hits[static_cast<size_t>(j)] / st[static_cast<size_t>(d)]) % x.shape()[static_cast<size_t>(d)];
  c.out[0] = std::move(*t);
  return Status();
}

Status ref_OnnxConcat(KernelCtx& c) {
  const int64_t r = c.out[0].rank();
  const int64_t axis = norm_axis(c.node.attr_int("axis", 0), r);
  int64_t outer = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= c.out[0].shape()[static_cast<size_t>(i)];
  const int64_t es = esize(c.out[0]);
  const int64_t out_row = outer > 0 ? static_cast<int64_t>(c.out[0].nbytes()) / outer : 0;
  int64_t at = 0;
  for (const Tensor* t : c.in) {
    const int64_t row = outer > 0 ? static_cast<int64_t>(t->nbytes()) / outer : 0;
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(bytes(c.out[0]) + o * out_row + at, bytes(*t) + o * row, static_cast<size_t>(row));
    at += row;
  }
  (void)es;
  return Status();
}

Status ref_OnnxSlice(KernelCtx& c) {
  const Tensor& x = *c.in[0];
  const int64_t r = x.rank();
  std::vector<int64_t> starts, ends, axes, steps;
  if (const auto* s = c.node.attr_ints("starts")) {
    starts = *s;
    ends = *c.node.attr_ints("ends");
    if (const auto* a = c.node.attr_ints("axes")) axes = *a;
  } else {
    starts = index_values(*c.in[1]);
    ends = index_values(*c.in[2]);
    if (c.in.size() > 3 && c.in[3] != nullptr) axes = index_values(*c.in[3]);
    if (c.in.size() > 4 && c.in[4] != nullptr) steps = index_values(*c.in[4]);
  }
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  const Shape xs = strides_of(x.shape());
  Shape strides = xs;
  int64_t base = 0;
  for (size_t i = 0; i < starts.size(); ++i) {
    const int64_t a = norm_axis(axes[i], r), step = steps.empty() ? 1 : steps[i];
    int64_t first = 0, count = 0;
    ir::slice_bounds(x.shape()[static_cast<size_t>(a)], starts[i], ends[i], step, first, count);
    if (count > 0) base += first * xs[static_cast<size_t>(a)];
    strides[static_cast<size_t>(a)] = xs[static_cast<size_t>(a)] * step;
  }
  strided_copy(x, c.out[0], base, strides);
  return Status();
}

Status ref_OnnxSplit(KernelCtx& c) {
  const Tensor& x = *c.in[0];
  const int64_t axis = norm_axis(c.node.attr_int("axis", 0), x.rank());
  int64_t outer = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= x.shape()[static_cast<size_t>(i)];
  const int64_t row = outer > 0 ? static_cast<int64_t>(x.nbytes()) / outer : 0;
  int64_t at = 0;
  for (Tensor& t : c.out) {
    const int64_t part = outer > 0 ? static_cast<int64_t>(t.nbytes()) / outer : 0;
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(bytes(t) + o * part, bytes(x) + o * row + at, static_cast<size_t>(part));
    at += part;
  }
  return Status();
}

Status ref_OnnxReshape(KernelCtx& c) {
  return copy_all(c);
}
Status ref_OnnxUnsqueeze(KernelCtx& c) {
  return copy_all(c);
}
Status ref_OnnxSqueeze(KernelCtx& c) {
  return copy_all(c);
}
Status ref_OnnxFlatten(KernelCtx& c) {
  return copy_all(c);
}

Status ref_OnnxTranspose(KernelCtx& c) {
  const Tensor& x = *c.in[0];
  const int64_t r = x.rank();
  std::vector<int64_t> perm;
  if (const auto* p = c.node.attr_ints("perm"))
    perm = *p;
  else
    for (int64_t i = r - 1; i >= 0; --i) perm.push_back(i);
  const Shape xs = strides_of(x.shape());
  Shape strides(static_cast<size_t>(r));
  for (int64_t d = 0; d < r; ++d)
    strides[static_cast<size_t>(d)] = xs[static_cast<size_t>(perm[static_cast<size_t>(d)])];
  strided_copy(x, c.out[0], 0, strides);
  return Status();
}

Status ref_OnnxExpand(KernelCtx& c) {
  strided_copy(*c.in[0], c.out[0], 0, broadcast_strides(c.in[0]->shape(), c.out[0].shape()));
  return Status();
}

Status ref_OnnxTile(KernelCtx& c) {
  const Tensor& x = *c.in[0];
  const Shape& os = c.out[0].shape();
  const Shape xs = strides_of(x.shape()), ost = strides_of(os);
  const int64_t es = esize(x), n = c.out[0].numel();
  for (int64_t i = 0; i < n; ++i) {
    int64_t src = 0;
    for (size_t d = 0; d < os.size(); ++d) src += ((i / ost[d]) % os[d]) % x.shape()[d] * xs[d];
    std::memcpy(bytes(c.out[0]) + i * es, bytes(x) + src * es, static_cast<size_t>(es));
  }
  return Status();
}

Status ref_OnnxShape(KernelCtx& c) {
  const int64_t r = c.in[0]->rank();
  int64_t st = c.node.attr_int("start", 0);
  if (st < 0) st += r;
  st = std::clamp<int64_t>(st, 0, r);
  for (int64_t i = 0; i < c.out[0].numel(); ++i)
    c.out[0].mut<int64_t>()[i] = c.in[0]->shape()[static_cast<size_t>(st + i)];
  return Status();
}

Status ref_OnnxSize(KernelCtx& c) {
  c.out[0].mut<int64_t>()[0] = c.in[0]->numel();
  return Status();
}

Status ref_OnnxCast(KernelCtx& c) {
  return cast_to(*c.in[0], c.out[0]);
}
Status ref_OnnxCastLike(KernelCtx& c) {
  return cast_to(*c.in[0], c.out[0]);
}

Status ref_OnnxRange(KernelCtx& c) {
  return visit_numeric(c.in[0]->dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    const T start = c.in[0]->data<T>()[0], delta = c.in[2]->data<T>()[0];
    T* y = c.out[0].mut<T>();
    for (int64_t i = 0; i < c.out[0].numel(); ++i) y[i] = static_cast<T>(start + static_cast<T>(i) * delta);
    return Status();
  });
}

Status ref_OnnxConstantOfShape(KernelCtx& c) {
  Tensor& y = c.out[0];
  const ir::AttrValue* v = c.node.find_attr("value");
  const bool is_float = v != nullptr && std::holds_alternative<double>(*v);
  const double f = is_float ? std::get<double>(*v) : 0.0;
  const int64_t n = v != nullptr && std::holds_alternative<int64_t>(*v) ? std::get<int64_t>(*v) : 0;
  for (int64_t i = 0; i < y.numel(); ++i) write_elem(y, i, is_float, f, n);
  return Status();
}

}  // namespace k3::onnx_ref
