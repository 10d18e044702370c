// An execution plan: a verified graph with every tensor bound to memory.
//
// Built once at load: activations and op workspaces get offsets in one arena
// from a lifetime-based planner (buffers whose lifetimes do not overlap share
// bytes), weights point at the model, state values at the KV cache. A step
// only writes its inputs into the arena and calls each node's function.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/graph.h"
#include "runtime/kv_cache.h"
#include "runtime/ops/op_call.h"

namespace k3::runtime {

struct ArenaLayout {
  std::vector<int64_t> value_offset;  // per value; -1 if not in the arena
  std::vector<int64_t> node_workspace_offset;  // per node; -1 if none
  uint64_t peak_bytes = 0;     // arena size with reuse
  uint64_t no_reuse_bytes = 0;  // sum of all buffers (what per-op allocation would take)
};

// Lifetime-based placement: largest buffers first, each at the lowest offset
// that does not overlap a placed buffer whose lifetime intersects its own.
ArenaLayout plan_arena(const ir::Graph& g);

struct StepInputs {
  const int32_t* tokens = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* slots = nullptr;
  int64_t n_tokens = 0;
  const int32_t* out_rows = nullptr;
  int64_t n_out_rows = 0;
};

// Optional per-node hooks for the profiler and the tensor dumper. When no
// hooks are passed the executor makes no calls at all.
class StepHooks {
 public:
  virtual ~StepHooks() = default;
  virtual void before_node(size_t index, const ir::Node& node) {}
  virtual void after_node(size_t index, const ir::Node& node, const TensorArg* outputs, size_t n_outputs) {}
  // The whole call (inputs, outputs, workspace) after it ran: for statistics
  // that need what the op saw, such as the experts a MoE step routed to.
  virtual void after_call(size_t index, const OpCall& call) {}
};

class Plan {
 public:
  Plan() = default;
  // Takes the graph; binds state values named "layers.{l}.k_cache"/"v_cache"
  // to `cache`. The arena is bound separately (plans can share one).
  static StatusOr<Plan> build(ir::Graph graph, const KvCache& cache);
  uint64_t arena_bytes() const { return layout_.peak_bytes; }
  const ArenaLayout& layout() const { return layout_; }
  const ir::Graph& graph() const { return graph_; }
  int64_t max_tokens() const { return max_tokens_; }
  int64_t max_out_rows() const { return max_out_rows_; }
  void bind_arena(uint8_t* arena);

  // Runs one step. `reference` runs the scalar reference op implementations.
  // Returns the graph output (logits [n_out_rows, V]), valid until the next step.
  const float* run(const StepInputs& in, ThreadPool& pool, const kernels::KernelTable& kt, bool reference = false,
                   StepHooks* hooks = nullptr);

 private:
  struct BoundNode {
    const ir::Node* node;
    OpFn fast;
    OpFn ref;
    size_t first_arg;  // into args_: inputs then outputs
    void* workspace;
  };
  ir::Graph graph_;
  ArenaLayout layout_;
  std::vector<TensorArg> args_;
  std::vector<BoundNode> nodes_;
  std::vector<void*> state_ptr_;  // per value
  int input_ids_[4] = {-1, -1, -1, -1};  // tokens, positions, slots, out_rows
  int output_id_ = -1;
  int64_t max_tokens_ = 0, max_out_rows_ = 0;
  uint8_t* arena_ = nullptr;
};

}  // namespace k3::runtime
