// The one list of ONNX op types the ONNX frontend knows about.
//
// `k3 lint` checks every node against this list, and the importer (which
// turns ONNX into K3's graph IR) is written against it, so the two cannot
// disagree about what K3 accepts. Ops are what PyTorch's exporters produce for
// a decoder-only transformer (with MoE routing), plus the common ops we know
// we refuse, so that the lint can say "recognized, not importable" instead of
// "unknown" for them.
//
// Only the default domain ("" or "ai.onnx") is listed: an op from any other
// domain (com.microsoft, custom) is unknown to K3.
#pragma once

#include <string_view>

namespace k3::onnxfe {

enum class OpSupport : unsigned char {
  // The importer maps it to IR ops, folds it at compile time (shape
  // arithmetic on constants), or drops it (Identity, Dropout).
  kImportable,
  // Known op that the importer refuses; `note` says why.
  kRecognized,
};

struct OnnxOpInfo {
  std::string_view op_type;
  OpSupport support;
  // For kRecognized: why it is refused. A non-empty `reported_by` names the
  // lint rule that already reports the op at error level with a more
  // specific reason, so the unsupported-op rule stays quiet about it.
  std::string_view note;
  std::string_view reported_by;
};

// Grouped by kind; lookups are a linear scan over ~100
// entries, done once per node at lint/import time.
inline constexpr OnnxOpInfo kOnnxOps[] = {
    // Elementwise arithmetic and activations.
    {"Add", OpSupport::kImportable, "", ""},
    {"Sub", OpSupport::kImportable, "", ""},
    {"Mul", OpSupport::kImportable, "", ""},
    {"Div", OpSupport::kImportable, "", ""},
    {"Pow", OpSupport::kImportable, "", ""},
    {"Sqrt", OpSupport::kImportable, "", ""},
    {"Reciprocal", OpSupport::kImportable, "", ""},
    {"Neg", OpSupport::kImportable, "", ""},
    {"Abs", OpSupport::kImportable, "", ""},
    {"Exp", OpSupport::kImportable, "", ""},
    {"Log", OpSupport::kImportable, "", ""},
    {"Erf", OpSupport::kImportable, "", ""},
    {"Tanh", OpSupport::kImportable, "", ""},
    {"Sigmoid", OpSupport::kImportable, "", ""},
    {"Relu", OpSupport::kImportable, "", ""},
    {"Gelu", OpSupport::kImportable, "", ""},
    {"Softmax", OpSupport::kImportable, "", ""},
    {"LogSoftmax", OpSupport::kImportable, "", ""},
    {"Cos", OpSupport::kImportable, "", ""},
    {"Sin", OpSupport::kImportable, "", ""},
    {"Max", OpSupport::kImportable, "", ""},
    {"Min", OpSupport::kImportable, "", ""},
    {"Clip", OpSupport::kImportable, "", ""},
    {"Floor", OpSupport::kImportable, "", ""},
    {"Ceil", OpSupport::kImportable, "", ""},
    {"Mod", OpSupport::kImportable, "", ""},
    // Comparison and logic (masks, MoE routing).
    {"Equal", OpSupport::kImportable, "", ""},
    {"Less", OpSupport::kImportable, "", ""},
    {"LessOrEqual", OpSupport::kImportable, "", ""},
    {"Greater", OpSupport::kImportable, "", ""},
    {"GreaterOrEqual", OpSupport::kImportable, "", ""},
    {"Not", OpSupport::kImportable, "", ""},
    {"And", OpSupport::kImportable, "", ""},
    {"Or", OpSupport::kImportable, "", ""},
    {"Where", OpSupport::kImportable, "", ""},
    // Linear algebra and normalization.
    {"MatMul", OpSupport::kImportable, "", ""},
    {"Gemm", OpSupport::kImportable, "", ""},
    {"LayerNormalization", OpSupport::kImportable, "", ""},
    {"RMSNormalization", OpSupport::kImportable, "", ""},
    {"ReduceMean", OpSupport::kImportable, "", ""},
    {"ReduceSum", OpSupport::kImportable, "", ""},
    {"ReduceMax", OpSupport::kImportable, "", ""},
    {"ArgMax", OpSupport::kImportable, "", ""},
    {"TopK", OpSupport::kImportable, "", ""},
    {"Trilu", OpSupport::kImportable, "", ""},
    // Indexing. The random-access ones are importable but slow; the
    // random-access lint rule warns about them.
    {"Gather", OpSupport::kImportable, "", ""},
    {"GatherElements", OpSupport::kImportable, "", ""},
    {"GatherND", OpSupport::kImportable, "", ""},
    {"ScatterND", OpSupport::kImportable, "", ""},
    {"ScatterElements", OpSupport::kImportable, "", ""},
    // Importable for the O0 interpreter (the naive export uses it per
    // expert); its output shape is data dependent, which the
    // data-dependent-shape lint rule still reports for compiled paths.
    {"NonZero", OpSupport::kImportable, "", ""},
    // Layout and shape arithmetic (folded when their inputs are constant).
    {"Concat", OpSupport::kImportable, "", ""},
    {"Slice", OpSupport::kImportable, "", ""},
    {"Split", OpSupport::kImportable, "", ""},
    {"Reshape", OpSupport::kImportable, "", ""},
    {"Transpose", OpSupport::kImportable, "", ""},
    {"Unsqueeze", OpSupport::kImportable, "", ""},
    {"Squeeze", OpSupport::kImportable, "", ""},
    {"Flatten", OpSupport::kImportable, "", ""},
    {"Expand", OpSupport::kImportable, "", ""},
    {"Tile", OpSupport::kImportable, "", ""},
    {"Shape", OpSupport::kImportable, "", ""},
    {"Size", OpSupport::kImportable, "", ""},
    {"Cast", OpSupport::kImportable, "", ""},
    {"CastLike", OpSupport::kImportable, "", ""},
    {"Range", OpSupport::kImportable, "", ""},
    {"ConstantOfShape", OpSupport::kImportable, "", ""},
    {"Constant", OpSupport::kImportable, "", ""},
    {"Identity", OpSupport::kImportable, "", ""},
    {"Dropout", OpSupport::kImportable, "", ""},
    // Recognized, refused.
    {"If", OpSupport::kRecognized, "control flow", "control-flow"},
    {"Loop", OpSupport::kRecognized, "control flow", "control-flow"},
    {"Scan", OpSupport::kRecognized, "control flow", "control-flow"},
    {"Unique", OpSupport::kRecognized, "output shape depends on tensor values", ""},
    {"Compress", OpSupport::kRecognized, "output shape depends on tensor values", ""},
    {"NonMaxSuppression", OpSupport::kRecognized, "output shape depends on tensor values", ""},
    {"Scatter", OpSupport::kRecognized, "deprecated; re-export with a newer opset (ScatterElements)", ""},
    {"Einsum", OpSupport::kRecognized, "not lowered; export the contraction as MatMul", ""},
    {"CumSum", OpSupport::kRecognized, "not lowered yet", ""},
    {"OneHot", OpSupport::kRecognized, "not lowered yet", ""},
    {"Resize", OpSupport::kRecognized, "vision op, not lowered", ""},
    {"Pad", OpSupport::kRecognized, "not lowered yet", ""},
    {"Conv", OpSupport::kRecognized, "vision op, not lowered", ""},
    {"ConvTranspose", OpSupport::kRecognized, "vision op, not lowered", ""},
    {"MaxPool", OpSupport::kRecognized, "vision op, not lowered", ""},
    {"AveragePool", OpSupport::kRecognized, "vision op, not lowered", ""},
    {"BatchNormalization", OpSupport::kRecognized, "vision op, not lowered", ""},
    {"Attention", OpSupport::kRecognized, "opset 23 op, not lowered yet (export the decomposed form)", ""},
    {"RandomNormal", OpSupport::kRecognized, "random ops are not deterministic at inference", ""},
    {"RandomNormalLike", OpSupport::kRecognized, "random ops are not deterministic at inference", ""},
    {"RandomUniform", OpSupport::kRecognized, "random ops are not deterministic at inference", ""},
    {"RandomUniformLike", OpSupport::kRecognized, "random ops are not deterministic at inference", ""},
    {"Multinomial", OpSupport::kRecognized, "random ops are not deterministic at inference", ""},
    {"Bernoulli", OpSupport::kRecognized, "random ops are not deterministic at inference", ""},
    {"SequenceConstruct", OpSupport::kRecognized, "sequence types are not supported", ""},
    {"SequenceAt", OpSupport::kRecognized, "sequence types are not supported", ""},
    {"SequenceEmpty", OpSupport::kRecognized, "sequence types are not supported", ""},
    {"SequenceInsert", OpSupport::kRecognized, "sequence types are not supported", ""},
    {"SplitToSequence", OpSupport::kRecognized, "sequence types are not supported", ""},
    {"ConcatFromSequence", OpSupport::kRecognized, "sequence types are not supported", ""},
};

// True for the domains whose ops are listed above.
inline bool is_default_onnx_domain(std::string_view domain) {
  return domain.empty() || domain == "ai.onnx";
}

// The entry for an op, or nullptr when K3 does not know it (including every
// op outside the default domain).
inline const OnnxOpInfo* find_onnx_op(std::string_view domain, std::string_view op_type) {
  if (!is_default_onnx_domain(domain)) return nullptr;
  for (const OnnxOpInfo& info : kOnnxOps)
    if (info.op_type == op_type) return &info;
  return nullptr;
}

}  // namespace k3::onnxfe
