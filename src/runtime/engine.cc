// Engine: loading, planning and the checked step entry point.
#include "runtime/engine.h"

#include <algorithm>
#include <thread>

#include "frontend/checkpoint/build_graph.h"

namespace k3::runtime {

StatusOr<std::unique_ptr<Engine>> Engine::load(const std::string& model_dir, const EngineOptions& options) {
  auto e = std::unique_ptr<Engine>(new Engine());
  K3_ASSIGN_OR_RETURN(e->checkpoint_, Checkpoint::load(model_dir));
  const ModelConfig& c = e->checkpoint_->config();
  EngineOptions o = options;
  if (o.threads < 0 || o.threads > 1024) return invalid_argument("--threads must be between 0 (all cores) and 1024");
  if (o.threads == 0) o.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (o.max_batch < 1 || o.max_batch > 1024) return invalid_argument("max batch must be between 1 and 1024");
  if (o.ctx_len == 0) o.ctx_len = c.max_seq_len;
  if (o.ctx_len < 1 || o.ctx_len > c.max_seq_len)
    return invalid_argument("context size " + std::to_string(o.ctx_len) + " must be between 1 and max_seq_len " +
                            std::to_string(c.max_seq_len));
  if (o.prefill_chunk < 1 || o.prefill_chunk > 8192)
    return invalid_argument("prefill chunk must be between 1 and 8192");
  o.prefill_chunk = std::max(o.prefill_chunk, o.max_batch);
  e->options_ = o;
  e->kt_ = o.kernels != nullptr ? o.kernels : &kernels::best_table();
  e->pool_ = std::make_unique<ThreadPool>(o.threads);
  K3_RETURN_IF_ERROR(e->cache_.allocate({c.n_layers, o.max_batch, c.n_kv_heads, o.ctx_len, c.head_dim}));

  K3_ASSIGN_OR_RETURN(ir::Graph dg,
                      build_graph(*e->checkpoint_, {o.max_batch, o.max_batch, o.max_batch, o.ctx_len}, {o.moe_dense}));
  K3_ASSIGN_OR_RETURN(e->decode_, Plan::build(std::move(dg), e->cache_));
  K3_ASSIGN_OR_RETURN(ir::Graph pg, build_graph(*e->checkpoint_, {o.prefill_chunk, o.max_batch, o.max_batch, o.ctx_len},
                                                {o.moe_dense}));
  K3_ASSIGN_OR_RETURN(e->prefill_, Plan::build(std::move(pg), e->cache_));
  if (!e->arena_.allocate(std::max(e->decode_.arena_bytes(), e->prefill_.arena_bytes())))
    return out_of_range("cannot allocate the activation arena");
  e->decode_.bind_arena(e->arena_.data());
  e->prefill_.bind_arena(e->arena_.data());
  return e;
}

Status Engine::check_step(const StepInputs& in) const {
  const ModelConfig& c = config();
  if (in.n_tokens < 1 || in.n_tokens > prefill_.max_tokens())
    return invalid_argument("step has " + std::to_string(in.n_tokens) + " tokens; must be 1.." +
                            std::to_string(prefill_.max_tokens()));
  if (in.n_out_rows < 0 || in.n_out_rows > options_.max_batch || in.n_out_rows > in.n_tokens)
    return invalid_argument("step asks for " + std::to_string(in.n_out_rows) + " logit rows");
  for (int64_t i = 0; i < in.n_tokens; ++i) {
    if (in.tokens[i] < 0 || in.tokens[i] >= c.vocab_size)
      return out_of_range("token id " + std::to_string(in.tokens[i]) + " is outside the vocabulary (0.." +
                          std::to_string(c.vocab_size - 1) + ")");
    if (in.positions[i] < 0 || in.positions[i] >= options_.ctx_len)
      return out_of_range("position " + std::to_string(in.positions[i]) + " is outside the context (" +
                          std::to_string(options_.ctx_len) + " positions)");
    if (in.slots[i] < 0 || in.slots[i] >= options_.max_batch)
      return out_of_range("slot " + std::to_string(in.slots[i]) + " does not exist");
    for (int64_t j = 0; j < i; ++j)
      if (in.slots[j] == in.slots[i] && in.positions[j] == in.positions[i])
        return invalid_argument("two tokens of one step write the same cache position");
  }
  for (int64_t r = 0; r < in.n_out_rows; ++r)
    if (in.out_rows[r] < 0 || in.out_rows[r] >= in.n_tokens) return out_of_range("logit row index out of range");
  return Status();
}

StatusOr<const float*> Engine::step(const StepInputs& in, StepHooks* hooks) {
  K3_RETURN_IF_ERROR(check_step(in));
  Plan& plan = in.n_tokens <= decode_.max_tokens() ? decode_ : prefill_;
  return plan.run(in, *pool_, *kt_, options_.reference, hooks);
}

}  // namespace k3::runtime
