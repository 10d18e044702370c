// The O0 interpreter; see interpreter.h.
#include "runtime/interp/interpreter.h"

#include <cstring>
#include <map>
#include <optional>

#include "ir/onnx_shape.h"
#include "util/checked.h"
#include "util/half.h"

namespace k3::runtime::interp {
namespace {

using ir::DType;
using ir::Tensor;

// Largest single tensor the interpreter allocates.
constexpr uint64_t kMaxTensorBytes = uint64_t{16} << 30;

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

StatusOr<Interpreter> Interpreter::create(ir::Graph graph) {
  K3_RETURN_IF_ERROR(graph.verify());
  Interpreter it;
  for (const ir::Node& n : graph.nodes()) {
    KernelFn k = onnx_kernel(n.op);
    if (k == nullptr)
      return unimplemented("node " + n.name + ": the O0 interpreter runs onnx.* ops only, not " + ir::op_name(n.op));
    it.kernels_.push_back(k);
  }
  for (const ir::Value& v : graph.values())
    if (v.kind == ir::ValueKind::kState)
      return unimplemented("the O0 interpreter does not run graphs with state values");
  it.last_use_.assign(graph.values().size(), -1);
  for (size_t ni = 0; ni < graph.nodes().size(); ++ni)
    for (int in : graph.nodes()[ni].inputs)
      if (in >= 0) it.last_use_[static_cast<size_t>(in)] = static_cast<int>(ni);
  it.graph_ = std::move(graph);
  return it;
}

StatusOr<std::vector<NamedTensor>> Interpreter::run(const std::vector<NamedTensor>& inputs, RunStats* stats) const {
  const ir::Graph& g = graph_;
  std::vector<std::optional<Tensor>> slot(g.values().size());
  // Weights: views of the graph's data, no copy.
  for (size_t vi = 0; vi < g.values().size(); ++vi) {
    const ir::Value& v = g.values()[vi];
    if (v.kind == ir::ValueKind::kWeight) slot[vi] = Tensor::view(v.dtype, v.shape, v.data, nullptr);
  }
  // Inputs: by name, checked against the declared types; named dims bind once.
  std::map<std::string, int64_t> dim_binding;
  for (const NamedTensor& nt : inputs)
    if (g.find_value(nt.name) < 0 || g.value(g.find_value(nt.name)).kind != ir::ValueKind::kInput)
      return invalid_argument("the model has no input named '" + nt.name + "'");
  for (int id : g.inputs()) {
    const ir::Value& v = g.value(id);
    const NamedTensor* given = nullptr;
    for (const NamedTensor& nt : inputs)
      if (nt.name == v.name) given = &nt;
    if (given == nullptr) return invalid_argument("input '" + v.name + "' is missing");
    const Tensor& t = given->tensor;
    if (t.dtype() != v.dtype)
      return invalid_argument("input '" + v.name + "' must be " + std::string(ir::dtype_name(v.dtype)) + ", got " +
                              std::string(ir::dtype_name(t.dtype())));
    if (t.shape().size() != v.shape.size())
      return invalid_argument("input '" + v.name + "' must have shape " + ir::shape_to_string(v.shape) + ", got " +
                              ir::shape_to_string(t.shape()));
    for (size_t d = 0; d < v.shape.size(); ++d) {
      if (v.shape[d] >= 0 && v.shape[d] != t.shape()[d])
        return invalid_argument("input '" + v.name + "' must have shape " + ir::shape_to_string(v.shape) + ", got " +
                                ir::shape_to_string(t.shape()));
      const std::string& param = v.dim_params.empty() ? std::string() : v.dim_params[d];
      if (param.empty()) continue;
      auto [it, fresh] = dim_binding.emplace(param, t.shape()[d]);
      if (!fresh && it->second != t.shape()[d])
        return invalid_argument("input '" + v.name + "' dim '" + param + "' is " + std::to_string(t.shape()[d]) +
                                " but another input has it " + std::to_string(it->second));
    }
    slot[static_cast<size_t>(id)] = t;
  }

  std::vector<bool> keep(g.values().size(), false);
  for (int id : g.outputs()) keep[static_cast<size_t>(id)] = true;
  uint64_t live = 0, peak = 0;
  std::vector<ir::OutType> types;
  for (size_t ni = 0; ni < g.nodes().size(); ++ni) {
    const ir::Node& n = g.nodes()[ni];
    const std::string where = "node " + n.name + " (" + ir::op_name(n.op) + ")";
    // Shapes for these concrete inputs; every value is known now.
    std::vector<ir::OnnxInput> info(n.inputs.size());
    std::vector<const Tensor*> in(n.inputs.size(), nullptr);
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      if (n.inputs[i] < 0) continue;
      const std::optional<Tensor>& t = slot[static_cast<size_t>(n.inputs[i])];
      if (!t) return internal_error(where + " reads a value that was freed or never produced");
      in[i] = &*t;
      info[i] = ir::OnnxInput{true, t->dtype(), t->shape(), t->raw()};
    }
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
      // A model or input asking for absurd sizes (Tile, Range, Expand)
      // gets an error, not an allocation failure.
      const auto bytes = checked_numel_bytes(shape, ir::dtype_size(dt));
      if (!bytes || *bytes > kMaxTensorBytes)
        return out_of_range(where + ": output " + ir::shape_to_string(shape) + " exceeds the " +
                            std::to_string(kMaxTensorBytes >> 30) + " GiB tensor limit");
      auto t = Tensor::zeros(dt, std::move(shape));
      if (!t) return out_of_range(where + ": output size overflows");
      out.push_back(std::move(*t));
    }
    KernelCtx ctx{n, std::move(in), out};
    K3_RETURN_IF_ERROR(kernels_[ni](ctx).with_context(where));
    for (size_t o = 0; o < n.outputs.size(); ++o) {
      if (upcast && is_half(types[o].dtype)) out[o] = f32_to_half(out[o], types[o].dtype);
      const ir::Value& v = g.value(n.outputs[o]);
      // The run-time shape must fit what the graph promised at compile time.
      bool fits = out[o].dtype() == v.dtype && out[o].shape().size() == v.shape.size();
      for (size_t d = 0; fits && d < v.shape.size(); ++d) fits = v.shape[d] < 0 || v.shape[d] == out[o].shape()[d];
      if (!fits)
        return internal_error(where + ": output " + ir::shape_to_string(out[o].shape()) + " does not fit " +
                              ir::shape_to_string(v.shape));
      live += out[o].nbytes();
      slot[static_cast<size_t>(n.outputs[o])] = std::move(out[o]);
    }
    peak = std::max(peak, live);
    // Free what no later node reads.
    auto release = [&](int id) {
      if (id < 0 || keep[static_cast<size_t>(id)] || g.value(id).kind != ir::ValueKind::kActivation) return;
      if (last_use_[static_cast<size_t>(id)] > static_cast<int>(ni)) return;
      if (slot[static_cast<size_t>(id)]) {
        live -= slot[static_cast<size_t>(id)]->nbytes();
        slot[static_cast<size_t>(id)].reset();
      }
    };
    for (int id : n.inputs) release(id);
    for (int id : n.outputs) release(id);  // outputs nobody reads
  }
  if (stats != nullptr) {
    stats->nodes_run = static_cast<int64_t>(g.nodes().size());
    stats->peak_live_bytes = peak;
  }
  std::vector<NamedTensor> result;
  for (int id : g.outputs()) {
    if (!slot[static_cast<size_t>(id)]) return internal_error("graph output " + g.value(id).name + " was not produced");
    const Tensor& t = *slot[static_cast<size_t>(id)];
    if (g.value(id).kind == ir::ValueKind::kWeight) {
      // Weights are views into the graph: hand out a copy that outlives it.
      Tensor copy = *Tensor::zeros(t.dtype(), t.shape());
      std::memcpy(copy.raw_mut(), t.raw(), t.nbytes());
      result.push_back({g.value(id).name, std::move(copy)});
      continue;
    }
    result.push_back({g.value(id).name, t});
  }
  return result;
}

}  // namespace k3::runtime::interp
