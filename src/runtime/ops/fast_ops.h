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

// How run_Moe shares a step's experts among the threads (moe_op.cc):
//   kColumns: each expert's columns (too few rows per expert for the
//             others, and the experts chosen do not balance; one thread);
//   kTokens:  each thread its share of the tokens and every expert they
//             chose (run_by_tokens);
//   kExperts: each thread whole experts over all their tokens
//             (run_by_experts): prefill with f32 expert weights (rows
//             or panels) and bf16 panels, and
//             decode where assign_experts balances the chosen experts.
enum class MoeSplit : int32_t { kColumns = 0, kTokens = 1, kExperts = 2 };

// The prefill split run_Moe plans for `rows` tokens on `threads` threads
// with routed experts of `expert_dtype`, before routing (kExperts falls
// back to kTokens when assign_experts finds no balanced assignment).
// kColumns: too few rows for either; after routing, run_Moe still gives
// whole experts to 2 or more threads where assign_experts balances them.
MoeSplit moe_prefill_split(int64_t rows, int64_t top_k, int64_t n_experts, int64_t threads, ir::DType expert_dtype);

// The expert split's assignment: bin_of[e] is expert e's thread, or -1 if
// no row was routed to it (offs: each expert's first grouped row, n_experts
// + 1 of them). Returns false when some thread gets no expert or the
// busiest gets more than 1.1 times the mean cost (rows + 4 an expert).
bool assign_experts(const int32_t* offs, int64_t n_experts, int64_t threads, int32_t* bin_of);

// After run_Moe: the split its last call took.
MoeSplit moe_split_taken(const OpCall& c);

// CachedAttention's workspace: the pieces a decode step hands to the
// threads (attention_op.cc) for up to max_rows tokens of n_heads heads.
uint64_t attention_workspace_bytes(int64_t max_rows, int64_t n_heads, int64_t head_dim);
// After run_CachedAttention: how many pieces its last call handed out (0:
// whole rows, one thread each).
int64_t attention_pieces_taken(const OpCall& c);

// expert_dtype: the routed experts' weight dtype; shared_ff: the shared
// expert's hidden width (0: none).
uint64_t moe_workspace_bytes(int64_t max_rows, int64_t n_experts, int64_t top_k, int64_t d_model, int64_t d_ff,
                             bool swiglu, ir::DType expert_dtype, int64_t shared_ff = 0);

}  // namespace k3::runtime
