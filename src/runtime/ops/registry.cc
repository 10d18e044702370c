// Maps each op of ir/op_table.h to its optimized implementation and its
// workspace requirement.
#include "runtime/ops/fast_ops.h"
#include "runtime/ops/prepared_rows.h"

namespace k3::runtime {

OpFn fast_op(ir::OpKind op) {
  switch (op) {
#define K3_OP_FAST(e, name) \
  case ir::OpKind::k##e:    \
    return &run_##e;
    K3_OP_LIST(K3_OP_FAST)
#undef K3_OP_FAST
    default: break;  // onnx.* ops: the O0 interpreter's kernels (runtime/interp)
  }
  return nullptr;
}

uint64_t op_workspace_bytes(const ir::Graph& g, const ir::Node& node) {
  if (node.op == ir::OpKind::kLinear) {  // its rows, rounded once for int8 / bf16 dot weights
    const ir::Value& x = g.value(node.inputs[0]);
    return prepared_bytes_bound(g.value(node.inputs[1]).dtype, x.shape[0], x.shape[1]);
  }
  if (node.op == ir::OpKind::kCachedAttention)
    return attention_workspace_bytes(g.value(node.inputs[0]).shape[0], node.attr_int("n_heads"),
                                     node.attr_int("head_dim"));
  if (node.op != ir::OpKind::kMoe) return 0;
  const ir::Value& x = g.value(node.inputs[0]);
  const ir::Value& up = g.value(node.inputs[2]);
  const int64_t shared_ff =
      node.attr_int("shared", 0) != 0 ? g.value(node.inputs[ir::moe_shared_input(node)]).shape[0] : 0;
  return moe_workspace_bytes(x.shape[0], node.attr_int("n_experts"), node.attr_int("top_k"), x.shape[1], up.shape[0],
                             node.attr_int("swiglu") != 0, up.dtype, shared_ff);
}

}  // namespace k3::runtime
