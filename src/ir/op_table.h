// The one list of IR ops.
//
// Every op appears here exactly once. The list is expanded (X-macro) in:
//   ir/shape_rules.cc        -> infer_<op>()      shape and dtype rule
//   runtime/ops/ref_ops.cc   -> ref_<op>()        scalar reference implementation
//   runtime/ops/registry.cc  -> run_<op>()        optimized implementation
//   tests/runtime/test_ops.cc -> test_<op>()      fast vs reference test
// so adding an op without any of the four fails to compile. The ONNX-semantics
// ops (ir/onnx_op_table.h) follow these in OpKind; they have their own
// expansions (dynamic shape rules, O0 interpreter kernels).
//
// X(Enum, "Name"). Scratch memory an op needs comes from the arena; its size
// is an execution concern and lives with the implementation (registry.cc).
#pragma once

#include "ir/onnx_op_table.h"

#define K3_OP_LIST(X)                                                                                             \
  /* [V,D] table, [T] i32 ids -> [T,D]; attr scale (default 1: the rows times scale) */                           \
  X(Embedding, "Embedding")                                                                                       \
  /* [T,D], w[D], b[D] -> [T,D]; attr eps */                                                                      \
  X(LayerNorm, "LayerNorm")                                                                                       \
  /* [T,D], w[G] -> [T,D]; attrs eps, group G (default D: each G-wide group of a row normalized on its own, as a  \
   * per-head q/k norm), clip (default 0: none; else the output clamped to [-clip, clip]) */                      \
  X(RmsNorm, "RmsNorm")                                                                                           \
  /* [T,K] x W[N,K] (+ bias[N]) -> [T,N]  (PyTorch Linear layout); attrs scale (default 1: the output times       \
   * scale), clip (default 0: none; else the output clamped to [-clip, clip]), splits (default none: one output;  \
   * else widths N0, N1, .. adding up to N, each a multiple of 16: outputs [T,N0], [T,N1], .. holding the column  \
   * ranges in order; sibling projections of one input fused into one matrix, passes/fuse_sibling_linears.cc) */  \
  X(Linear, "Linear")                                                                                             \
  /* [T,D] + [T,D] -> [T,D]; attr scale (default 1): a + scale * b */                                             \
  X(Add, "Add")                                                                                                   \
  /* [T,H*hd], positions[T] i32, cos,sin[L,hd/2] -> [T,H*hd]; attr head_dim (rotate-half) */                      \
  X(Rope, "Rope")                                                                                                 \
  /* q[T,Hq*hd], k,v[T,Hkv*hd], positions[T], slots[T], kcache, vcache -> [T,Hq*hd]; attr scale (default          \
   * 1/sqrt(hd)) */                                                                                               \
  X(CachedAttention, "CachedAttention")                                                                           \
  /* x[T,D], gate[E,D], per expert: w_up[F,D] (w_gate[F,D]) w_down[D,F] -> [T,D]; attrs n_experts, top_k, swiglu, \
   * dense, renormalize (default 1: softmax over the chosen; 0: softmax over all experts, chosen weights kept),   \
   * shared (default 0; 1: four more inputs, a SwiGLU shared expert s_up[S,D] s_gate[S,D] s_down[D,S] and its     \
   * gate g[1,D], adding sigmoid(x.g) * shared(x) to every row) */                                                \
  X(Moe, "Moe")                                                                                                   \
  /* x[T,D], rows[R] i32 -> [R,D]  (select the rows whose logits are needed) */                                   \
  X(GatherRows, "GatherRows")

namespace k3::ir {

enum class OpKind : uint8_t {
#define K3_OP_ENUM(e, name) k##e,
  K3_OP_LIST(K3_OP_ENUM)
  K3_ONNX_OP_LIST(K3_OP_ENUM)
#undef K3_OP_ENUM
};

#define K3_OP_COUNT(e, name) +1
// kNumOps counts the fused ops only; they are the ops the static Plan runs.
inline constexpr int kNumOps = 0 K3_OP_LIST(K3_OP_COUNT);
inline constexpr int kNumAllOps = kNumOps K3_ONNX_OP_LIST(K3_OP_COUNT);
#undef K3_OP_COUNT

const char* op_name(OpKind op);
// True for the onnx.* ops of ir/onnx_op_table.h.
inline bool is_onnx_op(OpKind op) { return static_cast<int>(op) >= kNumOps; }

}  // namespace k3::ir
