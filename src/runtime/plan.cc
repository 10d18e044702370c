// Arena planning, binding and the step executor.
#include "runtime/plan.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "util/checked.h"

namespace k3::runtime {

ArenaLayout plan_arena(const ir::Graph& g) {
  const auto& values = g.values();
  const auto& nodes = g.nodes();
  const int end = static_cast<int>(nodes.size());
  struct Buf {
    uint64_t bytes;
    int first, last;  // node indices, inclusive
    int value;        // value id, or -1 - node for a workspace
    int64_t offset = -1;
  };
  std::vector<Buf> bufs;
  std::vector<int> last_use(values.size(), -1);
  for (int ni = 0; ni < end; ++ni)
    for (int in : nodes[static_cast<size_t>(ni)].inputs)
      if (in >= 0) last_use[static_cast<size_t>(in)] = ni;
  for (size_t vi = 0; vi < values.size(); ++vi) {
    const ir::Value& v = values[vi];
    if (v.kind == ir::ValueKind::kInput) {
      bufs.push_back({v.bytes(), -1, end, static_cast<int>(vi)});
    } else if (v.kind == ir::ValueKind::kActivation) {
      const int last = v.is_output ? end : std::max(last_use[vi], v.producer);
      bufs.push_back({v.bytes(), v.producer, last, static_cast<int>(vi)});
    }
  }
  for (int ni = 0; ni < end; ++ni) {
    const uint64_t ws = op_workspace_bytes(g, nodes[static_cast<size_t>(ni)]);
    if (ws > 0) bufs.push_back({ws, ni, ni, -1 - ni});
  }
  ArenaLayout layout;
  layout.value_offset.assign(values.size(), -1);
  layout.node_workspace_offset.assign(nodes.size(), -1);
  std::vector<size_t> order(bufs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return bufs[a].bytes > bufs[b].bytes; });
  std::vector<size_t> placed;
  for (size_t i : order) {
    Buf& b = bufs[i];
    const uint64_t size = align_up(std::max<uint64_t>(b.bytes, 1), 64);
    layout.no_reuse_bytes += size;
    // Candidate offsets: 0 and the end of every conflicting placed buffer.
    std::vector<std::pair<uint64_t, uint64_t>> busy;
    for (size_t j : placed) {
      const Buf& o = bufs[j];
      if (o.first <= b.last && b.first <= o.last)
        busy.emplace_back(static_cast<uint64_t>(o.offset), static_cast<uint64_t>(o.offset) + align_up(std::max<uint64_t>(o.bytes, 1), 64));
    }
    std::sort(busy.begin(), busy.end());
    uint64_t at = 0;
    for (const auto& [lo, hi] : busy) {
      if (at + size <= lo) break;
      at = std::max(at, hi);
    }
    b.offset = static_cast<int64_t>(at);
    layout.peak_bytes = std::max(layout.peak_bytes, at + size);
    placed.push_back(i);
    if (b.value >= 0) layout.value_offset[static_cast<size_t>(b.value)] = b.offset;
    else layout.node_workspace_offset[static_cast<size_t>(-1 - b.value)] = b.offset;
  }
  return layout;
}

StatusOr<Plan> Plan::build(ir::Graph graph, const KvCache& cache) {
  // The static plan sizes every buffer ahead: onnx.* ops (dynamic shapes,
  // no fast kernels) must be fused away first or run by the O0 interpreter.
  for (const ir::Node& n : graph.nodes())
    if (ir::is_onnx_op(n.op))
      return unimplemented("node " + n.name + ": " + ir::op_name(n.op) +
                           " is not supported by the static plan (run it with the O0 interpreter)");
  for (const ir::Value& v : graph.values())
    if (v.has_unknown_dims())
      return unimplemented("value " + v.name + " has dims unknown at compile time " + ir::shape_to_string(v.shape) +
                           "; the static plan needs static shapes");
  K3_RETURN_IF_ERROR(graph.verify());
  Plan p;
  p.graph_ = std::move(graph);
  const ir::Graph& g = p.graph_;
  p.layout_ = plan_arena(g);
  const char* names[4] = {"tokens", "positions", "slots", "out_rows"};
  for (int i = 0; i < 4; ++i) {
    p.input_ids_[i] = g.find_value(names[i]);
    if (p.input_ids_[i] < 0 || g.value(p.input_ids_[i]).kind != ir::ValueKind::kInput)
      return invalid_argument(std::string("graph has no input named ") + names[i]);
  }
  if (g.outputs().size() != 1) return invalid_argument("graph must have exactly one output (logits)");
  p.output_id_ = g.outputs()[0];
  p.max_tokens_ = g.value(p.input_ids_[0]).shape[0];
  p.max_out_rows_ = g.value(p.input_ids_[3]).shape[0];

  p.state_ptr_.assign(g.values().size(), nullptr);
  const KvCacheShape& cs = cache.shape();
  for (size_t vi = 0; vi < g.values().size(); ++vi) {
    const ir::Value& v = g.values()[vi];
    if (v.kind != ir::ValueKind::kState) continue;
    // "layers.{l}.k_cache" / "layers.{l}.v_cache"
    int64_t layer = -1;
    char kind = 0;
    if (std::sscanf(v.name.c_str(), "layers.%ld.%c_cache", &layer, &kind) != 2 || layer < 0 || layer >= cs.n_layers ||
        (kind != 'k' && kind != 'v'))
      return invalid_argument("state value " + v.name + " does not name a KV cache layer");
    if (v.shape != std::vector<int64_t>{cs.n_slots, cs.n_kv_heads, cs.max_seq, cs.head_dim})
      return invalid_argument("state value " + v.name + " does not match the KV cache shape");
    if (v.dtype != cs.dtype)
      return invalid_argument("state value " + v.name + " is " + std::string(ir::dtype_name(v.dtype)) +
                              " but the KV cache is " + std::string(ir::dtype_name(cs.dtype)));
    p.state_ptr_[vi] = kind == 'k' ? cache.k(layer) : cache.v(layer);
  }
  for (const ir::Node& n : g.nodes()) {
    BoundNode b{&n, fast_op(n.op), ref_op(n.op), p.args_.size(), nullptr};
    for (int id : n.inputs) p.args_.push_back({nullptr, &g.value(id), 0});
    for (int id : n.outputs) p.args_.push_back({nullptr, &g.value(id), 0});
    p.nodes_.push_back(b);
  }
  return p;
}

void Plan::bind_arena(uint8_t* arena) {
  arena_ = arena;
  const ir::Graph& g = graph_;
  for (size_t ni = 0; ni < nodes_.size(); ++ni) {
    BoundNode& b = nodes_[ni];
    const int64_t ws = layout_.node_workspace_offset[ni];
    b.workspace = ws >= 0 ? arena + ws : nullptr;
    size_t a = b.first_arg;
    auto bind = [&](int id) {
      const ir::Value& v = g.value(id);
      void* ptr = nullptr;
      switch (v.kind) {
        case ir::ValueKind::kWeight: ptr = const_cast<void*>(v.data); break;
        case ir::ValueKind::kState: ptr = state_ptr_[static_cast<size_t>(id)]; break;
        default: ptr = arena + layout_.value_offset[static_cast<size_t>(id)]; break;
      }
      args_[a++].data = ptr;
    };
    for (int id : b.node->inputs) bind(id);
    for (int id : b.node->outputs) bind(id);
  }
}

const float* Plan::run(const StepInputs& in, ThreadPool& pool, const kernels::KernelTable& kt, bool reference,
                       StepHooks* hooks) {
  K3_CHECK(arena_ != nullptr && in.n_tokens <= max_tokens_ && in.n_out_rows <= max_out_rows_);
  const int32_t* src[4] = {in.tokens, in.positions, in.slots, in.out_rows};
  for (int i = 0; i < 4; ++i) {
    const int64_t n = i == 3 ? in.n_out_rows : in.n_tokens;
    if (n > 0) std::memcpy(arena_ + layout_.value_offset[static_cast<size_t>(input_ids_[i])], src[i], static_cast<size_t>(n) * 4);
  }
  for (size_t ni = 0; ni < nodes_.size(); ++ni) {
    const BoundNode& b = nodes_[ni];
    const size_t n_args = b.node->inputs.size() + b.node->outputs.size();
    for (size_t a = b.first_arg; a < b.first_arg + n_args; ++a) {
      TensorArg& t = args_[a];
      switch (t.value->row_dim) {
        case ir::RowDim::kTokens: t.rows = in.n_tokens; break;
        case ir::RowDim::kOutRows: t.rows = in.n_out_rows; break;
        case ir::RowDim::kFixed: t.rows = t.value->shape.empty() ? 1 : t.value->shape[0]; break;
      }
    }
    OpCall call{b.node, &args_[b.first_arg], &args_[b.first_arg + b.node->inputs.size()], b.workspace, &pool, &kt};
    if (hooks != nullptr) hooks->before_node(ni, *b.node);
    (reference ? b.ref : b.fast)(call);
    if (hooks != nullptr) {
      hooks->after_node(ni, *b.node, call.out, b.node->outputs.size());
      hooks->after_call(ni, call);
    }
  }
  return reinterpret_cast<const float*>(arena_ + layout_.value_offset[static_cast<size_t>(output_id_)]);
}

}  // namespace k3::runtime
