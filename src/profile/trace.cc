// Chrome trace writer (format: the Trace Event Format's complete events).
#include "profile/trace.h"

#include <fstream>
#include <nlohmann/json.hpp>

namespace k3::profile {
namespace {

constexpr int kPid = 1;  // one process; a fixed id keeps traces comparable
constexpr int kTid = 0;  // the thread that calls Engine::step

// Microseconds with nanosecond resolution (the format allows fractions).
// Division (not * 1e-3) gives the double nearest the decimal value, so the
// file shows 12.345 rather than 12.345000000000001.
double us(int64_t ns) { return static_cast<double>(ns) / 1000.0; }

}  // namespace

nlohmann::json chrome_trace(const StepProfiler& p) {
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", kPid}, {"tid", kTid}, {"args", {{"name", "k3 profile"}}}});
  events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", kPid}, {"tid", kTid}, {"args", {{"name", "step thread"}}}});
  const ir::Graph& g = p.graph();
  for (int64_t s = 0; s < p.steps(); ++s) {
    const StepCounts& sc = p.step_counts(s);
    events.push_back({{"name", "step " + std::to_string(s)},
                      {"cat", "step"},
                      {"ph", "X"},
                      {"ts", us(p.step_begin_ns(s))},
                      {"dur", us(p.step_ns(s))},
                      {"pid", kPid},
                      {"tid", kTid},
                      {"args", {{"step", s}, {"tokens", sc.tokens}, {"out_rows", sc.out_rows}, {"kv_positions", sc.kv_positions}}}});
    for (size_t i = 0; i < p.n_nodes(); ++i) {
      const ir::Node& n = g.nodes()[i];
      const StepCounts c = p.counts(s, i);
      const OpCost cost = op_cost(g, n, c);
      nlohmann::json args = {{"step", s},
                             {"node", i},
                             {"class", op_class_name(op_class(n.op))},
                             {"bytes_read", cost.bytes_read},
                             {"bytes_written", cost.bytes_written},
                             {"flops", cost.flops}};
      if (n.op == ir::OpKind::kMoe && c.moe_experts >= 0) args["experts_routed"] = c.moe_experts;
      events.push_back({{"name", n.name},
                        {"cat", ir::op_name(n.op)},
                        {"ph", "X"},
                        {"ts", us(p.node_begin_ns(s, i))},
                        {"dur", us(p.node_ns(s, i))},
                        {"pid", kPid},
                        {"tid", kTid},
                        {"args", args}});
    }
  }
  nlohmann::json j;
  j["traceEvents"] = std::move(events);
  j["displayTimeUnit"] = "ms";
  j["otherData"] = {{"generator", "k3 profile"}, {"steps", p.steps()}, {"nodes_per_step", p.n_nodes()}};
  return j;
}

Status write_chrome_trace(const StepProfiler& p, const std::string& path) {
  std::ofstream out(path);
  if (!out) return io_error("cannot open " + path + " for writing");
  out << chrome_trace(p).dump() << "\n";
  out.close();
  if (!out) return io_error("cannot write " + path);
  return Status();
}

}  // namespace k3::profile
