// The ordered pass list. Order matters; the comments on each entry say why
// it sits where it does.
#include "passes/pipeline.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>

#include "passes/constant_folding.h"
#include "passes/dead_code.h"
#include "passes/fuse_attention.h"
#include "passes/fuse_gelu.h"
#include "passes/fuse_layer_norm.h"
#include "passes/fuse_moe.h"
#include "passes/fuse_norm_activation.h"
#include "passes/fuse_residual_add.h"
#include "passes/fuse_rms_norm.h"
#include "passes/fuse_rope.h"
#include "passes/fuse_sibling_linears.h"
#include "passes/kv_cache_precision.h"
#include "passes/lower_to_plan.h"
#include "passes/pack_weights.h"
#include "passes/specialize_shapes.h"
#include "passes/weight_precision.h"

namespace k3::passes {
namespace {

struct Entry {
  int min_opt_level;
  std::function<std::unique_ptr<Pass>(const PipelineOptions&)> make;
};

const std::vector<Entry>& entries() {
  static const std::vector<Entry> list = {
      // specialize-shapes first, and at every level (O0 included): fixing
      // symbolic dims is the user's --input-shape choice, not an
      // optimization; running it before everything else lets every later
      // pass (constant-folding above all) see static shapes.
      {0, [](const PipelineOptions& o) { return std::make_unique<SpecializeShapes>(o.dims); }},
      // constant-folding after the shapes are fixed (Shape of an activation
      // folds only once its dims are known) and before dead-code, so the
      // shape-computing subgraphs and weights it leaves unread are removed.
      {1, [](const PipelineOptions&) { return std::make_unique<ConstantFolding>(); }},
      // dead-code before the pattern matchers: they then see only nodes
      // that contribute to an output, so "single consumer" guards are not
      // fooled by dead readers, and weights nothing reads are not written
      // to the .k3m.
      {1, [](const PipelineOptions&) { return std::make_unique<DeadCode>(); }},
      // The onnx-dialect fusions (exported LayerNorm / RMSNorm / GeLU
      // decompositions -> one onnx op each) after dead-code and constant
      // folding, so their single-consumer guards are not fooled by dead or
      // foldable readers and their constants are weights; before the
      // lowering of onnx ops to fused K3 ops, which then sees one op per
      // norm/activation. fuse-layer-norm before fuse-rms-norm: a LayerNorm's
      // variance chain is also an RMSNorm of x - mean.
      {2, [](const PipelineOptions&) { return std::make_unique<FuseLayerNorm>(); }},
      {2, [](const PipelineOptions&) { return std::make_unique<FuseRmsNorm>(); }},
      {2, [](const PipelineOptions&) { return std::make_unique<FuseGelu>(); }},
      // fuse-norm-activation after the three above: it matches the
      // onnx.LayerNormalization / RMSNormalization / Gelu they produce (an
      // exported erf GeLU is only a Gelu once fuse-gelu has run). Our own
      // decoders have norm -> MatMul, never norm -> activation, so it leaves
      // them (and what lower-to-plan sees at O3) unchanged; fuse-moe matches
      // expert GeLUs fed by MatMuls, which it does not touch either.
      {2, [](const PipelineOptions&) { return std::make_unique<FuseNormActivation>(); }},
      // O3, model-level fusions into K3's own ops (docs/onnx-lowering.md).
      // fuse-rope first: it moves the rotation before the head split, so
      // the attention fusion sees projection -> head split only. dead-code
      // again after it: the head split it bypassed has no readers left.
      {3, [](const PipelineOptions&) { return std::make_unique<FuseRope>(); }},
      {3, [](const PipelineOptions&) { return std::make_unique<DeadCode>(); }},
      // fuse-attention after fuse-rope and that dead-code: q and k then reach
      // the head split through layout ops only, and its "readers outside the
      // match die with it" guard is not fooled by the bypassed rope nodes. It
      // removes the mask and shape arithmetic that only fed the match itself.
      {3, [](const PipelineOptions&) { return std::make_unique<FuseAttention>(); }},
      // fuse-moe after the O2 fusions: fuse-gelu must have turned each
      // expert's exported erf GeLU into onnx.Gelu, which it matches; and
      // after dead-code, so its closed-region guard (every intermediate read
      // only inside the MoE) is not fooled by dead readers. Independent of
      // the rope/attention fusions (disjoint subgraphs).
      {3, [](const PipelineOptions&) { return std::make_unique<FuseMoe>(); }},
      // lower-to-plan after every fusion: it succeeds only when all that the
      // logits need is an op the planned executor has, which the fusions
      // above produce; before weight-precision, which then converts the
      // weights of the fused Linear and Moe ops (and only those).
      {3, [](const PipelineOptions& o) { return std::make_unique<LowerToPlan>(o.plan); }},
      // fuse-sibling-linears after lower-to-plan, on the K3 Linears it
      // leaves (and those a checkpoint graph starts with); before
      // weight-precision and pack-weights, which then convert and lay out
      // each stacked matrix as one.
      {3, [](const PipelineOptions&) { return std::make_unique<FuseSiblingLinears>(); }},
      // fuse-residual-add after lower-to-plan (it matches K3's Linear, Moe
      // and Add, which a checkpoint graph starts with) and after
      // fuse-sibling-linears, whose groups it would otherwise break by
      // giving one member a residual input; before the weight passes, which
      // skip the residual (an activation) when they walk a node's weights.
      {3, [](const PipelineOptions&) { return std::make_unique<FuseResidualAdd>(); }},
      // weight-precision last, and at every level (O0 included): it is the
      // user's choice of format, not an optimization, and running it after
      // every rewrite converts exactly the weights that remain.
      {0, [](const PipelineOptions& o) { return std::make_unique<WeightPrecision>(o.precision); }},
      // pack-weights after weight-precision: it lays out the bytes the
      // precision pass chose (f32, bf16 or bf16dot, which bf16-mixed keeps in
      // rows for its experts; int8 keeps its own row format, whose
      // int8-channel rows pack to their own panels),
      // and only for the Linear and Moe nodes that remain. Like the
      // precision, the layout is the user's choice (--weight-layout), so it
      // runs at every level.
      {0,
       [](const PipelineOptions& o) {
         return std::make_unique<PackWeights>(o.weight_layout, o.precision == "int8-channel",
                                              o.precision != "bf16-mixed");
       }},
      // kv-cache-precision at every level and after lower-to-plan: the cache
      // is the user's choice of format, and its states exist only once the
      // graph is lowered (a checkpoint graph starts lowered). It touches no
      // node the weight passes read, so its place among them is free.
      {0, [](const PipelineOptions& o) { return std::make_unique<KvCachePrecision>(o.kv_dtype); }},
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
  K3_RETURN_IF_ERROR(check_weight_precision(options.precision));
  if (options.kv_dtype != "f32" && options.kv_dtype != "bf16")
    return invalid_argument("--kv-dtype must be f32 or bf16 (got '" + options.kv_dtype + "')");
  if (options.weight_layout != "rows" && options.weight_layout != "panels" && options.weight_layout != "tiles")
    return invalid_argument("--weight-layout must be rows, panels or tiles (got '" + options.weight_layout + "')");
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
      if (rec.changed) {
        // A rewrite may leave onnx values downstream of it typed for what
        // they used to read; re-infer them all here, once, for every pass.
        K3_RETURN_IF_ERROR(refresh_all_onnx_types(g).with_context("after pass " + rec.name));
        K3_RETURN_IF_ERROR(g.verify().with_context("after pass " + rec.name));
      }
      rec.stats = pass->stats();
    }
    rec.nodes_after = static_cast<int64_t>(g.nodes().size());
    report.passes.push_back(std::move(rec));
  }
  return report;
}

}  // namespace k3::passes
