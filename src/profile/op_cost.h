// What one node of a step costs on paper: bytes it reads and writes, and the
// floating-point operations it computes, from the graph's shapes and dtypes
// and the step's actual row counts.
//
// The profiler divides these by measured op times to get achieved GB/s and
// GFLOP/s, and compares the op's arithmetic intensity (flops per byte) with
// the machine's ridge point to say whether it is memory- or compute-bound.
//
// Counting rules (what "bytes" means here):
//  - Bytes are the tensor bytes the op's loops touch once: weights, input and
//    output rows actually used this step (the leading dimension follows the
//    step's token or output-row count, not the plan's maximum). Arena scratch
//    (workspaces) is not counted: it is small and stays in cache.
//  - Linear: the whole weight, the input rows and the output rows.
//  - Moe: the gate plus the experts that actually ran. At one token that is
//    top_k experts. For more tokens the caller passes the number of distinct
//    experts the step routed to when it knows it (the profiler reads it from
//    the op's routing table); otherwise min(E, tokens * top_k) is counted, an
//    upper estimate.
//  - CachedAttention: per token, K and V rows of positions 0..p of its slot
//    for every KV head (query heads of one group share the rows, so they are
//    counted once), plus the token's q/k/v rows and its cache writes. In a
//    prefill chunk tokens of one slot re-read overlapping positions; each
//    token's reads are counted, as the loops perform them (much of it hits
//    cache, so achieved "GB/s" can exceed DRAM bandwidth there).
//  - Flops of the norms, Rope and attention's softmax are approximate
//    (a fixed count per element); matrix-product flops are exact (2*M*N*K).
#pragma once

#include <cstdint>

#include "ir/graph.h"

namespace k3::profile {

struct OpCost {
  double bytes_read = 0;
  double bytes_written = 0;
  double flops = 0;

  double bytes() const { return bytes_read + bytes_written; }
  // Arithmetic intensity in flops per byte (0 for pure data movement).
  double intensity() const { return bytes() > 0 ? flops / bytes() : 0.0; }
};

// The run-time counts of one step that op costs depend on.
struct StepCounts {
  int64_t tokens = 1;        // rows of RowDim::kTokens values
  int64_t out_rows = 1;      // rows of RowDim::kOutRows values
  int64_t kv_positions = 1;  // sum over the step's tokens of positions attended (p + 1 for a token at p)
  int64_t moe_experts = -1;  // distinct experts a Moe node ran; -1 = unknown (estimate)
};

// Cost of `node` for a step described by `counts`.
OpCost op_cost(const ir::Graph& g, const ir::Node& node, const StepCounts& counts);

// Convenience form: every token attends `context_len` cached positions (its
// own included), and Moe expert counts are estimated as described above.
OpCost op_cost(const ir::Graph& g, const ir::Node& node, int64_t tokens, int64_t out_rows, int64_t context_len);

// Experts a Moe node is counted as reading when the routing is unknown:
// top_k at one token, else min(n_experts, tokens * top_k).
int64_t estimated_moe_experts(const ir::Node& node, int64_t tokens);

}  // namespace k3::profile
