// Scalar reference kernels of the onnx.* ops (ir/onnx_op_table.h), the
// helpers they share (dtype dispatch, broadcasting) and eval_node, which runs
// one node. Used by the O0 interpreter and by constant folding at compile
// time, so they depend on the IR only.
//
// Deliberately plain: one element at a time, index arithmetic recomputed,
// no threads, no SIMD. They are the correctness baseline the optimized
// compiler is measured against. f16/bf16 inputs never reach a kernel except
// Cast/CastLike/Shape/Size: the interpreter computes those in f32.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/tensor.h"

namespace k3::onnx_ref {

using Shape = std::vector<int64_t>;

// What a kernel sees: the node, its inputs (nullptr = omitted optional) and
// its outputs, already allocated with the shapes the op's shape rule gave
// for these inputs. A kernel whose output size depends on values (NonZero)
// replaces its output tensor.
struct KernelCtx {
  const ir::Node& node;
  std::vector<const ir::Tensor*> in;
  std::vector<ir::Tensor>& out;
};

using KernelFn = Status (*)(KernelCtx& c);

#define K3_ONNX_DECLARE_REF(e, name) Status ref_##e(KernelCtx& c);
K3_ONNX_OP_LIST(K3_ONNX_DECLARE_REF)
#undef K3_ONNX_DECLARE_REF

// The kernel of an onnx.* op; nullptr for fused ops.
KernelFn onnx_kernel(ir::OpKind op);

// Largest single tensor eval_node allocates (bigger -> error, not a crash).
inline constexpr uint64_t kMaxTensorBytes = uint64_t{16} << 30;

// Runs one onnx.* node on concrete inputs (nullptr = omitted optional):
// infers the output shapes from them, allocates the outputs, computes
// f16/bf16 in f32 where the op needs it, runs the reference kernel and
// checks each result fits the compile-time type of its output value. The
// O0 interpreter runs every node through this; constant folding runs the
// nodes whose inputs are all constants. Errors name the node.
StatusOr<std::vector<ir::Tensor>> eval_node(const ir::Graph& g, const ir::Node& n,
                                            std::vector<const ir::Tensor*> in);

// ---- shared helpers ----

inline int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Row-major strides of a shape.
inline Shape strides_of(const Shape& s) {
  Shape st(s.size(), 1);
  for (size_t i = s.size(); i-- > 1;) st[i - 1] = st[i] * s[i];
  return st;
}

// Strides to read a tensor of shape `in` broadcast to `out` (right-aligned,
// 0 along broadcast dims).
inline Shape broadcast_strides(const Shape& in, const Shape& out) {
  Shape st(out.size(), 0);
  const Shape own = strides_of(in);
  const size_t off = out.size() - in.size();
  for (size_t i = 0; i < in.size(); ++i) st[off + i] = in[i] == 1 ? 0 : own[i];
  return st;
}

// Calls f(out_index, offsets) for every element of `out` in row-major
// order, where offsets[k] is the element offset into operand k (walked
// with strides[k]).
template <size_t N, typename F>
void for_each_index(const Shape& out, const std::array<Shape, N>& strides, F&& f) {
  const int64_t total = numel_of(out);
  if (total == 0) return;
  const size_t r = out.size();
  Shape idx(r, 0);
  std::array<int64_t, N> off{};
  for (int64_t i = 0; i < total; ++i) {
    f(i, off);
    for (size_t d = r; d-- > 0;) {
      ++idx[d];
      for (size_t k = 0; k < N; ++k) off[k] += strides[k][d];
      if (idx[d] < out[d]) break;
      for (size_t k = 0; k < N; ++k) off[k] -= strides[k][d] * out[d];
      idx[d] = 0;
    }
  }
}

inline Status unsupported_dtype(ir::DType t) {
  return unimplemented("dtype " + std::string(ir::dtype_name(t)) + " is not supported by this op");
}

// f(T{}) with T the C++ type of a numeric dtype (no 16-bit floats, no bool).
template <typename F>
Status visit_numeric(ir::DType t, F&& f) {
  switch (t) {
    case ir::DType::kF32:
      return f(float{});
    case ir::DType::kF64:
      return f(double{});
    case ir::DType::kI32:
      return f(int32_t{});
    case ir::DType::kI64:
      return f(int64_t{});
    case ir::DType::kI8:
      return f(int8_t{});
    case ir::DType::kU8:
      return f(uint8_t{});
    default:
      return unsupported_dtype(t);
  }
}
// Same plus bool.
template <typename F>
Status visit_all(ir::DType t, F&& f) {
  if (t == ir::DType::kBool) return f(bool{});
  return visit_numeric(t, f);
}
template <typename F>
Status visit_float(ir::DType t, F&& f) {
  switch (t) {
    case ir::DType::kF32:
      return f(float{});
    case ir::DType::kF64:
      return f(double{});
    default:
      return unsupported_dtype(t);
  }
}

// Values of an index tensor (i32/i64) as int64.
inline std::vector<int64_t> index_values(const ir::Tensor& t) {
  std::vector<int64_t> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = t.dtype() == ir::DType::kI32 ? t.data<int32_t>()[i] : t.data<int64_t>()[i];
  return v;
}

// An index in [-dim, dim) normalized to [0, dim), or an error naming it.
inline Status norm_index(int64_t& i, int64_t dim) {
  if (i < -dim || i >= dim)
    return out_of_range("index " + std::to_string(i) + " is out of range for a dim of size " + std::to_string(dim));
  if (i < 0) i += dim;
  return Status();
}

inline int64_t norm_axis(int64_t axis, int64_t rank) {
  return axis < 0 ? axis + rank : axis;
}

}  // namespace k3::onnx_ref
