// Step profiler: the hooks, the report built from their timestamps, the
// hardware counters, and the driver that runs profiled steps on an engine.
#include "profile/profiler.h"

#include <dirent.h>
#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/ops/fast_ops.h"
#include "util/alloc_counter.h"

namespace k3::profile {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A synthetic but deterministic token for (slot, position): profiles measure
// work, which does not depend on the ids (only Moe routing does, and varied
// ids spread tokens over experts as real text does).
int32_t synthetic_token(int64_t slot, int64_t pos, int64_t vocab) {
  return static_cast<int32_t>((1 + 31 * pos + 7 * slot) % vocab);
}

}  // namespace

OpClass op_class(ir::OpKind op) {
  switch (op) {
    case ir::OpKind::kLinear: return OpClass::kMatmul;
    case ir::OpKind::kCachedAttention: return OpClass::kAttention;
    case ir::OpKind::kMoe: return OpClass::kMoe;
    case ir::OpKind::kLayerNorm:
    case ir::OpKind::kRmsNorm:
    case ir::OpKind::kAdd:
    case ir::OpKind::kRope: return OpClass::kNormElementwise;
    case ir::OpKind::kEmbedding:
    case ir::OpKind::kGatherRows: return OpClass::kDataMovement;
    default: break;  // onnx.* ops never reach a Plan (Plan::build rejects them)
  }
  return OpClass::kDataMovement;
}

const char* op_class_name(OpClass c) {
  switch (c) {
    case OpClass::kMatmul: return "matrix products";
    case OpClass::kAttention: return "attention";
    case OpClass::kMoe: return "MoE (routing + experts)";
    case OpClass::kNormElementwise: return "norms/elementwise";
    case OpClass::kDataMovement: return "data movement";
  }
  return "?";
}

// ---------------------------------------------------------------- hooks

StepProfiler::StepProfiler(const runtime::Plan& plan, int64_t max_steps, bool read_moe_routing)
    : plan_(&plan),
      n_nodes_(plan.graph().nodes().size()),
      max_steps_(std::max<int64_t>(max_steps, 0)),
      read_moe_routing_(read_moe_routing),
      step_begin_(static_cast<size_t>(max_steps_), 0),
      step_end_(static_cast<size_t>(max_steps_), 0),
      counts_(static_cast<size_t>(max_steps_)),
      node_begin_(static_cast<size_t>(max_steps_) * n_nodes_, 0),
      node_end_(static_cast<size_t>(max_steps_) * n_nodes_, 0),
      moe_experts_(static_cast<size_t>(max_steps_) * n_nodes_, -1) {}

void StepProfiler::begin_step(const StepCounts& counts) {
  K3_CHECK(!in_step_ && steps_ < max_steps_);
  in_step_ = true;
  counts_[static_cast<size_t>(steps_)] = counts;
  const int64_t t = now_ns();
  if (steps_ == 0) origin_ = t;
  step_begin_[static_cast<size_t>(steps_)] = t;
}

void StepProfiler::end_step() {
  const int64_t t = now_ns();
  K3_CHECK(in_step_);
  step_end_[static_cast<size_t>(steps_)] = t;
  in_step_ = false;
  ++steps_;
}

void StepProfiler::before_node(size_t index, const ir::Node& node) {
  // Hooks from another plan than the one profiled would silently mislabel
  // every row of the report; one pointer compare rules that out.
  K3_CHECK(in_step_ && index < n_nodes_ && &node == &plan_->graph().nodes()[index]);
  node_begin_[at(steps_, index)] = now_ns();
}

void StepProfiler::after_node(size_t index, const ir::Node&, const runtime::TensorArg*, size_t) {
  node_end_[at(steps_, index)] = now_ns();
}

void StepProfiler::after_call(size_t index, const runtime::OpCall& call) {
  // Outside the node's timed interval (after_node already stamped its end).
  if (read_moe_routing_ && call.node->op == ir::OpKind::kMoe)
    moe_experts_[at(steps_, index)] = static_cast<int32_t>(runtime::moe_active_experts(call));
}

StepCounts StepProfiler::counts(int64_t s, size_t i) const {
  StepCounts c = counts_[static_cast<size_t>(s)];
  const int32_t e = moe_experts_[at(s, i)];
  if (e >= 0) c.moe_experts = e;
  return c;
}

// ---------------------------------------------------------------- report

namespace {

// A node's precision: that of its widest-compute weight (an int8 Linear
// may carry an f32 bias; the int8 matrix decides).
ComputePrecision node_precision(const ir::Graph& g, const ir::Node& node) {
  ComputePrecision p = ComputePrecision::kF32;
  for (const int v : node.inputs) {
    if (v < 0 || g.value(v).kind != ir::ValueKind::kWeight) continue;
    const ir::DType t = g.value(v).dtype;
    if (ir::dtype_is_q8(t)) p = std::max(p, ComputePrecision::kInt8);
    if (t == ir::DType::kBF16 || t == ir::DType::kBF16P16 || t == ir::DType::kBF16Dot || t == ir::DType::kBF16DotT16 ||
        t == ir::DType::kBF16DotP16)
      p = std::max(p, ComputePrecision::kBF16);
  }
  return p;
}

Rates rates_of(const OpCost& cost, double ms, double step_ms, const MachineLimits& lim,
               ComputePrecision prec = ComputePrecision::kF32) {
  Rates r;
  r.ms = ms;
  r.share = step_ms > 0 ? ms / step_ms : 0.0;
  if (ms > 0) {
    // bytes / (ms * 1e-3 s) / 1e9 = bytes / (ms * 1e6)
    r.gb_per_s = cost.bytes() / (ms * 1e6);
    r.gflop_per_s = cost.flops / (ms * 1e6);
  }
  if (lim.known() && ms > 0) {
    const bool mem = cost.intensity() < lim.ridge(prec);
    r.memory_bound = mem;
    r.limit_fraction = mem ? r.gb_per_s / lim.read_gb_per_s : r.gflop_per_s / lim.peak_for(prec);
  }
  return r;
}

void add_cost(OpCost& a, const OpCost& b, double scale = 1.0) {
  a.bytes_read += b.bytes_read * scale;
  a.bytes_written += b.bytes_written * scale;
  a.flops += b.flops * scale;
}

}  // namespace

const char* precision_name(ComputePrecision p) {
  switch (p) {
    case ComputePrecision::kBF16:
      return "bf16";
    case ComputePrecision::kInt8:
      return "int8";
    case ComputePrecision::kF32:
      break;
  }
  return "fp32";
}

double MachineLimits::peak_for(ComputePrecision p) const {
  switch (p) {
    case ComputePrecision::kBF16:
      return std::max(peak_gflops, bf16_peak_gflops);
    case ComputePrecision::kInt8:
      return std::max(peak_gflops, int8_peak_gops);
    case ComputePrecision::kF32:
      break;
  }
  return peak_gflops;
}

ProfileReport build_report(const StepProfiler& p, const MachineLimits& limits, double outlier_factor) {
  ProfileReport r;
  r.limits = limits;
  const int64_t steps = p.steps();
  r.steps = steps;
  if (steps == 0) return r;
  const size_t n = p.n_nodes();
  const ir::Graph& g = p.graph();

  std::vector<double> sorted(static_cast<size_t>(steps));
  for (int64_t s = 0; s < steps; ++s) sorted[static_cast<size_t>(s)] = static_cast<double>(p.step_ns(s)) * 1e-6;
  std::sort(sorted.begin(), sorted.end());
  r.step_ms_min = sorted.front();
  r.step_ms_max = sorted.back();
  const size_t mid = sorted.size() / 2;
  r.step_ms_median = sorted.size() % 2 ? sorted[mid] : 0.5 * (sorted[mid - 1] + sorted[mid]);
  std::vector<int64_t> used;
  for (int64_t s = 0; s < steps; ++s)
    if (outlier_factor <= 0 || static_cast<double>(p.step_ns(s)) * 1e-6 <= outlier_factor * r.step_ms_median) used.push_back(s);
  if (used.empty())  // only with outlier_factor < 1
    for (int64_t s = 0; s < steps; ++s) used.push_back(s);
  r.steps_used = static_cast<int64_t>(used.size());
  r.outlier_factor = outlier_factor;
  const double inv = 1.0 / static_cast<double>(used.size());

  for (int64_t s : used) {
    r.step_ms += static_cast<double>(p.step_ns(s)) * 1e-6 * inv;
    r.tokens_per_step = p.step_counts(s).tokens;
    if (n > 0) {
      r.entry_ms += static_cast<double>(p.node_begin_ns(s, 0) - p.step_begin_ns(s)) * 1e-6 * inv;
      r.exit_ms += static_cast<double>(p.step_end_ns(s) - p.node_end_ns(s, n - 1)) * 1e-6 * inv;
      for (size_t i = 1; i < n; ++i)
        r.between_ms += static_cast<double>(p.node_begin_ns(s, i) - p.node_end_ns(s, i - 1)) * 1e-6 * inv;
    }
  }

  r.nodes.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const ir::Node& node = g.nodes()[i];
    NodeStats& ns = r.nodes[i];
    ns.name = node.name;
    ns.op = node.op;
    ns.cls = op_class(node.op);
    ns.precision = node_precision(g, node);
    double ms = 0, experts = 0;
    bool experts_known = true;
    for (int64_t s : used) {
      ms += static_cast<double>(p.node_ns(s, i)) * 1e-6 * inv;
      const StepCounts c = p.counts(s, i);
      add_cost(ns.cost, op_cost(g, node, c), inv);
      experts_known &= c.moe_experts >= 0;
      experts += static_cast<double>(c.moe_experts) * inv;
    }
    if (node.op == ir::OpKind::kMoe && experts_known) ns.moe_experts = experts;
    ns.rates = rates_of(ns.cost, ms, r.step_ms, limits, ns.precision);
    r.ops_ms += ms;
    r.class_ms[static_cast<int>(ns.cls)] += ms;
    add_cost(r.total, ns.cost);
  }

  for (int k = 0; k < ir::kNumOps; ++k) {
    KindStats ks;
    ks.op = static_cast<ir::OpKind>(k);
    double ms = 0;
    for (const NodeStats& ns : r.nodes) {
      if (ns.op != ks.op) continue;
      ++ks.count, ms += ns.rates.ms, add_cost(ks.cost, ns.cost);
      ks.precision = std::max(ks.precision, ns.precision);
    }
    if (ks.count == 0) continue;
    ks.rates = rates_of(ks.cost, ms, r.step_ms, limits, ks.precision);
    r.kinds.push_back(ks);
  }

  double flops_of[kNumComputePrecisions] = {};
  for (const NodeStats& ns : r.nodes) flops_of[static_cast<int>(ns.precision)] += ns.cost.flops;
  for (int p = 1; p < kNumComputePrecisions; ++p)
    if (flops_of[p] > flops_of[static_cast<int>(r.main_precision)]) r.main_precision = static_cast<ComputePrecision>(p);
  if (limits.known() && r.step_ms_median > 0)
    r.step_peak_fraction = r.total.flops / (r.step_ms_median * 1e6) / limits.peak_for(r.main_precision);
  return r;
}

namespace {

std::string fmt(const char* f, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof(buf), f, args...);
  return buf;
}

std::string pct(double x) { return fmt("%5.1f%%", 100.0 * x); }

std::string bound_cell(const Rates& r) {
  if (!r.memory_bound) return fmt("%-8s", "-");
  return fmt("%-8s", *r.memory_bound ? "memory" : "compute");
}

std::string limit_cell(const Rates& r) { return r.limit_fraction ? fmt("%7.1f%%", 100.0 * *r.limit_fraction) : fmt("%8s", "-"); }

}  // namespace

bool fits_in_cache(const ProfileReport& r) {
  return r.limits.cache_bytes > 0 && r.total.bytes_read <= static_cast<double>(r.limits.cache_bytes);
}

std::string format_report(const ProfileReport& r, int top_n) {
  std::string o;
  if (r.steps == 0) return "no profiled steps\n";
  o += fmt("step   %.4f ms mean of %ld steps (all %ld: min %.4f, median %.4f, max %.4f); %ld token(s) per step, %.1f tokens/s\n",
           r.step_ms, static_cast<long>(r.steps_used), static_cast<long>(r.steps), r.step_ms_min, r.step_ms_median, r.step_ms_max,
           static_cast<long>(r.tokens_per_step), r.step_ms > 0 ? static_cast<double>(r.tokens_per_step) / (r.step_ms * 1e-3) : 0.0);
  if (r.steps_used < r.steps)
    o += fmt("       %ld outlier step(s) over %gx the median left out (preempted: a shared or busy machine)\n",
             static_cast<long>(r.steps - r.steps_used), r.outlier_factor);
  o += fmt("work   %.2f MB read, %.2f MB written, %.2f MFLOP per step -> %.2f GB/s, %.2f GFLOP/s over the whole step\n",
           r.total.bytes_read * 1e-6, r.total.bytes_written * 1e-6, r.total.flops * 1e-6,
           r.step_ms > 0 ? r.total.bytes() / (r.step_ms * 1e6) : 0.0, r.step_ms > 0 ? r.total.flops / (r.step_ms * 1e6) : 0.0);
  if (r.limits.known()) {
    std::string dots;
    if (r.limits.bf16_peak_gflops > 0)
      dots += fmt(r.limits.bf16_amx ? ", bf16 amx %.1f" : ", bf16 dot %.1f", r.limits.bf16_peak_gflops);
    if (r.limits.int8_peak_gops > 0) dots += fmt(", int8 dot %.1f GOP/s", r.limits.int8_peak_gops);
    o += fmt("limits read %.1f GB/s, fp32 peak %.1f GFLOP/s%s, %s ridge %.2f flop/byte (%s)\n", r.limits.read_gb_per_s,
             r.limits.peak_gflops, dots.c_str(), precision_name(r.main_precision), r.limits.ridge(r.main_precision),
             r.limits.source.c_str());
    if (r.step_peak_fraction)
      o += fmt("       the median step's rate is %.1f%% of the %s peak (%.1f), the precision of most of its flops\n",
               100.0 * *r.step_peak_fraction, precision_name(r.main_precision), r.limits.peak_for(r.main_precision));
  } else
    o += fmt("limits unknown (%s): no %% of limit\n", r.limits.source.empty() ? "no sysinfo" : r.limits.source.c_str());
  if (fits_in_cache(r))
    o += fmt("note   the step reads %.1f MB, within the %.1f MB last-level cache: repeated steps are served from cache,\n"
             "       so GB/s can exceed the DRAM read limit (%% limit > 100%%); a model larger than the cache measures DRAM\n",
             r.total.bytes_read * 1e-6, static_cast<double>(r.limits.cache_bytes) * 1e-6);

  o += fmt("\n%-40s %9s %7s\n", "class", "ms/step", "share");
  for (int c = 0; c < kNumOpClasses; ++c)
    o += fmt("%-40s %9.4f %s\n", op_class_name(static_cast<OpClass>(c)), r.class_ms[c],
             pct(r.step_ms > 0 ? r.class_ms[c] / r.step_ms : 0.0).c_str());
  const double share = r.step_ms > 0 ? 1.0 / r.step_ms : 0.0;
  o += fmt("%-40s %9.4f %s\n", "framework overhead", r.overhead_ms(), pct(r.overhead_ms() * share).c_str());
  o += fmt("%-40s %9.4f %s\n", "  step entry (checks, input copies)", r.entry_ms, pct(r.entry_ms * share).c_str());
  o += fmt("%-40s %9.4f %s\n", "  between nodes (dispatch, timer hooks)", r.between_ms, pct(r.between_ms * share).c_str());
  o += fmt("%-40s %9.4f %s\n", "  step exit", r.exit_ms, pct(r.exit_ms * share).c_str());

  o += fmt("\n%-16s %5s %9s %7s %10s %11s %8s %8s %7s %-8s %8s\n", "op kind", "count", "ms/step", "share", "MB/step",
           "MFLOP/step", "GB/s", "GFLOP/s", "flop/B", "bound", "% limit");
  for (const KindStats& k : r.kinds)
    o += fmt("%-16s %5d %9.4f %s %10.3f %11.3f %8.2f %8.2f %7.2f %s %s\n", ir::op_name(k.op), k.count, k.rates.ms,
             pct(k.rates.share).c_str(), k.cost.bytes() * 1e-6, k.cost.flops * 1e-6, k.rates.gb_per_s, k.rates.gflop_per_s,
             k.cost.intensity(), bound_cell(k.rates).c_str(), limit_cell(k.rates).c_str());

  std::vector<size_t> order(r.nodes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return r.nodes[a].rates.ms > r.nodes[b].rates.ms; });
  const size_t top = std::min(order.size(), static_cast<size_t>(std::max(top_n, 0)));
  if (top > 0) {
    o += fmt("\n%-28s %-16s %9s %7s %10s %8s %8s %-8s %8s  %s\n", fmt("top %zu nodes", top).c_str(), "kind", "ms/step", "share",
             "MB/step", "GB/s", "GFLOP/s", "bound", "% limit", "note");
    for (size_t j = 0; j < top; ++j) {
      const NodeStats& ns = r.nodes[order[j]];
      std::string note;
      if (ns.op == ir::OpKind::kMoe)
        note = ns.moe_experts >= 0 ? fmt("%.1f experts routed", ns.moe_experts) : std::string("experts: min(E, tokens*top_k) estimate");
      o += fmt("%-28s %-16s %9.4f %s %10.3f %8.2f %8.2f %s %s  %s\n", ns.name.c_str(), ir::op_name(ns.op), ns.rates.ms,
               pct(ns.rates.share).c_str(), ns.cost.bytes() * 1e-6, ns.rates.gb_per_s, ns.rates.gflop_per_s,
               bound_cell(ns.rates).c_str(), limit_cell(ns.rates).c_str(), note.c_str());
    }
  }
  return o;
}

namespace {

nlohmann::json rates_json(const Rates& r) {
  nlohmann::json j;
  j["ms_per_step"] = r.ms;
  j["share"] = r.share;
  j["gb_per_s"] = r.gb_per_s;
  j["gflop_per_s"] = r.gflop_per_s;
  j["bound"] = r.memory_bound ? nlohmann::json(*r.memory_bound ? "memory" : "compute") : nlohmann::json(nullptr);
  j["limit_fraction"] = r.limit_fraction ? nlohmann::json(*r.limit_fraction) : nlohmann::json(nullptr);
  return j;
}

nlohmann::json cost_json(const OpCost& c) {
  return {{"bytes_read", c.bytes_read}, {"bytes_written", c.bytes_written}, {"flops", c.flops}, {"flop_per_byte", c.intensity()}};
}

}  // namespace

nlohmann::json report_json(const ProfileReport& r) {
  nlohmann::json j;
  j["steps"] = r.steps;
  j["steps_used"] = r.steps_used;
  j["tokens_per_step"] = r.tokens_per_step;
  j["step_ms"] = {{"mean", r.step_ms}, {"min", r.step_ms_min}, {"median", r.step_ms_median}, {"max", r.step_ms_max}};
  j["ops_ms"] = r.ops_ms;
  // True: the bytes a step reads fit in the last-level cache, so rates are
  // cache rates, not DRAM rates.
  j["fits_in_cache"] = fits_in_cache(r);
  j["total"] = cost_json(r.total);
  if (r.limits.known())
    j["limits"] = {{"read_gb_per_s", r.limits.read_gb_per_s},
                   {"peak_gflop_per_s", r.limits.peak_gflops},
                   {"bf16_peak_gflop_per_s", r.limits.bf16_peak_gflops},
                   {"bf16_peak_unit", r.limits.bf16_amx ? "amx" : "dot"},
                   {"int8_peak_gop_per_s", r.limits.int8_peak_gops},
                   {"ridge_flop_per_byte", r.limits.ridge(r.main_precision)},
                   {"cache_bytes", r.limits.cache_bytes},
                   {"source", r.limits.source}};
  else
    j["limits"] = nullptr;
  j["main_precision"] = precision_name(r.main_precision);
  j["step_peak_fraction"] = r.step_peak_fraction ? nlohmann::json(*r.step_peak_fraction) : nlohmann::json(nullptr);
  nlohmann::json classes = nlohmann::json::object();
  const double inv = r.step_ms > 0 ? 1.0 / r.step_ms : 0.0;
  const char* keys[kNumOpClasses] = {"matmul", "attention", "moe", "norm_elementwise", "data_movement"};
  for (int c = 0; c < kNumOpClasses; ++c) classes[keys[c]] = {{"ms_per_step", r.class_ms[c]}, {"share", r.class_ms[c] * inv}};
  classes["framework_overhead"] = {{"ms_per_step", r.overhead_ms()},
                                   {"share", r.overhead_ms() * inv},
                                   {"entry_ms", r.entry_ms},
                                   {"between_nodes_ms", r.between_ms},
                                   {"exit_ms", r.exit_ms}};
  j["classes"] = classes;
  nlohmann::json kinds = nlohmann::json::array();
  for (const KindStats& k : r.kinds) {
    nlohmann::json e = rates_json(k.rates);
    e["kind"] = ir::op_name(k.op);
    e["count"] = k.count;
    e["precision"] = precision_name(k.precision);
    e["cost"] = cost_json(k.cost);
    kinds.push_back(e);
  }
  j["op_kinds"] = kinds;
  nlohmann::json nodes = nlohmann::json::array();
  for (const NodeStats& ns : r.nodes) {
    nlohmann::json e = rates_json(ns.rates);
    e["name"] = ns.name;
    e["kind"] = ir::op_name(ns.op);
    e["precision"] = precision_name(ns.precision);
    e["cost"] = cost_json(ns.cost);
    if (ns.op == ir::OpKind::kMoe) e["experts_routed"] = ns.moe_experts >= 0 ? nlohmann::json(ns.moe_experts) : nlohmann::json(nullptr);
    nodes.push_back(e);
  }
  j["nodes"] = nodes;
  return j;
}

// ---------------------------------------------------------------- counters

namespace {

constexpr const char* kCounterNames[4] = {"cycles", "instructions", "cache_references", "cache_misses"};
constexpr uint64_t kCounterConfig[4] = {PERF_COUNT_HW_CPU_CYCLES, PERF_COUNT_HW_INSTRUCTIONS, PERF_COUNT_HW_CACHE_REFERENCES,
                                        PERF_COUNT_HW_CACHE_MISSES};

std::string perf_error(int err) {
  std::string m = std::string("perf_event_open: ") + std::strerror(err);
  if (err == ENOENT || err == EOPNOTSUPP) m += " (no hardware PMU exposed to this system, as in many VMs)";
  if (err == EACCES || err == EPERM) {
    std::ifstream in("/proc/sys/kernel/perf_event_paranoid");
    int level = 0;
    if (in >> level) m += " (kernel.perf_event_paranoid = " + std::to_string(level) + ")";
  }
  return m;
}

}  // namespace

HwCounterSet::~HwCounterSet() {
  for (const Fd& f : fds_) close(f.fd);
}

void HwCounterSet::open() {
  // Every thread: the pool's workers run most of the work. perf counts per
  // thread unless inherited at creation, and the workers already exist.
  std::vector<int> tids;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') tids.push_back(std::atoi(e->d_name));
    closedir(d);
  }
  threads_ = static_cast<int>(tids.size());
  for (int ev = 0; ev < 4; ++ev)
    for (int tid : tids) {
      perf_event_attr a{};
      a.size = sizeof(a);
      a.type = PERF_TYPE_HARDWARE;
      a.config = kCounterConfig[ev];
      a.disabled = 1;
      a.exclude_kernel = 1;  // allowed at perf_event_paranoid 2; the step's work is user space
      a.exclude_hv = 1;
      a.read_format = PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING;
      const long fd = syscall(SYS_perf_event_open, &a, tid, -1, -1, PERF_FLAG_FD_CLOEXEC);
      if (fd < 0) {
        if (errors_[ev].empty()) errors_[ev] = perf_error(errno);
        continue;
      }
      fds_.push_back({ev, static_cast<int>(fd)});
    }
}

void HwCounterSet::enable() {
  for (const Fd& f : fds_) {
    ioctl(f.fd, PERF_EVENT_IOC_RESET, 0);
    ioctl(f.fd, PERF_EVENT_IOC_ENABLE, 0);
  }
}

void HwCounterSet::disable() {
  for (const Fd& f : fds_) ioctl(f.fd, PERF_EVENT_IOC_DISABLE, 0);
}

HwCounters HwCounterSet::read() const {
  HwCounters c;
  c.threads = threads_;
  double sum[4] = {}, enabled = 0, running = 0;
  bool got[4] = {}, failed[4] = {};
  for (int ev = 0; ev < 4; ++ev) failed[ev] = !errors_[ev].empty();
  for (const Fd& f : fds_) {
    uint64_t v[3] = {};
    if (::read(f.fd, v, sizeof(v)) != static_cast<ssize_t>(sizeof(v)) || (v[1] > 0 && v[2] == 0)) {
      // Enabled but never scheduled on the PMU: no count to report.
      failed[f.event] = true;
      continue;
    }
    // Multiplexed counters ran part of the time; scale as perf stat does.
    sum[f.event] += v[2] > 0 ? static_cast<double>(v[0]) * static_cast<double>(v[1]) / static_cast<double>(v[2]) : 0.0;
    enabled += static_cast<double>(v[1]);
    running += static_cast<double>(v[2]);
    got[f.event] = true;
  }
  std::optional<double>* out[4] = {&c.cycles, &c.instructions, &c.cache_references, &c.cache_misses};
  for (int ev = 0; ev < 4; ++ev) {
    if (got[ev] && !failed[ev]) {
      *out[ev] = sum[ev];
      continue;
    }
    const std::string why = errors_[ev].empty() ? "not counted on every thread" : errors_[ev];
    if (c.unavailable.find(why) == std::string::npos)
      c.unavailable += (c.unavailable.empty() ? "" : "; ") + why;
  }
  if (fds_.empty() && c.unavailable.empty()) c.unavailable = "not opened";
  c.running_fraction = enabled > 0 ? running / enabled : 1.0;
  return c;
}

nlohmann::json counters_json(const HwCounters& c) {
  auto opt = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  nlohmann::json j;
  j["cycles"] = opt(c.cycles);
  j["instructions"] = opt(c.instructions);
  j["cache_references"] = opt(c.cache_references);
  j["cache_misses"] = opt(c.cache_misses);
  j["ipc"] = c.cycles && c.instructions && *c.cycles > 0 ? nlohmann::json(*c.instructions / *c.cycles) : nlohmann::json(nullptr);
  j["threads"] = c.threads;
  j["running_fraction"] = c.running_fraction;
  j["unavailable"] = c.unavailable.empty() ? nlohmann::json(nullptr) : nlohmann::json(c.unavailable);
  return j;
}

std::string format_counters(const HwCounters& c) {
  std::string o = fmt("hardware counters (%d threads, user space, all profiled steps):", c.threads);
  auto one = [&](const char* name, const std::optional<double>& v) {
    o += v ? fmt(" %s %.4g", name, *v) : fmt(" %s unavailable", name);
  };
  one(kCounterNames[0], c.cycles);
  one(kCounterNames[1], c.instructions);
  if (c.cycles && c.instructions && *c.cycles > 0) o += fmt(" (IPC %.2f)", *c.instructions / *c.cycles);
  one(kCounterNames[2], c.cache_references);
  one(kCounterNames[3], c.cache_misses);
  if (c.running_fraction < 0.999) o += fmt(" [multiplexed: counted %.0f%% of the time, scaled]", 100 * c.running_fraction);
  o += "\n";
  if (!c.unavailable.empty()) o += "  unavailable: " + c.unavailable + "\n";
  return o;
}

// ---------------------------------------------------------------- driver

StatusOr<runtime::EngineOptions> profile_engine_options(const ProfileOptions& o, const ModelConfig& c) {
  if (o.steps < 1 || o.steps > 1000000) return invalid_argument("--steps must be between 1 and 1000000");
  if (o.warmup < 0 || o.warmup > 1000000) return invalid_argument("--warmup must be between 0 and 1000000");
  if (o.batch < 1 || o.batch > 1024) return invalid_argument("--batch must be between 1 and 1024");
  runtime::EngineOptions e;
  e.max_batch = o.batch;
  if (o.prefill) {
    if (o.batch != 1)
      return invalid_argument("--batch applies to decode; a prefill profile times one sequence's chunk of --context tokens");
    if (o.context < 1 || o.context > 8192 || o.context > c.max_seq_len)
      return invalid_argument("--context for prefill must be between 1 and min(8192, max_seq_len = " + std::to_string(c.max_seq_len) +
                              ")");
    e.ctx_len = o.context;
    e.prefill_chunk = o.context;
  } else {
    // The profiled token sits at position `context`, after context cached ones.
    if (o.context < 0 || o.context + 1 > c.max_seq_len)
      return invalid_argument("--context for decode must be between 0 and max_seq_len - 1 = " + std::to_string(c.max_seq_len - 1));
    e.ctx_len = o.context + 1;
    e.prefill_chunk = std::clamp<int64_t>(o.context, 1, 128);
  }
  return e;
}

runtime::StepInputs StepBuffers::inputs() const {
  return {tokens.data(), positions.data(), slots.data(), static_cast<int64_t>(tokens.size()), out_rows.data(),
          static_cast<int64_t>(out_rows.size())};
}

StepCounts StepBuffers::counts() const {
  StepCounts c;
  c.tokens = static_cast<int64_t>(tokens.size());
  c.out_rows = static_cast<int64_t>(out_rows.size());
  c.kv_positions = 0;
  for (int32_t p : positions) c.kv_positions += p + 1;
  return c;
}

StepBuffers profiled_step_inputs(const ProfileOptions& o, const ModelConfig& c) {
  StepBuffers b;
  if (o.prefill) {
    // One sequence's chunk at positions 0..context-1, logits for its last row.
    for (int64_t p = 0; p < o.context; ++p) {
      b.tokens.push_back(synthetic_token(0, p, c.vocab_size));
      b.positions.push_back(static_cast<int32_t>(p));
      b.slots.push_back(0);
    }
    b.out_rows.push_back(static_cast<int32_t>(o.context - 1));
  } else {
    // One token per sequence at position `context`, logits for every row.
    for (int64_t s = 0; s < o.batch; ++s) {
      b.tokens.push_back(synthetic_token(s, o.context, c.vocab_size));
      b.positions.push_back(static_cast<int32_t>(o.context));
      b.slots.push_back(static_cast<int32_t>(s));
      b.out_rows.push_back(static_cast<int32_t>(s));
    }
  }
  return b;
}

Status fill_kv_cache(runtime::Engine& e, const ProfileOptions& o) {
  if (o.prefill) return Status();  // the profiled chunk writes every position it reads
  const int64_t chunk = e.prefill_plan().max_tokens(), vocab = e.config().vocab_size;
  std::vector<int32_t> tok(static_cast<size_t>(chunk)), pos(static_cast<size_t>(chunk)), slot(static_cast<size_t>(chunk));
  for (int64_t s = 0; s < o.batch; ++s)
    for (int64_t b = 0; b < o.context; b += chunk) {
      const int64_t m = std::min(chunk, o.context - b);
      for (int64_t j = 0; j < m; ++j) {
        tok[static_cast<size_t>(j)] = synthetic_token(s, b + j, vocab);
        pos[static_cast<size_t>(j)] = static_cast<int32_t>(b + j);
        slot[static_cast<size_t>(j)] = static_cast<int32_t>(s);
      }
      K3_RETURN_IF_ERROR(e.step({tok.data(), pos.data(), slot.data(), m, nullptr, 0}).status());
    }
  return Status();
}

Status profile_steps(runtime::Engine& e, StepProfiler& p, const StepBuffers& in, int64_t steps) {
  const runtime::StepInputs step = in.inputs();
  const StepCounts counts = in.counts();
  for (int64_t s = 0; s < steps; ++s) {
    p.begin_step(counts);
    auto r = e.step(step, &p);
    p.end_step();
    if (!r.ok()) return r.status();
  }
  return Status();
}

StatusOr<ProfileRun> run_profile(runtime::Engine& e, const ProfileOptions& o) {
  K3_RETURN_IF_ERROR(profile_engine_options(o, e.config()).status());
  K3_RETURN_IF_ERROR(fill_kv_cache(e, o));
  const StepBuffers in = profiled_step_inputs(o, e.config());
  // The plan Engine::step will pick for this many tokens.
  const runtime::Plan& plan =
      static_cast<int64_t>(in.tokens.size()) <= e.decode_plan().max_tokens() ? e.decode_plan() : e.prefill_plan();
  ProfileRun run;
  run.profiler = std::make_unique<StepProfiler>(plan, o.steps, !e.options().reference);
  HwCounterSet hw;
  if (o.counters) hw.open();
  // Warm up last, right before the profiled steps: setup in between would let
  // the pool's workers fall asleep and the first profiled step pay the wake-up.
  for (int64_t w = 0; w < o.warmup; ++w) K3_RETURN_IF_ERROR(e.step(in.inputs()).status());
  const int64_t before = heap_allocations();
  hw.enable();
  const Status st = profile_steps(e, *run.profiler, in, o.steps);
  hw.disable();
  const int64_t after = heap_allocations();
  K3_RETURN_IF_ERROR(st);
  if (before >= 0) run.allocations = after - before;
  // The same steps without hooks: what the profiler's own timestamps cost
  // (medians, since a preempted step would swamp a mean).
  std::vector<double> plain(static_cast<size_t>(o.steps));
  for (double& ms : plain) {
    const auto t0 = std::chrono::steady_clock::now();
    K3_RETURN_IF_ERROR(e.step(in.inputs()).status());
    ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  std::sort(plain.begin(), plain.end());
  const size_t mid = plain.size() / 2;
  run.unprofiled_step_ms = plain.size() % 2 ? plain[mid] : 0.5 * (plain[mid - 1] + plain[mid]);
  if (o.counters) {
    run.counters = hw.read();
  } else {
    run.counters.unavailable = "not requested";
  }
  return run;
}

}  // namespace k3::profile
