// Declarations of the optimized op implementations, one per op of
// ir/op_table.h (expanded from the X-macro so none can be forgotten).
#pragma once

#include "runtime/ops/op_call.h"

namespace k3::runtime {

#define K3_OP_DECLARE_FAST(e, name) void run_##e(const OpCall& c);
K3_OP_LIST(K3_OP_DECLARE_FAST)
#undef K3_OP_DECLARE_FAST

// After run_Moe: how many distinct experts the step routed tokens to (read
// from the routing table the op left in its workspace).
int64_t moe_active_experts(const OpCall& c);

// Whether run_Moe splits `rows` tokens across `threads` threads, each
// running every expert its share routes to (moe_op.cc, run_by_tokens),
// rather than splitting each expert's columns.
bool moe_splits_tokens(int64_t rows, int64_t top_k, int64_t n_experts, int64_t threads);

// expert_dtype: the routed experts' weight dtype; shared_ff: the shared
// expert's hidden width (0: none).
uint64_t moe_workspace_bytes(int64_t max_rows, int64_t n_experts, int64_t top_k, int64_t d_model, int64_t d_ff,
                             bool swiglu, ir::DType expert_dtype, int64_t shared_ff = 0);

}  // namespace k3::runtime
