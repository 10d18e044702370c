// Checkpoint -> IR: the K3 forward pass as a graph for one step shape.
#pragma once

#include <cstdint>

#include "frontend/checkpoint/checkpoint.h"
#include "ir/graph.h"

namespace k3 {

struct StepShape {
  int64_t max_tokens = 1;    // T: tokens processed in one step
  int64_t max_out_rows = 1;  // R: rows whose logits the step returns
  int64_t n_slots = 1;       // KV cache slots (sequences decoded together)
  int64_t ctx_len = 0;       // positions per slot (<= max_seq_len)
};

struct BuildOptions {
  // The article's MoE: every expert computes every token and the unchosen
  // ones are masked to weight 0. Reads all experts' weights each step; kept
  // to measure against the default (only the routed experts run).
  bool moe_dense = false;
};

// Graph inputs: "tokens", "positions", "slots" [T] i32 and "out_rows" [R] i32;
// state: "layers.{l}.k_cache"/"v_cache" [S, Hkv, ctx, hd]; output "logits" [R, V].
StatusOr<ir::Graph> build_graph(const Checkpoint& ck, const StepShape& shape, const BuildOptions& options = {});

}  // namespace k3
