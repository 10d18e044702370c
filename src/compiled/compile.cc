// The compile driver for K3 checkpoints: build the step graphs, run the
// pass pipeline on each.
#include <memory>

#include "compiled/compiled_model.h"
#include "frontend/checkpoint/build_graph.h"
#include "frontend/checkpoint/checkpoint.h"

namespace k3 {

const char* executor_name(Executor e) {
  switch (e) {
    case Executor::kPlan:
      return "plan";
    case Executor::kOnnxDecoder:
      return "onnx-decoder";
  }
  return "?";
}

Status check_compile_options(const CompileOptions& o, const ModelConfig& c) {
  if (o.batch < 1 || o.batch > 1024) return invalid_argument("batch must be between 1 and 1024");
  if (o.prefill_chunk < 1 || o.prefill_chunk > 8192)
    return invalid_argument("prefill chunk must be between 1 and 8192");
  const int64_t ctx = o.ctx_len == 0 ? c.max_seq_len : o.ctx_len;
  if (ctx < 1 || ctx > c.max_seq_len)
    return invalid_argument("context size " + std::to_string(ctx) + " must be between 1 and max_seq_len " +
                            std::to_string(c.max_seq_len));
  if (o.pipeline.weight_layout == "tiles" && o.precision != "bf16")
    return invalid_argument("--weight-layout tiles lays out bf16 dot-product weights: it needs --precision bf16");
  passes::PipelineOptions p = o.pipeline;
  p.precision = o.precision;  // compile_checkpoint hands it to the pipeline below
  return passes::check_pipeline_options(p);
}

StatusOr<CompiledModel> compile_checkpoint(const std::string& dir, const CompileOptions& options) {
  K3_ASSIGN_OR_RETURN(std::shared_ptr<Checkpoint> ck, Checkpoint::load(dir));
  const ModelConfig& c = ck->config();
  K3_RETURN_IF_ERROR(check_compile_options(options, c));
  passes::PipelineOptions pipeline = options.pipeline;
  pipeline.precision = options.precision;
  CompiledModel m;
  m.config = c;
  m.source = dir;
  m.opt_level = options.pipeline.opt_level;
  m.shapes.n_slots = options.batch;
  m.shapes.decode_tokens = options.batch;
  // A prefill step must fit a whole decode step's tokens too (one plan
  // serves any step larger than a decode step).
  m.shapes.prefill_tokens = std::max(options.prefill_chunk, options.batch);
  m.shapes.ctx_len = options.ctx_len == 0 ? c.max_seq_len : options.ctx_len;
  const BuildOptions build{options.moe_dense};
  const CompiledShapes& s = m.shapes;
  K3_ASSIGN_OR_RETURN(m.decode, build_graph(*ck, {s.decode_tokens, s.n_slots, s.n_slots, s.ctx_len}, build));
  K3_ASSIGN_OR_RETURN(m.prefill, build_graph(*ck, {s.prefill_tokens, s.n_slots, s.n_slots, s.ctx_len}, build));
  K3_ASSIGN_OR_RETURN(passes::PipelineReport rd, passes::run_pipeline(m.decode, pipeline));
  K3_ASSIGN_OR_RETURN(passes::PipelineReport rp, passes::run_pipeline(m.prefill, pipeline));
  m.reports.emplace_back("decode", std::move(rd));
  m.reports.emplace_back("prefill", std::move(rp));
  m.compile_flags =
      "batch=" + std::to_string(s.n_slots) + " seq=" + std::to_string(s.prefill_tokens) +
      " ctx=" + std::to_string(s.ctx_len) + " precision=" + options.precision +
      " opt-level=" + std::to_string(options.pipeline.opt_level) +
      (options.pipeline.weight_layout != "rows" ? " weight-layout=" + options.pipeline.weight_layout : "") +
      (options.pipeline.kv_dtype != "f32" ? " kv-dtype=" + options.pipeline.kv_dtype : "") +
      (options.moe_dense ? " moe-dense" : "");
  m.storage = ck;
  return m;
}

}  // namespace k3
