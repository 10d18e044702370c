// eval_node: one onnx.* node on concrete tensors (shape inference, output
// allocation, 16-bit float upcast, the reference kernel, result checks).
#include <string>

#include "ir/onnx_shape.h"
#include "kernels/onnx_ref/onnx_ref.h"
#include "util/checked.h"
#include "util/half.h"

namespace k3::onnx_ref {
namespace {

using ir::DType;
using ir::Tensor;

bool is_half(DType t) {
  return t == DType::kF16 || t == DType::kBF16;
}

// Ops that handle 16-bit floats themselves (they only move or reinterpret
// bytes or read shapes); every other op computes f16/bf16 in f32.
bool handles_half(ir::OpKind op) {
  using ir::OpKind;
  switch (op) {
    case OpKind::kOnnxCast:
    case OpKind::kOnnxCastLike:
    case OpKind::kOnnxShape:
    case OpKind::kOnnxSize:
    case OpKind::kOnnxConstantOfShape:
      return true;
    default:
      return false;
  }
}

Tensor half_to_f32(const Tensor& t) {
  Tensor out = *Tensor::zeros(DType::kF32, t.shape());
  const uint16_t* p = t.data<uint16_t>();
  for (int64_t i = 0; i < t.numel(); ++i)
    out.mut<float>()[i] = t.dtype() == DType::kF16 ? f16_to_f32(p[i]) : bf16_to_f32(p[i]);
  return out;
}

Tensor f32_to_half(const Tensor& t, DType to) {
  Tensor out = *Tensor::zeros(to, t.shape());
  for (int64_t i = 0; i < t.numel(); ++i)
    out.mut<uint16_t>()[i] = to == DType::kF16 ? f32_to_f16(t.data<float>()[i]) : f32_to_bf16(t.data<float>()[i]);
  return out;
}

}  // namespace

KernelFn onnx_kernel(ir::OpKind op) {
  switch (op) {
#define K3_ONNX_KERNEL(e, name) \
  case ir::OpKind::k##e:        \
    return &ref_##e;
    K3_ONNX_OP_LIST(K3_ONNX_KERNEL)
#undef K3_ONNX_KERNEL
    default:
      return nullptr;
  }
}

StatusOr<std::vector<Tensor>> eval_node(const ir::Graph& g, const ir::Node& n, std::vector<const Tensor*> in) {
  const std::string where = "node " + n.name + " (" + ir::op_name(n.op) + ")";
  const KernelFn kernel = onnx_kernel(n.op);
  if (kernel == nullptr) return unimplemented(where + ": no reference kernel (not an onnx.* op)");
  if (in.size() != n.inputs.size()) return internal_error(where + ": wrong input count");
  // Shapes for these concrete inputs; every value is known now.
  std::vector<ir::OnnxInput> info(in.size());
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i] != nullptr) info[i] = ir::OnnxInput{true, in[i]->dtype(), in[i]->shape(), in[i]->raw()};
  std::vector<ir::OutType> types;
  K3_RETURN_IF_ERROR(ir::infer_onnx(n, info, types).with_context(where));
  if (types.size() < n.outputs.size()) return internal_error(where + ": shape rule gave too few outputs");
  // 16-bit floats are computed in f32 (see handles_half).
  bool upcast = false;
  if (!handles_half(n.op)) {
    for (const Tensor* t : in) upcast |= t != nullptr && is_half(t->dtype());
    for (size_t o = 0; o < n.outputs.size(); ++o) upcast |= is_half(types[o].dtype);
  }
  std::vector<Tensor> upcast_in;
  if (upcast) {
    upcast_in.reserve(in.size());
    for (auto& p : in)
      if (p != nullptr && is_half(p->dtype())) {
        upcast_in.push_back(half_to_f32(*p));
        p = &upcast_in.back();
      }
  }
  std::vector<Tensor> out;
  for (size_t o = 0; o < n.outputs.size(); ++o) {
    std::vector<int64_t> shape = types[o].shape;
    for (int64_t& d : shape)
      if (d < 0) d = 0;  // data-dependent (NonZero): the kernel replaces the tensor
    const DType dt = upcast && is_half(types[o].dtype) ? DType::kF32 : types[o].dtype;
    // A model or input asking for absurd sizes (Tile, Range, Expand) gets
    // an error, not an allocation failure.
    const auto bytes = checked_numel_bytes(shape, ir::dtype_size(dt));
    if (!bytes || *bytes > kMaxTensorBytes)
      return out_of_range(where + ": output " + ir::shape_to_string(shape) + " exceeds the " +
                          std::to_string(kMaxTensorBytes >> 30) + " GiB tensor limit");
    auto t = Tensor::zeros(dt, std::move(shape));
    if (!t) return out_of_range(where + ": output size overflows");
    out.push_back(std::move(*t));
  }
  KernelCtx ctx{n, std::move(in), out};
  K3_RETURN_IF_ERROR(kernel(ctx).with_context(where));
  for (size_t o = 0; o < n.outputs.size(); ++o) {
    if (upcast && is_half(types[o].dtype)) out[o] = f32_to_half(out[o], types[o].dtype);
    const ir::Value& v = g.value(n.outputs[o]);
    // The run-time shape must fit what the graph promised at compile time.
    bool fits = out[o].dtype() == v.dtype && out[o].shape().size() == v.shape.size();
    for (size_t d = 0; fits && d < v.shape.size(); ++d) fits = v.shape[d] < 0 || v.shape[d] == out[o].shape()[d];
    if (!fits)
      return internal_error(where + ": output " + ir::shape_to_string(out[o].shape()) + " does not fit " +
                            ir::shape_to_string(v.shape));
  }
  return out;
}

}  // namespace k3::onnx_ref
