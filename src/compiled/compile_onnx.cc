// The compile driver for ONNX decoder models: load and validate the file,
// import it into the onnx dialect, run the pass pipeline.
#include <algorithm>
#include <string>

#include "compiled/compiled_model.h"
#include "frontend/onnx/import.h"
#include "frontend/onnx/onnx_model.h"

namespace k3 {
namespace {

// The model's config.json, which K3's exporter records in the metadata.
StatusOr<ModelConfig> onnx_config(const onnxfe::OnnxModel& model, const std::string& path) {
  for (const auto& p : model.proto().metadata_props())
    if (p.key() == "k3.source_config") {
      StatusOr<ModelConfig> c = parse_config(p.value());
      if (!c.ok()) return c.status().with_context("k3.source_config of " + path);
      return c;
    }
  return invalid_argument(path +
                          " has no k3.source_config metadata (the model config; python/k3ref/export_onnx.py "
                          "records it)");
}

}  // namespace

bool is_onnx_path(const std::string& path) {
  return path.size() >= 5 && path.compare(path.size() - 5, 5, ".onnx") == 0;
}

StatusOr<CompiledModel> compile_onnx(const std::string& path, const CompileOptions& options) {
  K3_ASSIGN_OR_RETURN(onnxfe::OnnxModel model, onnxfe::OnnxModel::load(path));
  K3_ASSIGN_OR_RETURN(ModelConfig c, onnx_config(model, path));
  K3_RETURN_IF_ERROR(check_compile_options(options, c));
  if (options.moe_dense)
    return invalid_argument("--moe-dense applies to checkpoints; an ONNX graph's MoE is as exported");
  K3_ASSIGN_OR_RETURN(ir::Graph g, onnxfe::import_onnx(model));
  passes::PipelineOptions pipeline = options.pipeline;
  pipeline.precision = options.precision;
  CompiledModel m;
  m.config = c;
  m.source = path;
  m.opt_level = pipeline.opt_level;
  m.executor = Executor::kOnnxDecoder;
  m.shapes.n_slots = options.batch;
  m.shapes.decode_tokens = options.batch;
  m.shapes.prefill_tokens = std::max(options.prefill_chunk, options.batch);
  m.shapes.ctx_len = options.ctx_len == 0 ? c.max_seq_len : options.ctx_len;
  // One pipeline run per step shape: lower-to-plan builds the planned graph
  // for that shape when it can (then the model runs on the plan);
  // otherwise the decode run's graph stays on the interpreter.
  ir::Graph prefill = g;
  const CompiledShapes& s = m.shapes;
  pipeline.plan = {s.decode_tokens, s.n_slots, s.n_slots, s.ctx_len};
  K3_ASSIGN_OR_RETURN(passes::PipelineReport report, passes::run_pipeline(g, pipeline));
  m.reports.emplace_back("decode", std::move(report));
  const bool planned =
      std::none_of(g.nodes().begin(), g.nodes().end(), [](const ir::Node& n) { return ir::is_onnx_op(n.op); });
  if (planned) {
    // The runtime sizes the KV cache from the config: the graph must agree.
    int64_t layers = 0;
    for (const ir::Node& n : g.nodes()) {
      if (n.op != ir::OpKind::kCachedAttention) continue;
      ++layers;
      if (n.attr_int("n_heads") != c.n_heads || n.attr_int("n_kv_heads") != c.n_kv_heads ||
          n.attr_int("head_dim") != c.head_dim)
        return invalid_argument("attention " + n.name + " has other head counts than the model's k3.source_config");
    }
    if (layers != c.n_layers)
      return invalid_argument("the graph has " + std::to_string(layers) + " attention layers, its config " +
                              std::to_string(c.n_layers));
    pipeline.plan.tokens = s.prefill_tokens;
    K3_ASSIGN_OR_RETURN(passes::PipelineReport rp, passes::run_pipeline(prefill, pipeline));
    const bool ok = std::none_of(prefill.nodes().begin(), prefill.nodes().end(),
                                 [](const ir::Node& n) { return ir::is_onnx_op(n.op); });
    if (!ok) return internal_error("the decode graph was lowered to the plan but the prefill graph was not");
    m.reports.emplace_back("prefill", std::move(rp));
    m.executor = Executor::kPlan;
    m.prefill = std::move(prefill);
  } else if (pipeline.kv_dtype != "f32") {
    // The interpreter keeps the graph's own cache tensors: the option would
    // silently do nothing.
    return invalid_argument("--kv-dtype " + pipeline.kv_dtype +
                            ": this graph stays on the ONNX interpreter (not lowered to the planned executor; "
                            "compile at -O3), whose cache is the graph's own f32 tensors");
  }
  m.decode = std::move(g);
  std::string dims;
  for (const auto& [name, value] : pipeline.dims) dims += " " + name + "=" + std::to_string(value);
  m.compile_flags = "onnx batch=" + std::to_string(m.shapes.n_slots) + " ctx=" + std::to_string(m.shapes.ctx_len) +
                    dims + " precision=" + options.precision + " opt-level=" + std::to_string(pipeline.opt_level) +
                    (pipeline.weight_layout != "rows" ? " weight-layout=" + pipeline.weight_layout : "") +
                    (pipeline.kv_dtype != "f32" ? " kv-dtype=" + pipeline.kv_dtype : "");
  return m;
}

}  // namespace k3
