// The ordered pass list. Order matters; the comments on each entry say why
// it sits where it does.
#include "passes/pipeline.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>

#include "passes/dead_code.h"
#include "passes/weight_precision.h"

namespace k3::passes {
namespace {

struct Entry {
  int min_opt_level;
  std::function<std::unique_ptr<Pass>(const PipelineOptions&)> make;
};

const std::vector<Entry>& entries() {
  static const std::vector<Entry> list = {
      // dead-code first: every later pattern matcher then sees only nodes
      // that contribute to an output, so "single consumer" guards are not
      // fooled by dead readers, and weights nothing reads are not written
      // to the .k3m.
      {1, [](const PipelineOptions&) { return std::make_unique<DeadCode>(); }},
      // weight-precision last, and at every level (O0 included): it is the
      // user's choice of format, not an optimization, and running it after
      // every rewrite converts exactly the weights that remain.
      {0, [](const PipelineOptions& o) { return std::make_unique<WeightPrecision>(o.precision); }},
  };
  return list;
}

}  // namespace

std::vector<PassInfo> list_passes() {
  std::vector<PassInfo> out;
  for (const Entry& e : entries()) {
    // The names and summaries are string literals in each pass class.
    auto p = e.make(PipelineOptions{});
    out.push_back({p->name(), p->summary(), e.min_opt_level});
  }
  return out;
}

Status check_pipeline_options(const PipelineOptions& options) {
  if (options.opt_level < 0 || options.opt_level > 3)
    return invalid_argument("--opt-level must be 0, 1, 2 or 3 (got " + std::to_string(options.opt_level) + ")");
  if (options.precision != "fp32" && options.precision != "bf16")
    return unimplemented("precision '" + options.precision + "' is not supported (fp32, bf16)");
  const std::vector<PassInfo> known = list_passes();
  for (const std::string& d : options.disabled) {
    const bool found = std::any_of(known.begin(), known.end(), [&](const PassInfo& p) { return p.name == d; });
    if (!found) return invalid_argument("unknown pass '" + d + "' (k3 compile --list-passes lists them)");
  }
  return Status();
}

StatusOr<PipelineReport> run_pipeline(ir::Graph& g, const PipelineOptions& options) {
  K3_RETURN_IF_ERROR(check_pipeline_options(options));
  PipelineReport report;
  for (const Entry& e : entries()) {
    std::unique_ptr<Pass> pass = e.make(options);
    PassRecord rec;
    rec.name = std::string(pass->name());
    rec.nodes_before = static_cast<int64_t>(g.nodes().size());
    const bool disabled =
        std::find(options.disabled.begin(), options.disabled.end(), rec.name) != options.disabled.end();
    if (options.opt_level >= e.min_opt_level && !disabled) {
      const auto t0 = std::chrono::steady_clock::now();
      K3_ASSIGN_OR_RETURN(rec.changed, pass->run(g));
      rec.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      rec.ran = true;
      if (rec.changed) K3_RETURN_IF_ERROR(g.verify().with_context("after pass " + rec.name));
      rec.stats = pass->stats();
    }
    rec.nodes_after = static_cast<int64_t>(g.nodes().size());
    report.passes.push_back(std::move(rec));
  }
  return report;
}

}  // namespace k3::passes
