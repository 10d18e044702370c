// The ordered pass pipeline: which passes run at which --opt-level, and the
// per-pass record that goes into the compile report.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ir/graph.h"
#include "passes/pass.h"
#include "util/status.h"

namespace k3::passes {

struct PassInfo {
  std::string_view name;
  std::string_view summary;
  int min_opt_level;  // runs when --opt-level >= this
};

// Every pass, in pipeline order.
std::vector<PassInfo> list_passes();

struct PipelineOptions {
  int opt_level = 3;                  // 0..3
  std::vector<std::string> disabled;  // pass names (--disable-pass)
  std::string precision = "fp32";     // weight precision (--precision): fp32 | bf16 | bf16-f32 | bf16-mixed | int8
  std::string weight_layout = "rows";  // matrix layout (--weight-layout): rows | panels | tiles (pack-weights)
  std::string kv_dtype = "f32";        // KV cache element type (--kv-dtype): f32 | bf16 (kv-cache-precision)
  // Symbolic input dims fixed by --input-shape (dim_param name -> value),
  // e.g. {"batch", 1}, {"seq", 1}, {"past", 127}; empty: none.
  std::vector<std::pair<std::string, int64_t>> dims = {};
  // The step shape lower-to-plan builds the planned graph for (0 tokens:
  // do not lower; the graph stays on the interpreter).
  struct PlanShape {
    int64_t tokens = 0;    // T: tokens per step
    int64_t out_rows = 0;  // R: logit rows per step
    int64_t slots = 0;     // KV cache slots
    int64_t ctx = 0;       // positions per slot
  } plan = {};
};

// Unknown pass names, an opt level outside 0..3, an unknown precision,
// weight layout or KV cache dtype -> error naming it.
Status check_pipeline_options(const PipelineOptions& options);

struct PassRecord {
  std::string name;
  bool ran = false;  // false: below its opt level or disabled
  bool changed = false;
  int64_t nodes_before = 0;
  int64_t nodes_after = 0;
  double ms = 0;
  PassStats stats;
};

struct PipelineReport {
  std::vector<PassRecord> passes;
};

// Runs the pipeline on g; the graph is verified after every pass that changed
// it, so a pass that breaks an invariant is named.
StatusOr<PipelineReport> run_pipeline(ir::Graph& g, const PipelineOptions& options);

}  // namespace k3::passes
