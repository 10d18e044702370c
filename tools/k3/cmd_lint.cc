// k3 lint: report what in an ONNX model will stop K3 from compiling it (or
// from compiling it well): control flow, data-dependent shapes, unsupported
// ops, unused weights, dynamic input dims, near-miss fusion patterns.
// Exit codes: 0 = linted (findings or not), 1 = --strict and an error-level
// finding; a model that cannot be loaded is reported as "k3: error: ...".
#include <cstdio>
#include <memory>
#include <string>

#include "commands.h"
#include "frontend/onnx/lint.h"

namespace k3::cli {
namespace {

struct LintFlags {
  std::string model;
  bool json = false;
  bool strict = false;
};

int run_lint(const LintFlags& f) {
  auto model = onnxfe::OnnxModel::load(f.model);
  if (!model.ok()) return report(model.status());
  const std::vector<onnxfe::Finding> findings = onnxfe::lint_model(*model);
  if (f.json) {
    std::printf("%s\n", onnxfe::format_findings_json(findings).c_str());
  } else {
    std::fputs(onnxfe::format_findings_text(findings).c_str(), stdout);
  }
  return f.strict && onnxfe::count_findings(findings).error > 0 ? 1 : 0;
}

}  // namespace

Registered add_lint(CLI::App& app) {
  auto f = std::make_shared<LintFlags>();
  CLI::App* sub = app.add_subcommand("lint", "Check an ONNX model for what K3 cannot compile (or compile well)");
  sub->add_option("model", f->model, "The .onnx file")->required();
  sub->add_flag("--json", f->json, "Print one JSON object: {\"findings\": [...], \"counts\": {...}}");
  sub->add_flag("--strict", f->strict, "Exit 1 if there is any error-level finding");
  return {sub, [f]() { return run_lint(*f); }};
}

}  // namespace k3::cli
