// `k3 lint`: what in an ONNX model will stop K3 from compiling it well.
//
// Each rule is one small function in lint.cc, registered in one list
// (kRules); a rule looks at the validated, shape-inferred model and appends
// findings. Rules, by id:
//   control-flow          If/Loop/Scan                                   error
//   data-dependent-shape  NonZero                                        error
//                         shape-like input computed at run time          warning
//   unknown-rank          tensor rank unknown after shape inference      warning
//   shape-inference       ONNX shape inference failed or crashed         warning
//                         opset newer than the ONNX library knows        info
//   random-access         GatherND/ScatterND/ScatterElements/...         warning
//                         Gather of run-time indices from an activation  info
//   unsupported-op        op the importer does not know / refuses        error
//   unused-initializer    weights no node reads (the tracing trap)       warning
//   dynamic-input-dim     symbolic or missing dims on graph inputs       info
//   fusion-blocked        LayerNorm->GeLU separated by broadcast/reshape info
//   gelu-near-miss        Erf GeLU pattern with an unexpected constant   info
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "frontend/onnx/onnx_model.h"

namespace k3::onnxfe {

enum class Severity : uint8_t { kError, kWarning, kInfo };
const char* severity_name(Severity s);  // "error", "warning", "info"

struct Finding {
  Severity severity = Severity::kInfo;
  std::string rule;  // rule id, e.g. "control-flow"
  // Node name (or its first output's name when the node is unnamed); a
  // graph input's name for input findings; empty for graph-wide findings.
  std::string node;
  // ONNX op type; "input" for graph-input findings, "graph" for graph-wide ones.
  std::string op_type;
  std::string reason;  // one line
};

struct LintCounts {
  int64_t error = 0;
  int64_t warning = 0;
  int64_t info = 0;
};

// All findings for a model, errors first, then warnings, then infos; within
// a severity in rule order and then graph order. Never fails: a model that
// loaded is lintable.
std::vector<Finding> lint_model(const OnnxModel& model);

LintCounts count_findings(const std::vector<Finding>& findings);

// Human-readable report: one line per finding, "SEVERITY op_type node: reason"
// (names made printable), then a summary line.
std::string format_findings_text(const std::vector<Finding>& findings);
// {"findings":[{"severity","rule","node","op_type","reason"}...],
//  "counts":{"error":n,"warning":n,"info":n}}
std::string format_findings_json(const std::vector<Finding>& findings);

}  // namespace k3::onnxfe
