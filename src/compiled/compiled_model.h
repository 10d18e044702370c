// A compiled model: the model configuration, the step graphs after the pass
// pipeline (one per step shape), and what keeps their weights alive. `k3
// compile` writes it as a .k3m file; the runtime builds plans from it,
// whether it came from a .k3m or was compiled in memory from a checkpoint.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "frontend/checkpoint/config.h"
#include "ir/graph.h"
#include "passes/pipeline.h"
#include "util/mapped_file.h"

namespace k3 {

// The shapes the graphs were specialized for (the article's --input_shape).
struct CompiledShapes {
  int64_t n_slots = 1;           // KV cache slots = sequences decoded together
  int64_t decode_tokens = 1;     // tokens per decode step (= n_slots)
  int64_t prefill_tokens = 128;  // tokens per prefill step (chunk)
  int64_t ctx_len = 0;           // KV cache positions per slot
};

// How the runtime executes a compiled model's graphs.
enum class Executor : uint8_t {
  // Fused ops with static shapes: the planned executor (preallocated arena,
  // fixed-slot KV cache), one graph per step shape.
  kPlan,
  // An imported ONNX decoder graph still in the onnx dialect (input_ids,
  // position_ids, past_* -> logits, present_*), run op by op by the O0
  // interpreter with the cache concatenated per step: the article's naive
  // baseline. `decode` holds it (it serves prefill too); `prefill` is empty.
  kOnnxDecoder,
};
const char* executor_name(Executor e);

struct CompiledModel {
  ModelConfig config;
  CompiledShapes shapes;
  Executor executor = Executor::kPlan;
  ir::Graph decode;
  ir::Graph prefill;
  std::string source;         // what it was compiled from (path)
  std::string compile_flags;  // the options, one line, for provenance
  int opt_level = 3;
  // Per graph ("decode", "prefill"): what each pass did. Empty when loaded
  // from a .k3m (the report was written at compile time).
  std::vector<std::pair<std::string, passes::PipelineReport>> reports;
  // Owns the memory the weight values point into (checkpoint or mapping).
  std::shared_ptr<const void> storage;
  // The .k3m file the weights live in (owned by `storage`); nullptr when
  // the model was compiled in memory.
  const MappedFile* weights_file = nullptr;
};

struct CompileOptions {
  int64_t batch = 1;            // KV slots and decode rows
  int64_t prefill_chunk = 128;  // tokens per prefill step
  int64_t ctx_len = 0;          // 0 = the model's max_seq_len
  bool moe_dense = false;       // the article's dense one-hot-mask MoE
  std::string precision = "fp32";
  passes::PipelineOptions pipeline;
};

// Validates the options against the config (one-line errors naming the flag).
Status check_compile_options(const CompileOptions& options, const ModelConfig& config);

// Checkpoint directory -> graphs for the decode and prefill step shapes ->
// pass pipeline. Used by `k3 compile` and by the engine when it is given a
// checkpoint directory instead of a .k3m.
StatusOr<CompiledModel> compile_checkpoint(const std::string& dir, const CompileOptions& options);

// True for a path ending in ".onnx".
bool is_onnx_path(const std::string& path);

// ONNX decoder model (python/k3ref/export_onnx.py, either style) -> import
// -> pass pipeline (options.pipeline.dims specializes named dims). The
// model's config comes from its k3.source_config metadata. Until the
// lowering passes turn the onnx dialect into fused ops, the result runs
// with Executor::kOnnxDecoder.
StatusOr<CompiledModel> compile_onnx(const std::string& path, const CompileOptions& options);

}  // namespace k3
