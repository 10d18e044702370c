// k3 compile: a model on disk -> the pass pipeline -> a .k3m file, with a
// compile report (per pass: matched, applied, nodes before/after; the
// memory plan's arena bytes with and without reuse).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "compiled/k3m.h"
#include "runtime/plan.h"

namespace k3::cli {
namespace {

using nlohmann::json;

struct CompileFlags {
  std::string model;
  std::string out;
  int opt_level = 3;
  std::string input_shape;
  std::string precision = "fp32";
  std::string weight_layout = "rows";
  std::string kv_dtype = "f32";
  std::vector<std::string> disabled;
  bool list_passes = false;
  bool moe_dense = false;
  std::string dump_ir;
  std::string report;
};

// "batch=1,seq=128,ctx=2048" -> options. Unknown keys are errors: a typo
// must not silently compile for a different shape. For an ONNX model every
// key but ctx names a symbolic dim of the graph's inputs ("batch", "seq",
// "past" in K3's exports): it is specialized to that size (the
// specialize-shapes pass errors on a name no input has).
Status parse_input_shape(const std::string& text, CompileOptions& o, bool onnx) {
  size_t i = 0;
  while (i < text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    const std::string item = text.substr(i, j - i);
    const size_t eq = item.find('=');
    if (eq == std::string::npos) return invalid_argument("--input-shape entry '" + item + "' is not NAME=VALUE");
    const std::string key = item.substr(0, eq), val = item.substr(eq + 1);
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(val, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != val.size() || v < 1)
      return invalid_argument("--input-shape " + key + "=" + val + ": not a positive integer");
    if (key == "ctx") {
      o.ctx_len = v;  // KV positions per sequence, for both kinds of model
    } else if (onnx) {
      o.pipeline.dims.emplace_back(key, v);  // a graph dim (checked by specialize-shapes)
      if (key == "batch") o.batch = v;
    } else if (key == "batch") {
      o.batch = v;
    } else if (key == "seq") {
      o.prefill_chunk = v;
    } else if (key == "past") {
      o.ctx_len = v;
    } else {
      return invalid_argument("--input-shape: unknown dimension '" + key + "' (batch, seq, ctx)");
    }
    i = j + 1;
  }
  return Status();
}

json memory_plan_json(const ir::Graph& g) {
  const runtime::ArenaLayout l = runtime::plan_arena(g);
  return {{"arena_bytes", l.peak_bytes},
          {"no_reuse_bytes", l.no_reuse_bytes},
          {"saved_bytes", l.no_reuse_bytes - l.peak_bytes}};
}

json op_counts(const ir::Graph& g) {
  std::map<std::string, int64_t> counts;
  for (const ir::Node& n : g.nodes()) ++counts[ir::op_name(n.op)];
  return counts;
}

int run_compile(const CompileFlags& f) {
  if (f.list_passes) {
    std::printf("%-18s %-5s %s\n", "pass", "level", "what it does");
    for (const passes::PassInfo& p : passes::list_passes())
      std::printf("%-18s O%-4d %.*s\n", std::string(p.name).c_str(), p.min_opt_level,
                  static_cast<int>(p.summary.size()), p.summary.data());
    std::printf("%-18s %-5s %s\n", "memory-plan", "all", "lifetime-based arena offsets (runs at load, reported here)");
    return 0;
  }
  if (f.model.empty() || f.out.empty()) return report(invalid_argument("k3 compile needs MODEL and --out FILE.k3m"));
  const bool onnx = is_onnx_path(f.model);
  CompileOptions o;
  o.precision = f.precision;
  o.moe_dense = f.moe_dense;
  o.pipeline.opt_level = f.opt_level;
  o.pipeline.disabled = f.disabled;
  o.pipeline.weight_layout = f.weight_layout;
  o.pipeline.kv_dtype = f.kv_dtype;
  if (Status s = parse_input_shape(f.input_shape, o, onnx); !s.ok()) return report(s);
  StatusOr<CompiledModel> m = onnx ? compile_onnx(f.model, o) : compile_checkpoint(f.model, o);
  if (!m.ok()) return report(m.status());
  if (!f.dump_ir.empty()) {
    std::ofstream out(f.dump_ir);
    out << "# decode\n" << m->decode.to_string();
    if (m->executor == Executor::kPlan) out << "# prefill\n" << m->prefill.to_string();
    if (!out) return report(io_error("cannot write " + f.dump_ir));
  }
  json rep = {{"source", f.model},
              {"out", f.out},
              {"flags", m->compile_flags},
              {"executor", executor_name(m->executor)},
              {"graphs", json::object()}};
  for (const auto& [name, pr] : m->reports) {
    const ir::Graph& g = name == "decode" ? m->decode : m->prefill;
    json passes = json::array();
    for (const passes::PassRecord& r : pr.passes)
      passes.push_back({{"pass", r.name},
                        {"ran", r.ran},
                        {"changed", r.changed},
                        {"matched", r.stats.matched},
                        {"applied", r.stats.applied},
                        {"nodes_before", r.nodes_before},
                        {"nodes_after", r.nodes_after},
                        {"ms", r.ms},
                        {"notes", r.stats.notes}});
    // An ONNX decoder graph has no plan: the interpreter allocates per op.
    const json plan = m->executor == Executor::kPlan ? memory_plan_json(g) : json(nullptr);
    rep["graphs"][name] = {
        {"passes", passes}, {"nodes", g.nodes().size()}, {"ops", op_counts(g)}, {"memory_plan", plan}};
  }
  if (Status s = write_k3m(*m, f.out); !s.ok()) return report(s);
  std::error_code ec;
  rep["file_bytes"] = static_cast<int64_t>(std::filesystem::file_size(f.out, ec));
  if (!f.report.empty()) {
    std::ofstream out(f.report);
    out << rep.dump(2) << "\n";
    if (!out) return report(io_error("cannot write " + f.report));
  }
  std::printf("compiled %s -> %s (%s; executor %s)\n", f.model.c_str(), f.out.c_str(), m->compile_flags.c_str(),
              executor_name(m->executor));
  for (const auto& [name, g] : rep["graphs"].items()) {
    if (g["memory_plan"].is_null())
      std::printf("  %s: %ld nodes, no arena (op by op)\n", name.c_str(), g["nodes"].get<long>());
    else
      std::printf("  %s: %ld nodes, arena %.2f MiB (%.2f MiB without reuse)\n", name.c_str(), g["nodes"].get<long>(),
                  g["memory_plan"]["arena_bytes"].get<double>() / (1 << 20),
                  g["memory_plan"]["no_reuse_bytes"].get<double>() / (1 << 20));
    for (const json& p : g["passes"])
      if (p["ran"].get<bool>())
        std::printf("    %-18s matched %ld, applied %ld, nodes %ld -> %ld\n", p["pass"].get<std::string>().c_str(),
                    p["matched"].get<long>(), p["applied"].get<long>(), p["nodes_before"].get<long>(),
                    p["nodes_after"].get<long>());
  }
  std::printf("  file: %.1f MiB\n", rep["file_bytes"].get<double>() / (1 << 20));
  return 0;
}

}  // namespace

Registered add_compile(CLI::App& app) {
  auto f = std::make_shared<CompileFlags>();
  CLI::App* sub =
      app.add_subcommand("compile", "Compile a model into a .k3m file (graphs after the pass pipeline + weights)");
  sub->add_option("model", f->model,
                  "A checkpoint directory (config.json + model.safetensors) or an ONNX decoder (MODEL.onnx)");
  sub->add_option("-o,--out", f->out, "Output .k3m file");
  sub->add_option("-O,--opt-level", f->opt_level, "0 = graph as built, no passes; 1..3 = pass pipeline levels")
      ->check(CLI::Range(0, 3));
  sub->add_option("--input-shape", f->input_shape,
                  "Specialize shapes: batch=N (sequences decoded together), seq=N (prefill tokens per step), "
                  "ctx=N (KV positions per sequence); for ONNX, NAME=N fixes the graph's symbolic dim NAME");
  sub->add_option("--precision", f->precision,
                  "Weight precision of Linear and expert matrices: fp32 (default), bf16 (activations rounded to "
                  "bf16 too: bf16 dot products), bf16-f32 (bf16 weights widened against f32 activations: FMA, "
                  "faster prefill where bf16 dot products run at half the FMA rate), bf16-mixed (bf16 weights: Linear "
                  "products as bf16-f32, expert products as bf16), int8 (blocks of 32 with an "
                  "f16 scale, activations rounded to int8 per block) or int8-channel (int8 with one scale per "
                  "output channel: faster int8 panels); docs/precision.md");
  sub->add_option("--weight-layout", f->weight_layout,
                  "Layout of Linear and expert matrices: rows (default; fastest decode here), panels (f32/bf16 "
                  "matrices, bf16-mixed's Linears and int8 matrices, as panels of 16 rows; faster prefill, on AVX2 and "
                  "AVX-512 alike) or tiles (with --precision bf16: "
                  "contiguous AMX tiles, for the amx kernel table); see docs/performance.md");
  sub->add_option("--kv-dtype", f->kv_dtype,
                  "Element type of the KV cache: f32 (default) or bf16 (half the bytes attention reads per cached "
                  "position; rows rounded as written, docs/precision.md has the cost)");
  sub->add_option("--disable-pass", f->disabled, "Skip a pass by name (repeatable; see --list-passes)");
  sub->add_flag("--list-passes", f->list_passes, "List the passes in pipeline order and exit");
  sub->add_flag("--moe-dense", f->moe_dense, "Compile the article's dense one-hot-mask MoE (for measuring)");
  sub->add_option("--dump-ir", f->dump_ir, "Write the compiled graphs as text");
  sub->add_option("--report", f->report, "Write the compile report as JSON");
  return {sub, [f]() { return run_compile(*f); }};
}

}  // namespace k3::cli
