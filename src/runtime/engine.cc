// Engine: loading, planning and the checked step entry point.
#include "runtime/engine.h"

#include <algorithm>
#include <thread>

#include "compiled/k3m.h"

namespace k3::runtime {

namespace {

Status check_threads(const EngineOptions& o) {
  if (o.threads < 0 || o.threads > 1024) return invalid_argument("--threads must be between 0 (all cores) and 1024");
  return Status();
}

}  // namespace

StatusOr<std::unique_ptr<Engine>> Engine::load(const std::string& path, const EngineOptions& options) {
  K3_RETURN_IF_ERROR(check_threads(options));
  if (options.max_batch < 1 || options.max_batch > 1024)
    return invalid_argument("max batch must be between 1 and 1024");
  if (is_k3m_file(path)) {
    K3mReadOptions ro;
    // Reading into huge pages pays only where the kernel gives them.
    ro.load = options.mmap || !huge_pages_enabled() ? FileLoad::kMap : FileLoad::kRead;
    K3_ASSIGN_OR_RETURN(CompiledModel m, read_k3m(path, ro));
    return create(std::move(m), options);
  }
  CompileOptions co;
  co.batch = options.max_batch;
  co.prefill_chunk = options.prefill_chunk;
  co.ctx_len = options.ctx_len;
  co.moe_dense = options.moe_dense;
  co.pipeline.opt_level = options.opt_level;
  co.pipeline.disabled = options.disabled_passes;
  if (is_onnx_path(path)) {
    K3_ASSIGN_OR_RETURN(CompiledModel m, compile_onnx(path, co));
    return create(std::move(m), options);
  }
  K3_ASSIGN_OR_RETURN(CompiledModel m, compile_checkpoint(path, co));
  return create(std::move(m), options);
}

StatusOr<std::unique_ptr<Engine>> Engine::create(CompiledModel m, const EngineOptions& options) {
  auto e = std::unique_ptr<Engine>(new Engine());
  const ModelConfig& c = m.config;
  const CompiledShapes& s = m.shapes;
  EngineOptions o = options;
  K3_RETURN_IF_ERROR(check_threads(o));
  std::vector<int> cpus;
  if (!o.cpus.empty()) {
    K3_ASSIGN_OR_RETURN(cpus, parse_cpu_list(o.cpus));
    if (o.threads == 0) o.threads = static_cast<int>(cpus.size());
    if (static_cast<size_t>(o.threads) != cpus.size())
      return invalid_argument("--cpus lists " + std::to_string(cpus.size()) + " CPUs for " + std::to_string(o.threads) +
                              " threads: give one CPU per thread");
  }
  if (o.threads == 0) o.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (o.max_batch < 1 || o.max_batch > s.n_slots)
    return invalid_argument("batch " + std::to_string(o.max_batch) + " does not fit the model, compiled for " +
                            std::to_string(s.n_slots) + " sequences (k3 compile --input-shape batch=N)");
  if (o.ctx_len == 0) o.ctx_len = s.ctx_len;
  if (o.ctx_len < 1 || o.ctx_len > s.ctx_len)
    return invalid_argument("context size " + std::to_string(o.ctx_len) + " must be between 1 and " +
                            std::to_string(s.ctx_len) + ", the context the model was compiled for");
  // Options that shape the graphs cannot be changed after compilation; asking
  // for one the model was not compiled with is an error, not a silent no-op.
  if (o.moe_dense)
    for (const ir::Node& n : m.decode.nodes())
      if (n.op == ir::OpKind::kMoe && n.attr_int("dense") == 0)
        return invalid_argument("--moe-dense: this model was compiled without it (k3 compile --moe-dense)");
  // The compiled shapes are what the plans were built for.
  o.max_batch = s.n_slots;
  o.prefill_chunk = s.prefill_tokens;
  e->executor_ = m.executor;
  e->config_ = c;
  e->provenance_ =
      m.reports.empty() ? "compiled from " + m.source + " (" + m.compile_flags + ")" : "checkpoint " + m.source;
  e->storage_ = m.storage;
  e->weights_file_ = m.weights_file;
  e->options_ = o;
  e->kt_ = o.kernels != nullptr ? o.kernels : &kernels::best_table();
  e->pool_ = std::make_unique<ThreadPool>(o.threads, cpus);
  if (m.executor == Executor::kOnnxDecoder) {
    K3_ASSIGN_OR_RETURN(e->onnx_, OnnxDecoder::create(std::move(m.decode), s.n_slots, o.ctx_len));
    if (e->onnx_->vocab_size() != c.vocab_size)
      return invalid_argument("the ONNX graph's logits have " + std::to_string(e->onnx_->vocab_size()) +
                              " entries but the config's vocabulary is " + std::to_string(c.vocab_size));
    e->options_.ctx_len = std::min(o.ctx_len, e->onnx_->max_positions());
    return e;
  }
  // The cache's element type is the one the compiled graphs' cache states
  // declare (kv-cache-precision); Plan::build checks every state against it.
  ir::DType kv_dtype = ir::DType::kF32;
  for (const ir::Value& v : m.decode.values())
    if (v.kind == ir::ValueKind::kState) {
      kv_dtype = v.dtype;
      break;
    }
  K3_RETURN_IF_ERROR(e->cache_.allocate({c.n_layers, s.n_slots, c.n_kv_heads, s.ctx_len, c.head_dim, kv_dtype}));
  K3_ASSIGN_OR_RETURN(e->decode_, Plan::build(std::move(m.decode), e->cache_));
  K3_ASSIGN_OR_RETURN(e->prefill_, Plan::build(std::move(m.prefill), e->cache_));
  if (e->decode_.max_tokens() != s.decode_tokens || e->prefill_.max_tokens() != s.prefill_tokens ||
      e->decode_.max_out_rows() != s.n_slots || e->prefill_.max_out_rows() != s.n_slots)
    return invalid_argument("the model's graphs do not have the step shapes it declares");
  if (!e->arena_.allocate(std::max(e->decode_.arena_bytes(), e->prefill_.arena_bytes())))
    return out_of_range("cannot allocate the activation arena");
  e->decode_.bind_arena(e->arena_.data());
  e->prefill_.bind_arena(e->arena_.data());
  return e;
}

std::string Engine::weights_memory() const {
  if (weights_file_ == nullptr) return "compiled in memory";
  if (weights_file_->load() == FileLoad::kMap) return "mapped from the .k3m (4 KiB page-cache pages)";
  const auto mib = [](uint64_t b) { return std::to_string((b + (uint64_t{1} << 19)) >> 20); };
  // The region is rounded up to whole 2 MiB pages: count no more than the file.
  const uint64_t huge = std::min<uint64_t>(weights_file_->huge_page_bytes(), weights_file_->size());
  return "read from the .k3m, " + mib(huge) + " of " + mib(weights_file_->size()) + " MiB in 2 MiB pages";
}

uint64_t Engine::weight_bytes_per_token() const {
  // The ONNX graph reads what the model needs (its unfused ops may read
  // more or less, depending on routing): the config's count, in f32.
  if (executor_ == Executor::kOnnxDecoder) return static_cast<uint64_t>(config_.params_read_per_token()) * 4;
  const ir::Graph& g = decode_.graph();
  uint64_t bytes = 0;
  for (const ir::Node& n : g.nodes()) {
    switch (n.op) {
      case ir::OpKind::kLinear:
        bytes += g.value(n.inputs[1]).bytes();  // weight (+ bias; a fused residual is an activation)
        if (ir::linear_has_bias(n)) bytes += g.value(n.inputs[2]).bytes();
        break;
      case ir::OpKind::kLayerNorm:
      case ir::OpKind::kRmsNorm:
        for (size_t i = 1; i < n.inputs.size(); ++i) bytes += g.value(n.inputs[i]).bytes();
        break;
      case ir::OpKind::kEmbedding:
        bytes += g.value(n.inputs[0]).row_bytes();
        break;
      case ir::OpKind::kMoe: {
        const int64_t k = n.attr_int("top_k");
        const size_t per = static_cast<size_t>(ir::moe_matrices_per_expert(n));
        uint64_t expert = 0;
        for (size_t j = 0; j < per; ++j) expert += g.value(n.inputs[2 + j]).bytes();
        bytes += g.value(n.inputs[1]).bytes() + static_cast<uint64_t>(k) * expert;
        // A shared expert (and its gate) runs for every token.
        for (size_t i = ir::moe_shared_input(n); i < ir::moe_weights_end(n); ++i) bytes += g.value(n.inputs[i]).bytes();
        break;
      }
      default:
        break;
    }
  }
  return bytes;
}

Status Engine::check_step(const StepInputs& in) const {
  const ModelConfig& c = config();
  if (in.n_tokens < 1 || in.n_tokens > options_.prefill_chunk)
    return invalid_argument("step has " + std::to_string(in.n_tokens) + " tokens; must be 1.." +
                            std::to_string(options_.prefill_chunk));
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
  if (onnx_) return onnx_->step(in);
  Plan& plan = in.n_tokens <= decode_.max_tokens() ? decode_ : prefill_;
  return plan.run(in, *pool_, *kt_, options_.reference, hooks);
}

}  // namespace k3::runtime
