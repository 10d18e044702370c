// Shape and dtype rules of the onnx.* ops, one function per op of
// ir/onnx_op_table.h (see onnx_shape.h for how they are used).
//
// Rules validate what the kernels rely on (input counts, dtypes that must
// match, ranks, axes in range, perm a permutation, broadcastable shapes) so
// that a bad model is rejected at import with a message naming the problem,
// and the interpreter's kernels only check data-dependent things (indices).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "ir/onnx_shape.h"
#include "util/checked.h"

namespace k3::ir {
namespace {

using Outs = std::vector<OutType>;
using Shape = std::vector<int64_t>;
using In = std::span<const OnnxInput>;
constexpr int64_t kU = kUnknownDim;

OutType out_type(DType t, Shape s) {
  return OutType{t, std::move(s), RowDim::kFixed};
}

std::string str(const Shape& s) {
  return shape_to_string(s);
}
int64_t rank(const OnnxInput& i) {
  return static_cast<int64_t>(i.shape.size());
}

Status count(In in, size_t lo, size_t hi) {
  if (in.size() < lo || in.size() > hi || (lo > 0 && !in[0].present)) {
    std::string want = lo == hi ? std::to_string(lo) : std::to_string(lo) + ".." + std::to_string(hi);
    return invalid_argument("expects " + want + " inputs, got " + std::to_string(in.size()));
  }
  for (size_t i = 0; i < lo; ++i)
    if (!in[i].present) return invalid_argument("required input " + std::to_string(i) + " is missing");
  return Status();
}
bool has(In in, size_t i) {
  return in.size() > i && in[i].present;
}

Status same_dtype(const OnnxInput& a, const OnnxInput& b) {
  if (a.dtype != b.dtype)
    return invalid_argument("input dtypes differ: " + std::string(dtype_name(a.dtype)) + " vs " +
                            std::string(dtype_name(b.dtype)));
  return Status();
}
Status want_dtype(const OnnxInput& a, bool ok, const char* what) {
  if (!ok) return invalid_argument(std::string(what) + " cannot be " + std::string(dtype_name(a.dtype)));
  return Status();
}
bool is_index(DType t) {
  return t == DType::kI32 || t == DType::kI64;
}
bool is_numeric(DType t) {
  return t != DType::kBool;
}

bool known(const Shape& s) {
  for (int64_t d : s)
    if (d < 0) return false;
  return true;
}

// Values of an integer input (i32/i64/u8/i8/bool) when known.
std::optional<std::vector<int64_t>> ints(const OnnxInput& in) {
  if (!in.present || in.data == nullptr || !known(in.shape)) return std::nullopt;
  auto n = checked_numel_bytes(in.shape, 1);
  if (!n || *n > (uint64_t{1} << 24)) return std::nullopt;
  std::vector<int64_t> v(*n);
  for (size_t i = 0; i < v.size(); ++i) {
    switch (in.dtype) {
      case DType::kI64:
        std::memcpy(&v[i], static_cast<const char*>(in.data) + 8 * i, 8);
        break;
      case DType::kI32: {
        int32_t x;
        std::memcpy(&x, static_cast<const char*>(in.data) + 4 * i, 4);
        v[i] = x;
        break;
      }
      case DType::kI8:
        v[i] = static_cast<const int8_t*>(in.data)[i];
        break;
      case DType::kU8:
      case DType::kBool:
        v[i] = static_cast<const uint8_t*>(in.data)[i];
        break;
      default:
        return std::nullopt;
    }
  }
  return v;
}

// A one-element numeric input as double, when known.
std::optional<double> scalar(const OnnxInput& in) {
  if (!in.present || in.data == nullptr || !known(in.shape)) return std::nullopt;
  if (checked_numel_bytes(in.shape, 1).value_or(0) != 1) return std::nullopt;
  const void* p = in.data;
  switch (in.dtype) {
    case DType::kF32:
      return *static_cast<const float*>(p);
    case DType::kF64:
      return *static_cast<const double*>(p);
    case DType::kI32:
      return *static_cast<const int32_t*>(p);
    case DType::kI64:
      return static_cast<double>(*static_cast<const int64_t*>(p));
    case DType::kI8:
      return *static_cast<const int8_t*>(p);
    case DType::kU8:
      return *static_cast<const uint8_t*>(p);
    default:
      return std::nullopt;
  }
}

// Normalizes a possibly negative axis into [0, r); `r` is the rank.
Status norm_axis(int64_t axis, int64_t r, int64_t& out, const char* what = "axis") {
  if (axis < -r || axis >= r)
    return invalid_argument(std::string(what) + " " + std::to_string(axis) + " is out of range for rank " +
                            std::to_string(r));
  out = axis < 0 ? axis + r : axis;
  return Status();
}

// Distinct normalized axes.
Status norm_axes(const std::vector<int64_t>& axes, int64_t r, std::vector<int64_t>& out) {
  out.clear();
  for (int64_t a : axes) {
    int64_t x = 0;
    K3_RETURN_IF_ERROR(norm_axis(a, r, x, "axes entry"));
    if (std::find(out.begin(), out.end(), x) != out.end())
      return invalid_argument("axes repeat axis " + std::to_string(x));
    out.push_back(x);
  }
  return Status();
}

// axes from the attribute (older opsets) or input `idx` (newer); nullopt
// when given as an input whose values are unknown; `given` says whether any.
Status axes_of(const Node& n, In in, size_t idx, std::optional<std::vector<int64_t>>& axes, bool& given) {
  given = false;
  axes.reset();
  if (const auto* a = n.attr_ints("axes")) {
    given = true;
    axes = *a;
    return Status();
  }
  if (has(in, idx)) {
    if (!is_index(in[idx].dtype)) return invalid_argument("axes must be int64");
    given = true;
    axes = ints(in[idx]);
  }
  return Status();
}

StatusOr<Shape> bcast(const Shape& a, const Shape& b) {
  return broadcast_shapes(a, b);
}

// Numpy-style matmul result shape.
StatusOr<Shape> matmul_shape(Shape a, Shape b) {
  if (a.empty() || b.empty()) return invalid_argument("MatMul inputs must have rank >= 1");
  const bool a1 = a.size() == 1, b1 = b.size() == 1;
  if (a1) a.insert(a.begin(), 1);
  if (b1) b.push_back(1);
  const int64_t k1 = a.back(), k2 = b[b.size() - 2];
  if (k1 >= 0 && k2 >= 0 && k1 != k2) return invalid_argument("MatMul inner dims differ: " + str(a) + " x " + str(b));
  Shape ba(a.begin(), a.end() - 2), bb(b.begin(), b.end() - 2);
  auto batch = bcast(ba, bb);
  if (!batch.ok()) return batch.status();
  Shape out = *batch;
  if (!a1) out.push_back(a[a.size() - 2]);
  if (!b1) out.push_back(b.back());
  return out;
}

// ---- Elementwise ----

Status binary(In in, Outs& out, bool same_type = true) {
  K3_RETURN_IF_ERROR(count(in, 2, 2));
  if (same_type) K3_RETURN_IF_ERROR(same_dtype(in[0], in[1]));
  K3_RETURN_IF_ERROR(want_dtype(in[0], is_numeric(in[0].dtype), "input"));
  K3_ASSIGN_OR_RETURN(Shape s, bcast(in[0].shape, in[1].shape));
  out.push_back(out_type(in[0].dtype, std::move(s)));
  return Status();
}

Status variadic(In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 1, 64));
  Shape s = in[0].shape;
  for (size_t i = 1; i < in.size(); ++i) {
    if (!in[i].present) return invalid_argument("input " + std::to_string(i) + " is missing");
    K3_RETURN_IF_ERROR(same_dtype(in[0], in[i]));
    K3_ASSIGN_OR_RETURN(s, bcast(s, in[i].shape));
  }
  K3_RETURN_IF_ERROR(want_dtype(in[0], is_numeric(in[0].dtype), "input"));
  out.push_back(out_type(in[0].dtype, std::move(s)));
  return Status();
}

Status unary(In in, Outs& out, bool float_only) {
  K3_RETURN_IF_ERROR(count(in, 1, 1));
  K3_RETURN_IF_ERROR(want_dtype(in[0], float_only ? dtype_is_float(in[0].dtype) : is_numeric(in[0].dtype), "input"));
  out.push_back(out_type(in[0].dtype, in[0].shape));
  return Status();
}

Status compare(In in, Outs& out, bool logic) {
  K3_RETURN_IF_ERROR(count(in, 2, 2));
  K3_RETURN_IF_ERROR(same_dtype(in[0], in[1]));
  if (logic) K3_RETURN_IF_ERROR(want_dtype(in[0], in[0].dtype == DType::kBool, "input"));
  K3_ASSIGN_OR_RETURN(Shape s, bcast(in[0].shape, in[1].shape));
  out.push_back(out_type(DType::kBool, std::move(s)));
  return Status();
}

Status infer_OnnxAdd(const Node&, In in, Outs& out) {
  return binary(in, out);
}
Status infer_OnnxSub(const Node&, In in, Outs& out) {
  return binary(in, out);
}
Status infer_OnnxMul(const Node&, In in, Outs& out) {
  return binary(in, out);
}
Status infer_OnnxDiv(const Node&, In in, Outs& out) {
  return binary(in, out);
}
Status infer_OnnxPow(const Node&, In in, Outs& out) {
  K3_RETURN_IF_ERROR(binary(in, out, /*same_type=*/false));
  return want_dtype(in[1], is_numeric(in[1].dtype), "exponent");
}
Status infer_OnnxMod(const Node& n, In in, Outs& out) {
  K3_RETURN_IF_ERROR(binary(in, out));
  if (dtype_is_float(in[0].dtype) && n.attr_int("fmod", 0) != 1)
    return invalid_argument("Mod of floating-point inputs needs fmod=1");
  return Status();
}
Status infer_OnnxMax(const Node&, In in, Outs& out) {
  return variadic(in, out);
}
Status infer_OnnxMin(const Node&, In in, Outs& out) {
  return variadic(in, out);
}
Status infer_OnnxSqrt(const Node&, In in, Outs& out) {
  return unary(in, out, true);
}
Status infer_OnnxReciprocal(const Node&, In in, Outs& out) {
  return unary(in, out, true);
}
Status infer_OnnxNeg(const Node&, In in, Outs& out) {
  return unary(in, out, false);
}
Status infer_OnnxAbs(const Node&, In in, Outs& out) {
  return unary(in, out, false);
}
Status infer_OnnxExp(const Node&, In in, Outs& out) {
  return unary(in, out, true);
}
Status infer_OnnxLog(const Node&, In in, Outs& out) {
  return unary(in, out, true);
}
Status infer_OnnxErf(const Node&, In in, Outs& out) {
  return unary(in, out, true);
}
Status infer_OnnxTanh(const Node&, In in, Outs& out) {
  return unary(in, out, true);
}
Status infer_OnnxSigmoid(const Node&, In in, Outs& out) {
  return unary(in, out, true);
}
Status infer_OnnxRelu(const Node&, In in, Outs& out) {
  return unary(in, out, false);
}
Status infer_OnnxGelu(const Node& n, In in, Outs& out) {
  const AttrValue* a = n.find_attr("approximate");
  if (a != nullptr) {
    const auto* s = std::get_if<std::string>(a);
    if (s == nullptr || (*s != "none" && *s != "tanh"))
      return invalid_argument("Gelu attribute approximate must be \"none\" or \"tanh\"");
  }
  return unary(in, out, true);
}
Status infer_OnnxCos(const Node&, In in, Outs& out) {
  return unary(in, out, true);
}
Status infer_OnnxSin(const Node&, In in, Outs& out) {
  return unary(in, out, true);
}
Status infer_OnnxFloor(const Node&, In in, Outs& out) {
  return unary(in, out, true);
}
Status infer_OnnxCeil(const Node&, In in, Outs& out) {
  return unary(in, out, true);
}
Status infer_OnnxClip(const Node&, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 1, 3));
  for (size_t i = 1; i < in.size(); ++i) {
    if (!in[i].present) continue;
    K3_RETURN_IF_ERROR(same_dtype(in[0], in[i]));
    if (!known(in[i].shape) || checked_numel_bytes(in[i].shape, 1).value_or(0) != 1)
      return invalid_argument("Clip min/max must be scalars");
  }
  return unary(in.subspan(0, 1), out, false);
}

Status infer_OnnxEqual(const Node&, In in, Outs& out) {
  return compare(in, out, false);
}
Status infer_OnnxLess(const Node&, In in, Outs& out) {
  return compare(in, out, false);
}
Status infer_OnnxLessOrEqual(const Node&, In in, Outs& out) {
  return compare(in, out, false);
}
Status infer_OnnxGreater(const Node&, In in, Outs& out) {
  return compare(in, out, false);
}
Status infer_OnnxGreaterOrEqual(const Node&, In in, Outs& out) {
  return compare(in, out, false);
}
Status infer_OnnxAnd(const Node&, In in, Outs& out) {
  return compare(in, out, true);
}
Status infer_OnnxOr(const Node&, In in, Outs& out) {
  return compare(in, out, true);
}
Status infer_OnnxNot(const Node&, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 1, 1));
  K3_RETURN_IF_ERROR(want_dtype(in[0], in[0].dtype == DType::kBool, "input"));
  out.push_back(out_type(DType::kBool, in[0].shape));
  return Status();
}
Status infer_OnnxWhere(const Node&, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 3, 3));
  K3_RETURN_IF_ERROR(want_dtype(in[0], in[0].dtype == DType::kBool, "condition"));
  K3_RETURN_IF_ERROR(same_dtype(in[1], in[2]));
  K3_ASSIGN_OR_RETURN(Shape s, bcast(in[0].shape, in[1].shape));
  K3_ASSIGN_OR_RETURN(s, bcast(s, in[2].shape));
  out.push_back(out_type(in[1].dtype, std::move(s)));
  return Status();
}

// ---- Linear algebra, normalization, reductions ----

Status infer_OnnxMatMul(const Node&, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 2, 2));
  K3_RETURN_IF_ERROR(same_dtype(in[0], in[1]));
  K3_RETURN_IF_ERROR(want_dtype(in[0], is_numeric(in[0].dtype), "input"));
  K3_ASSIGN_OR_RETURN(Shape s, matmul_shape(in[0].shape, in[1].shape));
  out.push_back(out_type(in[0].dtype, std::move(s)));
  return Status();
}

Status infer_OnnxGemm(const Node& n, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 2, 3));
  K3_RETURN_IF_ERROR(same_dtype(in[0], in[1]));
  K3_RETURN_IF_ERROR(want_dtype(in[0], is_numeric(in[0].dtype), "input"));
  if (rank(in[0]) != 2 || rank(in[1]) != 2)
    return invalid_argument("Gemm inputs must be 2-D, got " + str(in[0].shape) + " and " + str(in[1].shape));
  const bool ta = n.attr_int("transA", 0) != 0, tb = n.attr_int("transB", 0) != 0;
  const int64_t m = in[0].shape[ta ? 1 : 0], k1 = in[0].shape[ta ? 0 : 1];
  const int64_t k2 = in[1].shape[tb ? 1 : 0], nn = in[1].shape[tb ? 0 : 1];
  if (k1 >= 0 && k2 >= 0 && k1 != k2) return invalid_argument("Gemm inner dims differ");
  if (has(in, 2)) {
    K3_RETURN_IF_ERROR(same_dtype(in[0], in[2]));
    K3_ASSIGN_OR_RETURN(Shape s, bcast(in[2].shape, {m, nn}));
    if (s.size() != 2 || (s[0] >= 0 && m >= 0 && s[0] != m) || (s[1] >= 0 && nn >= 0 && s[1] != nn))
      return invalid_argument("Gemm C " + str(in[2].shape) + " does not broadcast to the result");
  }
  out.push_back(out_type(in[0].dtype, {m, nn}));
  return Status();
}

Status softmax_like(const Node& n, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 1, 1));
  K3_RETURN_IF_ERROR(want_dtype(in[0], dtype_is_float(in[0].dtype), "input"));
  int64_t axis = 0;
  K3_RETURN_IF_ERROR(norm_axis(n.attr_int("axis", -1), rank(in[0]), axis));
  out.push_back(out_type(in[0].dtype, in[0].shape));
  return Status();
}
Status infer_OnnxSoftmax(const Node& n, In in, Outs& out) {
  return softmax_like(n, in, out);
}
Status infer_OnnxLogSoftmax(const Node& n, In in, Outs& out) {
  return softmax_like(n, in, out);
}

Status infer_OnnxLayerNormalization(const Node& n, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 2, 3));
  const OnnxInput& x = in[0];
  K3_RETURN_IF_ERROR(want_dtype(x, dtype_is_float(x.dtype), "input"));
  int64_t axis = 0;
  K3_RETURN_IF_ERROR(norm_axis(n.attr_int("axis", -1), rank(x), axis));
  Shape norm_shape(x.shape.begin() + axis, x.shape.end());
  for (size_t i = 1; i < in.size(); ++i) {
    if (!in[i].present) continue;
    K3_RETURN_IF_ERROR(same_dtype(x, in[i]));
    K3_ASSIGN_OR_RETURN(Shape s, bcast(norm_shape, in[i].shape));
    if (s.size() != norm_shape.size())
      return invalid_argument("LayerNormalization scale/bias rank exceeds the normalized dims");
  }
  Shape stat = x.shape;
  for (size_t d = static_cast<size_t>(axis); d < stat.size(); ++d) stat[d] = 1;
  // stash_type 1 (float) is what every exporter writes; stats are f32.
  out.push_back(out_type(x.dtype, x.shape));
  out.push_back(out_type(DType::kF32, stat));
  out.push_back(out_type(DType::kF32, stat));
  return Status();
}

// Opset 23: Y = X / sqrt(mean(X^2 over axes [axis, rank)) + epsilon) * scale.
Status infer_OnnxRMSNormalization(const Node& n, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 2, 2));
  const OnnxInput& x = in[0];
  K3_RETURN_IF_ERROR(want_dtype(x, dtype_is_float(x.dtype), "input"));
  int64_t axis = 0;
  K3_RETURN_IF_ERROR(norm_axis(n.attr_int("axis", -1), rank(x), axis));
  if (n.attr_int("stash_type", 1) != 1) return unimplemented("RMSNormalization stash_type other than 1 (float)");
  const Shape norm_shape(x.shape.begin() + axis, x.shape.end());
  K3_RETURN_IF_ERROR(same_dtype(x, in[1]));
  K3_ASSIGN_OR_RETURN(Shape s, bcast(norm_shape, in[1].shape));
  if (s.size() != norm_shape.size()) return invalid_argument("RMSNormalization scale rank exceeds the normalized dims");
  out.push_back(out_type(x.dtype, x.shape));
  return Status();
}

Status reduce(const Node& n, In in, Outs& out, bool numeric_only) {
  K3_RETURN_IF_ERROR(count(in, 1, 2));
  K3_RETURN_IF_ERROR(want_dtype(in[0], is_numeric(in[0].dtype), "input"));
  std::optional<std::vector<int64_t>> axes;
  bool given = false;
  K3_RETURN_IF_ERROR(axes_of(n, in, 1, axes, given));
  const bool keep = n.attr_int("keepdims", 1) != 0;
  const int64_t r = rank(in[0]);
  if (given && !axes) {
    if (!keep) return invalid_argument("reduction axes must be known at compile time when keepdims=0");
    out.push_back(out_type(in[0].dtype, Shape(static_cast<size_t>(r), kU)));
    return Status();
  }
  std::vector<int64_t> ax;
  if (!given || axes->empty()) {
    if (n.attr_int("noop_with_empty_axes", 0) != 0) {
      out.push_back(out_type(in[0].dtype, in[0].shape));
      return Status();
    }
    for (int64_t i = 0; i < r; ++i) ax.push_back(i);
  } else {
    K3_RETURN_IF_ERROR(norm_axes(*axes, r, ax));
  }
  Shape s;
  for (int64_t i = 0; i < r; ++i) {
    const bool red = std::find(ax.begin(), ax.end(), i) != ax.end();
    if (!red)
      s.push_back(in[0].shape[static_cast<size_t>(i)]);
    else if (keep)
      s.push_back(1);
  }
  out.push_back(out_type(in[0].dtype, std::move(s)));
  return Status();
}
Status infer_OnnxReduceMean(const Node& n, In in, Outs& out) {
  return reduce(n, in, out, true);
}
Status infer_OnnxReduceSum(const Node& n, In in, Outs& out) {
  return reduce(n, in, out, true);
}
Status infer_OnnxReduceMax(const Node& n, In in, Outs& out) {
  return reduce(n, in, out, true);
}

Status infer_OnnxArgMax(const Node& n, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 1, 1));
  K3_RETURN_IF_ERROR(want_dtype(in[0], is_numeric(in[0].dtype), "input"));
  int64_t axis = 0;
  K3_RETURN_IF_ERROR(norm_axis(n.attr_int("axis", 0), rank(in[0]), axis));
  Shape s = in[0].shape;
  if (n.attr_int("keepdims", 1) != 0)
    s[static_cast<size_t>(axis)] = 1;
  else
    s.erase(s.begin() + axis);
  out.push_back(out_type(DType::kI64, std::move(s)));
  return Status();
}

Status infer_OnnxTopK(const Node& n, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 2, 2));
  K3_RETURN_IF_ERROR(want_dtype(in[0], is_numeric(in[0].dtype), "input"));
  if (in[1].dtype != DType::kI64) return invalid_argument("TopK k must be int64");
  int64_t axis = 0;
  K3_RETURN_IF_ERROR(norm_axis(n.attr_int("axis", -1), rank(in[0]), axis));
  Shape s = in[0].shape;
  int64_t k = kU;
  if (auto v = ints(in[1])) {
    if (v->size() != 1) return invalid_argument("TopK k must have one element");
    k = (*v)[0];
    const int64_t d = s[static_cast<size_t>(axis)];
    if (k < 0 || (d >= 0 && k > d))
      return invalid_argument("TopK k=" + std::to_string(k) + " is outside [0, " + std::to_string(d) + "]");
  }
  s[static_cast<size_t>(axis)] = k;
  out.push_back(out_type(in[0].dtype, s));
  out.push_back(out_type(DType::kI64, s));
  return Status();
}

Status infer_OnnxTrilu(const Node&, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 1, 2));
  if (rank(in[0]) < 2) return invalid_argument("Trilu input must have rank >= 2");
  if (has(in, 1) && in[1].dtype != DType::kI64) return invalid_argument("Trilu k must be int64");
  out.push_back(out_type(in[0].dtype, in[0].shape));
  return Status();
}

// ---- Indexing ----

Status infer_OnnxGather(const Node& n, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 2, 2));
  if (!is_index(in[1].dtype)) return invalid_argument("Gather indices must be int32 or int64");
  int64_t axis = 0;
  K3_RETURN_IF_ERROR(norm_axis(n.attr_int("axis", 0), rank(in[0]), axis));
  Shape s(in[0].shape.begin(), in[0].shape.begin() + axis);
  s.insert(s.end(), in[1].shape.begin(), in[1].shape.end());
  s.insert(s.end(), in[0].shape.begin() + axis + 1, in[0].shape.end());
  out.push_back(out_type(in[0].dtype, std::move(s)));
  return Status();
}

Status infer_OnnxGatherElements(const Node& n, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 2, 2));
  if (!is_index(in[1].dtype)) return invalid_argument("GatherElements indices must be int32 or int64");
  if (rank(in[0]) != rank(in[1]) || rank(in[0]) == 0)
    return invalid_argument("GatherElements data and indices ranks differ");
  int64_t axis = 0;
  K3_RETURN_IF_ERROR(norm_axis(n.attr_int("axis", 0), rank(in[0]), axis));
  out.push_back(out_type(in[0].dtype, in[1].shape));
  return Status();
}

Status infer_OnnxGatherND(const Node& n, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 2, 2));
  if (in[1].dtype != DType::kI64) return invalid_argument("GatherND indices must be int64");
  const int64_t b = n.attr_int("batch_dims", 0);
  const int64_t r = rank(in[0]), q = rank(in[1]);
  if (r < 1 || q < 1 || b < 0 || b >= std::min(r, q))
    return invalid_argument("GatherND ranks or batch_dims are invalid");
  const int64_t last = in[1].shape.back();
  if (last < 0) return invalid_argument("GatherND index depth (last indices dim) must be known");
  if (last < 1 || last > r - b)
    return invalid_argument("GatherND index depth " + std::to_string(last) + " is out of range");
  for (int64_t i = 0; i < b; ++i) {
    const int64_t x = in[0].shape[static_cast<size_t>(i)], y = in[1].shape[static_cast<size_t>(i)];
    if (x >= 0 && y >= 0 && x != y) return invalid_argument("GatherND batch dims differ");
  }
  Shape s(in[1].shape.begin(), in[1].shape.end() - 1);
  s.insert(s.end(), in[0].shape.begin() + b + last, in[0].shape.end());
  out.push_back(out_type(in[0].dtype, std::move(s)));
  return Status();
}

Status reduction_attr(const Node& n) {
  const AttrValue* a = n.find_attr("reduction");
  if (a == nullptr) return Status();
  const auto* s = std::get_if<std::string>(a);
  if (s == nullptr || (*s != "none" && *s != "add" && *s != "mul" && *s != "max" && *s != "min"))
    return invalid_argument("attribute reduction must be none, add, mul, max or min");
  return Status();
}

Status infer_OnnxScatterND(const Node& n, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 3, 3));
  K3_RETURN_IF_ERROR(reduction_attr(n));
  if (in[1].dtype != DType::kI64) return invalid_argument("ScatterND indices must be int64");
  K3_RETURN_IF_ERROR(same_dtype(in[0], in[2]));
  const int64_t r = rank(in[0]), q = rank(in[1]);
  if (r < 1 || q < 1) return invalid_argument("ScatterND data and indices need rank >= 1");
  const int64_t last = in[1].shape.back();
  if (last >= 0) {
    if (last > r) return invalid_argument("ScatterND index depth exceeds the data rank");
    // updates shape = indices.shape[:-1] + data.shape[last:]
    Shape want(in[1].shape.begin(), in[1].shape.end() - 1);
    want.insert(want.end(), in[0].shape.begin() + last, in[0].shape.end());
    if (want.size() != in[2].shape.size())
      return invalid_argument("ScatterND updates have shape " + str(in[2].shape) + ", expected " + str(want));
    for (size_t i = 0; i < want.size(); ++i)
      if (want[i] >= 0 && in[2].shape[i] >= 0 && want[i] != in[2].shape[i])
        return invalid_argument("ScatterND updates have shape " + str(in[2].shape) + ", expected " + str(want));
  }
  out.push_back(out_type(in[0].dtype, in[0].shape));
  return Status();
}

Status infer_OnnxScatterElements(const Node& n, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 3, 3));
  K3_RETURN_IF_ERROR(reduction_attr(n));
  if (!is_index(in[1].dtype)) return invalid_argument("ScatterElements indices must be int32 or int64");
  K3_RETURN_IF_ERROR(same_dtype(in[0], in[2]));
  if (rank(in[0]) != rank(in[1]) || in[1].shape.size() != in[2].shape.size() || rank(in[0]) == 0)
    return invalid_argument("ScatterElements data, indices and updates ranks differ");
  for (size_t i = 0; i < in[1].shape.size(); ++i)
    if (in[1].shape[i] >= 0 && in[2].shape[i] >= 0 && in[1].shape[i] != in[2].shape[i])
      return invalid_argument("ScatterElements indices and updates shapes differ");
  int64_t axis = 0;
  K3_RETURN_IF_ERROR(norm_axis(n.attr_int("axis", 0), rank(in[0]), axis));
  out.push_back(out_type(in[0].dtype, in[0].shape));
  return Status();
}

Status infer_OnnxNonZero(const Node&, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 1, 1));
  // The count of non-zeros is data dependent: always unknown here; the
  // interpreter's kernel sizes the output itself.
  out.push_back(out_type(DType::kI64, {rank(in[0]), kU}));
  return Status();
}

// ---- Layout and shape arithmetic ----

Status infer_OnnxConcat(const Node& n, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 1, 4096));
  const int64_t r = rank(in[0]);
  int64_t axis = 0;
  K3_RETURN_IF_ERROR(norm_axis(n.attr_int("axis", 0), r, axis));
  Shape s = in[0].shape;
  for (size_t i = 1; i < in.size(); ++i) {
    if (!in[i].present) return invalid_argument("input " + std::to_string(i) + " is missing");
    K3_RETURN_IF_ERROR(same_dtype(in[0], in[i]));
    if (rank(in[i]) != r)
      return invalid_argument("Concat inputs differ in rank: " + str(in[0].shape) + " vs " + str(in[i].shape));
    for (int64_t d = 0; d < r; ++d) {
      int64_t& o = s[static_cast<size_t>(d)];
      const int64_t x = in[i].shape[static_cast<size_t>(d)];
      if (d == axis)
        o = (o < 0 || x < 0) ? kU : o + x;
      else if (o >= 0 && x >= 0 && o != x)
        return invalid_argument("Concat inputs differ off the axis: " + str(in[0].shape) + " vs " + str(in[i].shape));
      else if (o < 0)
        o = x;
    }
  }
  out.push_back(out_type(in[0].dtype, std::move(s)));
  return Status();
}

Status infer_OnnxSlice(const Node& n, In in, Outs& out) {
  const int64_t r = rank(in.empty() ? OnnxInput{} : in[0]);
  std::optional<std::vector<int64_t>> starts, ends, axes, steps;
  if (n.attr_ints("starts") != nullptr) {  // opset 1: attributes
    K3_RETURN_IF_ERROR(count(in, 1, 1));
    starts = *n.attr_ints("starts");
    ends = n.attr_ints("ends") ? std::optional(*n.attr_ints("ends")) : std::nullopt;
    if (!ends) return invalid_argument("Slice needs ends");
    if (n.attr_ints("axes")) axes = *n.attr_ints("axes");
  } else {
    K3_RETURN_IF_ERROR(count(in, 3, 5));
    for (size_t i = 1; i < in.size(); ++i)
      if (in[i].present && !is_index(in[i].dtype))
        return invalid_argument("Slice starts/ends/axes/steps must be int32 or int64");
    starts = ints(in[1]);
    ends = ints(in[2]);
    if (has(in, 3)) axes = ints(in[3]);
    if (has(in, 4)) steps = ints(in[4]);
    if (!starts || !ends || (has(in, 3) && !axes) || (has(in, 4) && !steps)) {
      // Values unknown: rank is known, dims are not (unless no axes could touch them).
      out.push_back(out_type(in[0].dtype, Shape(static_cast<size_t>(r), kU)));
      return Status();
    }
  }
  const size_t k = starts->size();
  if (ends->size() != k || (axes && axes->size() != k) || (steps && steps->size() != k))
    return invalid_argument("Slice starts, ends, axes and steps differ in length");
  std::vector<int64_t> ax;
  if (axes)
    K3_RETURN_IF_ERROR(norm_axes(*axes, r, ax));
  else
    for (size_t i = 0; i < k; ++i) ax.push_back(static_cast<int64_t>(i));
  if (static_cast<int64_t>(k) > r) return invalid_argument("Slice has more starts than the input has dims");
  Shape s = in[0].shape;
  for (size_t i = 0; i < k; ++i) {
    const int64_t step = steps ? (*steps)[i] : 1;
    if (step == 0) return invalid_argument("Slice step must not be 0");
    int64_t& d = s[static_cast<size_t>(ax[i])];
    if (d < 0) continue;
    int64_t first = 0;
    slice_bounds(d, (*starts)[i], (*ends)[i], step, first, d);
  }
  out.push_back(out_type(in[0].dtype, std::move(s)));
  return Status();
}

Status infer_OnnxSplit(const Node& n, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 1, 2));
  const int64_t r = rank(in[0]);
  int64_t axis = 0;
  K3_RETURN_IF_ERROR(norm_axis(n.attr_int("axis", 0), r, axis));
  const int64_t dim = in[0].shape[static_cast<size_t>(axis)];
  std::optional<std::vector<int64_t>> split;
  bool given = false;
  if (const auto* a = n.attr_ints("split")) {
    split = *a;
    given = true;
  } else if (has(in, 1)) {
    if (in[1].dtype != DType::kI64) return invalid_argument("Split split must be int64");
    split = ints(in[1]);
    given = true;
  }
  int64_t num = n.attr_int("num_outputs", 0);
  if (given && split) num = static_cast<int64_t>(split->size());
  if (num < 1) return invalid_argument("Split needs num_outputs or split");
  std::vector<int64_t> sizes(static_cast<size_t>(num), kU);
  if (given && split) {
    int64_t sum = 0;
    for (int64_t v : *split) {
      if (v < 0) return invalid_argument("Split sizes must be non-negative");
      sum += v;
    }
    if (dim >= 0 && sum != dim)
      return invalid_argument("Split sizes sum to " + std::to_string(sum) + ", the axis has " + std::to_string(dim));
    sizes = *split;
  } else if (!given && dim >= 0) {
    // Opset 18 rule: chunks of ceil(dim / num), the last one smaller.
    const int64_t chunk = (dim + num - 1) / num;
    for (int64_t i = 0; i < num; ++i)
      sizes[static_cast<size_t>(i)] = std::max<int64_t>(0, std::min(chunk, dim - i * chunk));
  }
  for (int64_t sz : sizes) {
    Shape s = in[0].shape;
    s[static_cast<size_t>(axis)] = sz;
    out.push_back(out_type(in[0].dtype, std::move(s)));
  }
  return Status();
}

Status infer_OnnxReshape(const Node& n, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 2, 2));
  if (in[1].dtype != DType::kI64 || rank(in[1]) != 1)
    return invalid_argument("Reshape shape must be a 1-D int64 tensor");
  const auto v = ints(in[1]);
  if (!v) {
    if (in[1].shape[0] < 0) return invalid_argument("Reshape target rank is not known at compile time");
    out.push_back(out_type(in[0].dtype, Shape(static_cast<size_t>(in[1].shape[0]), kU)));
    return Status();
  }
  const bool allowzero = n.attr_int("allowzero", 0) != 0;
  Shape s = *v;
  int infer_at = -1;
  bool unknown = false;
  uint64_t prod = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      if (infer_at >= 0) return invalid_argument("Reshape shape has more than one -1");
      infer_at = static_cast<int>(i);
      continue;
    }
    if (s[i] < -1) return invalid_argument("Reshape shape has a negative entry " + std::to_string(s[i]));
    if (s[i] == 0 && !allowzero) {
      if (i >= in[0].shape.size())
        return invalid_argument("Reshape shape copies dim " + std::to_string(i) + " the input lacks");
      s[i] = in[0].shape[i];
    }
    if (s[i] < 0)
      unknown = true;
    else {
      auto p = checked_mul(prod, static_cast<uint64_t>(s[i]));
      if (!p) return invalid_argument("Reshape shape overflows");
      prod = *p;
    }
  }
  const bool in_known = known(in[0].shape);
  const uint64_t total = in_known ? checked_numel_bytes(in[0].shape, 1).value_or(0) : 0;
  if (infer_at >= 0) {
    if (unknown || !in_known)
      s[static_cast<size_t>(infer_at)] = kU;
    else {
      if (prod == 0 || total % prod != 0)
        return invalid_argument("cannot reshape " + str(in[0].shape) + " to " + str(*v));
      s[static_cast<size_t>(infer_at)] = static_cast<int64_t>(total / prod);
    }
  } else if (!unknown && in_known && prod != total) {
    return invalid_argument("cannot reshape " + str(in[0].shape) + " to " + str(*v));
  }
  out.push_back(out_type(in[0].dtype, std::move(s)));
  return Status();
}

Status infer_OnnxTranspose(const Node& n, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 1, 1));
  const int64_t r = rank(in[0]);
  std::vector<int64_t> perm;
  if (const auto* p = n.attr_ints("perm"))
    perm = *p;
  else
    for (int64_t i = r - 1; i >= 0; --i) perm.push_back(i);
  if (static_cast<int64_t>(perm.size()) != r)
    return invalid_argument("Transpose perm has " + std::to_string(perm.size()) + " entries for rank " +
                            std::to_string(r));
  std::vector<bool> seen(static_cast<size_t>(r), false);
  Shape s;
  for (int64_t p : perm) {
    if (p < 0 || p >= r || seen[static_cast<size_t>(p)])
      return invalid_argument("Transpose perm " + str(perm) + " is not a permutation");
    seen[static_cast<size_t>(p)] = true;
    s.push_back(in[0].shape[static_cast<size_t>(p)]);
  }
  out.push_back(out_type(in[0].dtype, std::move(s)));
  return Status();
}

Status infer_OnnxUnsqueeze(const Node& n, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 1, 2));
  std::optional<std::vector<int64_t>> axes;
  bool given = false;
  K3_RETURN_IF_ERROR(axes_of(n, in, 1, axes, given));
  if (!given) return invalid_argument("Unsqueeze needs axes");
  if (!axes) {
    if (in[1].shape.size() != 1 || in[1].shape[0] < 0) return invalid_argument("Unsqueeze axes count is not known");
    out.push_back(out_type(in[0].dtype, Shape(in[0].shape.size() + static_cast<size_t>(in[1].shape[0]), kU)));
    return Status();
  }
  const int64_t r = rank(in[0]) + static_cast<int64_t>(axes->size());
  std::vector<int64_t> ax;
  K3_RETURN_IF_ERROR(norm_axes(*axes, r, ax));
  Shape s;
  size_t j = 0;
  for (int64_t i = 0; i < r; ++i) {
    if (std::find(ax.begin(), ax.end(), i) != ax.end())
      s.push_back(1);
    else
      s.push_back(in[0].shape[j++]);
  }
  out.push_back(out_type(in[0].dtype, std::move(s)));
  return Status();
}

Status infer_OnnxSqueeze(const Node& n, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 1, 2));
  std::optional<std::vector<int64_t>> axes;
  bool given = false;
  K3_RETURN_IF_ERROR(axes_of(n, in, 1, axes, given));
  const int64_t r = rank(in[0]);
  std::vector<int64_t> ax;
  if (given && !axes) return invalid_argument("Squeeze axes must be known at compile time");
  if (given) {
    K3_RETURN_IF_ERROR(norm_axes(*axes, r, ax));
    for (int64_t a : ax) {
      const int64_t d = in[0].shape[static_cast<size_t>(a)];
      if (d >= 0 && d != 1)
        return invalid_argument("Squeeze axis " + std::to_string(a) + " has size " + std::to_string(d));
    }
  } else {
    for (int64_t i = 0; i < r; ++i) {
      const int64_t d = in[0].shape[static_cast<size_t>(i)];
      if (d < 0) return invalid_argument("Squeeze without axes on a dim not known at compile time");
      if (d == 1) ax.push_back(i);
    }
  }
  Shape s;
  for (int64_t i = 0; i < r; ++i)
    if (std::find(ax.begin(), ax.end(), i) == ax.end()) s.push_back(in[0].shape[static_cast<size_t>(i)]);
  out.push_back(out_type(in[0].dtype, std::move(s)));
  return Status();
}

Status infer_OnnxFlatten(const Node& n, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 1, 1));
  const int64_t r = rank(in[0]);
  int64_t axis = n.attr_int("axis", 1);
  if (axis < -r || axis > r) return invalid_argument("Flatten axis " + std::to_string(axis) + " is out of range");
  if (axis < 0) axis += r;
  int64_t a = 1, b = 1;
  for (int64_t i = 0; i < r; ++i) {
    int64_t& p = i < axis ? a : b;
    const int64_t d = in[0].shape[static_cast<size_t>(i)];
    p = (p < 0 || d < 0) ? kU : p * d;
  }
  out.push_back(out_type(in[0].dtype, {a, b}));
  return Status();
}

Status infer_OnnxExpand(const Node&, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 2, 2));
  if (in[1].dtype != DType::kI64 || rank(in[1]) != 1)
    return invalid_argument("Expand shape must be a 1-D int64 tensor");
  auto v = ints(in[1]);
  if (!v) {
    if (in[1].shape[0] < 0) return invalid_argument("Expand target rank is not known at compile time");
    const size_t r = std::max(in[0].shape.size(), static_cast<size_t>(in[1].shape[0]));
    Shape s(r, kU);
    // Input dims > 1 survive broadcasting against anything valid.
    for (size_t i = 0; i < in[0].shape.size(); ++i) {
      const int64_t d = in[0].shape[in[0].shape.size() - 1 - i];
      if (d > 1) s[r - 1 - i] = d;
    }
    out.push_back(out_type(in[0].dtype, std::move(s)));
    return Status();
  }
  for (int64_t d : *v)
    if (d < 0) return invalid_argument("Expand shape has a negative entry");
  K3_ASSIGN_OR_RETURN(Shape s, bcast(in[0].shape, *v));
  out.push_back(out_type(in[0].dtype, std::move(s)));
  return Status();
}

Status infer_OnnxTile(const Node&, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 2, 2));
  if (in[1].dtype != DType::kI64 || rank(in[1]) != 1)
    return invalid_argument("Tile repeats must be a 1-D int64 tensor");
  if (in[1].shape[0] >= 0 && in[1].shape[0] != rank(in[0]))
    return invalid_argument("Tile repeats length differs from the input rank");
  Shape s = in[0].shape;
  if (auto v = ints(in[1])) {
    for (size_t i = 0; i < s.size(); ++i) {
      if ((*v)[i] < 0) return invalid_argument("Tile repeats must be non-negative");
      if (s[i] >= 0) {
        auto p = checked_mul(static_cast<uint64_t>(s[i]), static_cast<uint64_t>((*v)[i]));
        if (!p || *p > (uint64_t{1} << 62)) return invalid_argument("Tile result overflows");
        s[i] = static_cast<int64_t>(*p);
      }
    }
  } else {
    for (auto& d : s) d = kU;
  }
  out.push_back(out_type(in[0].dtype, std::move(s)));
  return Status();
}

Status infer_OnnxShape(const Node& n, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 1, 1));
  const int64_t r = rank(in[0]);
  int64_t st = n.attr_int("start", 0), en = n.attr_int("end", r);
  if (st < 0) st += r;
  if (en < 0) en += r;
  st = std::clamp<int64_t>(st, 0, r);
  en = std::clamp<int64_t>(en, 0, r);
  out.push_back(out_type(DType::kI64, {std::max<int64_t>(0, en - st)}));
  return Status();
}

Status infer_OnnxSize(const Node&, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 1, 1));
  out.push_back(out_type(DType::kI64, {}));
  return Status();
}

Status infer_OnnxCast(const Node& n, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 1, 1));
  auto t = dtype_from_onnx(n.attr_int("to", -1));
  if (!t) return invalid_argument("Cast target type " + std::to_string(n.attr_int("to", -1)) + " is not supported");
  out.push_back(out_type(*t, in[0].shape));
  return Status();
}

Status infer_OnnxCastLike(const Node&, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 2, 2));
  out.push_back(out_type(in[1].dtype, in[0].shape));
  return Status();
}

Status infer_OnnxRange(const Node&, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 3, 3));
  K3_RETURN_IF_ERROR(same_dtype(in[0], in[1]));
  K3_RETURN_IF_ERROR(same_dtype(in[0], in[2]));
  K3_RETURN_IF_ERROR(want_dtype(in[0], is_numeric(in[0].dtype), "input"));
  for (int i = 0; i < 3; ++i)
    if (!in[static_cast<size_t>(i)].shape.empty() &&
        !(in[static_cast<size_t>(i)].shape.size() == 1 && in[static_cast<size_t>(i)].shape[0] == 1))
      return invalid_argument("Range start, limit and delta must be scalars");
  int64_t len = kU;
  auto s = scalar(in[0]), l = scalar(in[1]), d = scalar(in[2]);
  if (s && l && d) {
    if (*d == 0) return invalid_argument("Range delta must not be 0");
    const double n = std::ceil((*l - *s) / *d);
    if (!(n < 9e15)) return invalid_argument("Range is too long");
    len = n > 0 ? static_cast<int64_t>(n) : 0;
  }
  out.push_back(out_type(in[0].dtype, {len}));
  return Status();
}

Status infer_OnnxConstantOfShape(const Node& n, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 1, 1));
  if (in[0].dtype != DType::kI64 || rank(in[0]) != 1)
    return invalid_argument("ConstantOfShape input must be a 1-D int64 tensor");
  auto t = dtype_from_onnx(n.attr_int("value_dtype", 1));
  if (!t) return invalid_argument("ConstantOfShape value type is not supported");
  auto v = ints(in[0]);
  Shape s;
  if (v) {
    for (int64_t d : *v)
      if (d < 0) return invalid_argument("ConstantOfShape shape has a negative entry");
    if (!checked_numel_bytes(*v, 8)) return invalid_argument("ConstantOfShape shape overflows");
    s = *v;
  } else {
    if (in[0].shape[0] < 0) return invalid_argument("ConstantOfShape rank is not known at compile time");
    s.assign(static_cast<size_t>(in[0].shape[0]), kU);
  }
  out.push_back(out_type(*t, std::move(s)));
  return Status();
}

// ---- K3 ops with ONNX-style shapes (docs/onnx-lowering.md) ----

// Two dims that must agree where both are known.
Status same_dim(int64_t a, int64_t b, const char* what) {
  if (a >= 0 && b >= 0 && a != b)
    return invalid_argument(std::string(what) + ": " + std::to_string(a) + " vs " + std::to_string(b));
  return Status();
}

// x [B, S, H*hd] f32, positions [B, S] int, cos/sin [L, hd/2] -> [B, S, H*hd]; attr head_dim.
Status infer_K3Rope(const Node& n, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 4, 4));
  const OnnxInput &x = in[0], &pos = in[1], &cos = in[2], &sin = in[3];
  const int64_t hd = n.attr_int("head_dim", 0);
  if (hd < 2 || hd % 2 != 0) return invalid_argument("k3.Rope head_dim must be even and positive");
  if (x.dtype != DType::kF32 || cos.dtype != DType::kF32 || sin.dtype != DType::kF32)
    return invalid_argument("k3.Rope takes f32 x and tables");
  if (!is_index(pos.dtype)) return invalid_argument("k3.Rope positions must be int32 or int64");
  if (rank(x) != 3 || rank(pos) != 2 || rank(cos) != 2 || cos.shape != sin.shape)
    return invalid_argument("k3.Rope wants x [B,S,H*hd], positions [B,S], cos = sin [L,hd/2]");
  K3_RETURN_IF_ERROR(same_dim(x.shape[0], pos.shape[0], "k3.Rope batch"));
  K3_RETURN_IF_ERROR(same_dim(x.shape[1], pos.shape[1], "k3.Rope sequence"));
  K3_RETURN_IF_ERROR(same_dim(cos.shape[1], hd / 2, "k3.Rope table width"));
  if (x.shape[2] >= 0 && x.shape[2] % hd != 0)
    return invalid_argument("k3.Rope feature dim " + std::to_string(x.shape[2]) + " is not a multiple of head_dim");
  out.push_back(out_type(DType::kF32, x.shape));
  return Status();
}

// q [B,S,Hq*hd], k, v [B,S,Hkv*hd] f32, positions [B,S] int, past_k, past_v
// [B,Hkv,P,hd] f32 -> out [B,S,Hq*hd], present_k, present_v [B,Hkv,P',hd]
// with P' = P + S (cache "concat") or P (cache "slot"); attrs n_heads,
// n_kv_heads, head_dim, cache, scale.
Status infer_K3Attention(const Node& n, In in, Outs& out) {
  K3_RETURN_IF_ERROR(count(in, 6, 6));
  const int64_t hq = n.attr_int("n_heads", 0), hkv = n.attr_int("n_kv_heads", 0), hd = n.attr_int("head_dim", 0);
  if (hq < 1 || hkv < 1 || hd < 1 || hq % hkv != 0)
    return invalid_argument(
        "k3.Attention needs n_heads, n_kv_heads, head_dim >= 1 with n_heads a multiple of n_kv_heads");
  const AttrValue* cache = n.find_attr("cache");
  const std::string* cs = cache != nullptr ? std::get_if<std::string>(cache) : nullptr;
  if (cs == nullptr || (*cs != "concat" && *cs != "slot"))
    return invalid_argument("k3.Attention cache must be \"concat\" or \"slot\"");
  const AttrValue* scale = n.find_attr("scale");
  if (scale == nullptr || std::get_if<double>(scale) == nullptr)
    return invalid_argument("k3.Attention needs a float scale");
  const OnnxInput &q = in[0], &k = in[1], &v = in[2], &pos = in[3], &pk = in[4], &pv = in[5];
  for (const OnnxInput* t : {&q, &k, &v, &pk, &pv})
    if (!t->present || t->dtype != DType::kF32) return invalid_argument("k3.Attention takes f32 q, k, v and caches");
  if (!pos.present || !is_index(pos.dtype)) return invalid_argument("k3.Attention positions must be int32 or int64");
  if (rank(q) != 3 || rank(k) != 3 || rank(v) != 3 || rank(pos) != 2 || rank(pk) != 4 || rank(pv) != 4)
    return invalid_argument("k3.Attention wants q, k, v [B,S,H*hd], positions [B,S], past_k, past_v [B,Hkv,P,hd]");
  for (const OnnxInput* t : {&k, &v, &pos, &pk, &pv})
    K3_RETURN_IF_ERROR(same_dim(t->shape[0], q.shape[0], "k3.Attention batch"));
  for (const OnnxInput* t : {&k, &v, &pos})
    K3_RETURN_IF_ERROR(same_dim(t->shape[1], q.shape[1], "k3.Attention sequence"));
  K3_RETURN_IF_ERROR(same_dim(q.shape[2], hq * hd, "k3.Attention q width vs n_heads * head_dim"));
  K3_RETURN_IF_ERROR(same_dim(k.shape[2], hkv * hd, "k3.Attention k width vs n_kv_heads * head_dim"));
  K3_RETURN_IF_ERROR(same_dim(v.shape[2], hkv * hd, "k3.Attention v width vs n_kv_heads * head_dim"));
  for (const OnnxInput* t : {&pk, &pv}) {
    K3_RETURN_IF_ERROR(same_dim(t->shape[1], hkv, "k3.Attention cache heads"));
    K3_RETURN_IF_ERROR(same_dim(t->shape[3], hd, "k3.Attention cache head_dim"));
  }
  K3_RETURN_IF_ERROR(same_dim(pk.shape[2], pv.shape[2], "k3.Attention past_k vs past_v length"));
  const int64_t p = pk.shape[2] >= 0 ? pk.shape[2] : pv.shape[2], s = q.shape[1];
  const int64_t p2 = *cs == "slot" ? p : (p >= 0 && s >= 0 ? p + s : kU);
  Shape present = {q.shape[0], hkv, p2, hd};
  out.push_back(out_type(DType::kF32, {q.shape[0], q.shape[1], hq * hd}));
  out.push_back(out_type(DType::kF32, present));
  out.push_back(out_type(DType::kF32, std::move(present)));
  return Status();
}

// x [..., D] f32, gate [E, D], then per expert up [F, D] (gate [F, D] when
// swiglu) down [D, F] (PyTorch [out, in]) -> [..., D]; attrs n_experts,
// top_k, swiglu.
Status infer_K3Moe(const Node& n, In in, Outs& out) {
  const int64_t e = n.attr_int("n_experts", 0), k = n.attr_int("top_k", 0), swiglu = n.attr_int("swiglu", 0);
  if (e < 1 || k < 1 || k > e) return invalid_argument("k3.Moe needs 1 <= top_k <= n_experts");
  if (swiglu != 0 && swiglu != 1) return invalid_argument("k3.Moe swiglu must be 0 or 1");
  const int64_t per = swiglu != 0 ? 3 : 2;
  const size_t want = static_cast<size_t>(2 + e * per);
  K3_RETURN_IF_ERROR(count(in, want, want));
  for (const OnnxInput& i : in)
    if (i.dtype != DType::kF32) return invalid_argument("k3.Moe takes f32 inputs and weights");
  const OnnxInput &x = in[0], &gate = in[1];
  if (rank(x) < 1 || rank(gate) != 2) return invalid_argument("k3.Moe wants x [..., D] and gate [E, D]");
  const int64_t d = x.shape.back();
  K3_RETURN_IF_ERROR(same_dim(gate.shape[0], e, "k3.Moe gate rows vs n_experts"));
  K3_RETURN_IF_ERROR(same_dim(gate.shape[1], d, "k3.Moe gate width"));
  const int64_t f = in[2].shape.size() == 2 ? in[2].shape[0] : kU;
  for (int64_t x_e = 0; x_e < e; ++x_e) {
    for (int64_t j = 0; j < per; ++j) {
      const OnnxInput& w = in[static_cast<size_t>(2 + x_e * per + j)];
      const bool down = j == per - 1;
      if (rank(w) != 2) return invalid_argument("k3.Moe expert weights must be 2-D");
      K3_RETURN_IF_ERROR(same_dim(w.shape[down ? 0 : 1], d, "k3.Moe expert weight model dim"));
      K3_RETURN_IF_ERROR(same_dim(w.shape[down ? 1 : 0], f, "k3.Moe expert weight hidden dim"));
    }
  }
  out.push_back(out_type(DType::kF32, x.shape));
  return Status();
}

// x [..., D] f32, scale (and bias when norm = "layer") broadcast over the
// normalized dims -> [..., D]: the norm then the activation, in one op;
// attrs norm ("layer" | "rms"), activation ("gelu" | "gelu_tanh" | "relu" |
// "sigmoid" | "tanh"), axis, epsilon (as the ONNX norm op's).
Status infer_K3NormAct(const Node& n, In in, Outs& out) {
  const AttrValue* norm = n.find_attr("norm");
  const std::string* ns = norm != nullptr ? std::get_if<std::string>(norm) : nullptr;
  if (ns == nullptr || (*ns != "layer" && *ns != "rms"))
    return invalid_argument("k3.NormAct attribute norm must be \"layer\" or \"rms\"");
  const AttrValue* act = n.find_attr("activation");
  const std::string* as = act != nullptr ? std::get_if<std::string>(act) : nullptr;
  if (as == nullptr || (*as != "gelu" && *as != "gelu_tanh" && *as != "relu" && *as != "sigmoid" && *as != "tanh"))
    return invalid_argument("k3.NormAct attribute activation must be gelu, gelu_tanh, relu, sigmoid or tanh");
  const bool layer = *ns == "layer";
  K3_RETURN_IF_ERROR(count(in, 2, layer ? 3 : 2));
  for (const OnnxInput& i : in)
    if (i.present && i.dtype != DType::kF32) return invalid_argument("k3.NormAct takes f32 inputs and weights");
  K3_RETURN_IF_ERROR(layer ? infer_OnnxLayerNormalization(n, in, out) : infer_OnnxRMSNormalization(n, in, out));
  out.resize(1);  // Y only (LayerNormalization's Mean and InvStdDev are not outputs)
  return Status();
}

}  // namespace

void slice_bounds(int64_t dim, int64_t start, int64_t end, int64_t step, int64_t& first, int64_t& count) {
  // numpy slicing semantics (what ONNX's reference implementation does).
  if (start < 0) start += dim;
  if (end < 0) end += dim;
  if (step > 0) {
    start = std::clamp<int64_t>(start, 0, dim);
    end = std::clamp<int64_t>(end, 0, dim);
    count = end > start ? (end - start - 1) / step + 1 : 0;
  } else {
    start = std::clamp<int64_t>(start, -1, dim - 1);
    end = std::clamp<int64_t>(end, -1, dim - 1);
    count = start > end ? (start - end - 1) / (-step) + 1 : 0;
  }
  first = start;
}

StatusOr<std::vector<int64_t>> broadcast_shapes(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  const size_t r = std::max(a.size(), b.size());
  Shape s(r, 1);
  for (size_t i = 0; i < r; ++i) {
    const int64_t x = i < a.size() ? a[a.size() - 1 - i] : 1;
    const int64_t y = i < b.size() ? b[b.size() - 1 - i] : 1;
    int64_t o;
    if (x == 1)
      o = y;
    else if (y == 1)
      o = x;
    else if (x < 0)
      o = y < 0 ? kU : y;  // an unknown dim must match the known one
    else if (y < 0)
      o = x;
    else if (x == y)
      o = x;
    else
      return invalid_argument("shapes " + str(a) + " and " + str(b) + " do not broadcast");
    s[r - 1 - i] = o;
  }
  return s;
}

std::optional<DType> dtype_from_onnx(int64_t code) {
  switch (code) {
    case 1:
      return DType::kF32;
    case 2:
      return DType::kU8;
    case 3:
      return DType::kI8;
    case 6:
      return DType::kI32;
    case 7:
      return DType::kI64;
    case 9:
      return DType::kBool;
    case 10:
      return DType::kF16;
    case 11:
      return DType::kF64;
    case 16:
      return DType::kBF16;
    default:
      return std::nullopt;
  }
}

int64_t dtype_to_onnx(DType t) {
  switch (t) {
    case DType::kF32:
      return 1;
    case DType::kU8:
      return 2;
    case DType::kI8:
      return 3;
    case DType::kI32:
      return 6;
    case DType::kI64:
      return 7;
    case DType::kBool:
      return 9;
    case DType::kF16:
      return 10;
    case DType::kF64:
      return 11;
    case DType::kBF16:
      return 16;
    case DType::kQ8:  // compiler weight formats, no ONNX equivalent
    case DType::kF32P16:
    case DType::kBF16P16:
    case DType::kBF16Dot:
    case DType::kBF16DotT16:
    case DType::kQ8P16:
    case DType::kQ8CP16:
    case DType::kBF16DotP16:
      return 0;
  }
  return 0;
}

std::vector<OnnxInput> onnx_inputs_of(const Graph& g, const Node& n) {
  std::vector<OnnxInput> in(n.inputs.size());
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    if (n.inputs[i] < 0) continue;
    const Value& v = g.value(n.inputs[i]);
    in[i].present = true;
    in[i].dtype = v.dtype;
    in[i].shape = v.shape;
    if (v.kind == ValueKind::kWeight && !v.has_unknown_dims()) in[i].data = v.data;
  }
  return in;
}

Status infer_onnx(const Node& n, std::span<const OnnxInput> in, std::vector<OutType>& out) {
  out.clear();
  switch (n.op) {
#define K3_ONNX_INFER(e, name) \
  case OpKind::k##e:           \
    return infer_##e(n, in, out);
    K3_ONNX_OP_LIST(K3_ONNX_INFER)
#undef K3_ONNX_INFER
    default:
      break;
  }
  return invalid_argument(std::string(op_name(n.op)) + " is not an onnx.* op");
}

}  // namespace k3::ir
