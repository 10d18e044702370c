// The step profiler behind `k3 profile`: where every microsecond and byte of
// a decode or prefill step goes.
//
// StepProfiler is a StepHooks implementation. The executor calls it before and
// after every node; it writes steady_clock timestamps into arrays sized when
// it is constructed (steps x nodes), so a profiled step allocates nothing and
// the per-node cost is two clock reads and a store. Everything derived
// (bytes, flops, GB/s, shares, roofline) is computed after the steps, in
// build_report().
//
// run_profile() drives an engine the way the CLI does: fill the KV cache by
// prefill, warm up, then time repeated identical steps (decode: one token per
// sequence at position = context; prefill: one chunk of `context` tokens).
// Repeating the same step keeps the work identical across samples, so the
// spread between steps is measurement noise, not different work.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "profile/op_cost.h"
#include "runtime/engine.h"
#include "runtime/plan.h"

namespace k3::profile {

// Where step time goes, coarsely: the classes the report's shares use.
enum class OpClass : uint8_t { kMatmul, kAttention, kMoe, kNormElementwise, kDataMovement };
inline constexpr int kNumOpClasses = 5;
OpClass op_class(ir::OpKind op);
const char* op_class_name(OpClass c);

class StepProfiler final : public runtime::StepHooks {
 public:
  // Sizes all storage for `max_steps` steps of `plan`. `read_moe_routing`:
  // after each Moe node, read how many distinct experts it ran from the op's
  // routing table (only valid for the optimized op implementations).
  StepProfiler(const runtime::Plan& plan, int64_t max_steps, bool read_moe_routing = true);

  // Brackets one step; `counts` are its row counts and attended positions.
  void begin_step(const StepCounts& counts);
  void end_step();

  void before_node(size_t index, const ir::Node& node) override;
  void after_node(size_t index, const ir::Node& node, const runtime::TensorArg* outputs, size_t n_outputs) override;
  void after_call(size_t index, const runtime::OpCall& call) override;

  const runtime::Plan& plan() const { return *plan_; }
  const ir::Graph& graph() const { return plan_->graph(); }
  int64_t steps() const { return steps_; }  // completed steps
  int64_t max_steps() const { return max_steps_; }
  size_t n_nodes() const { return n_nodes_; }

  // Timestamps in nanoseconds since the first step began.
  int64_t step_begin_ns(int64_t s) const { return step_begin_[static_cast<size_t>(s)] - origin_; }
  int64_t step_end_ns(int64_t s) const { return step_end_[static_cast<size_t>(s)] - origin_; }
  int64_t node_begin_ns(int64_t s, size_t i) const { return node_begin_[at(s, i)] - origin_; }
  int64_t node_end_ns(int64_t s, size_t i) const { return node_end_[at(s, i)] - origin_; }
  int64_t node_ns(int64_t s, size_t i) const { return node_end_[at(s, i)] - node_begin_[at(s, i)]; }
  int64_t step_ns(int64_t s) const { return step_end_[static_cast<size_t>(s)] - step_begin_[static_cast<size_t>(s)]; }
  // The step's counts, with the node's routed expert count for Moe nodes.
  StepCounts counts(int64_t s, size_t i) const;
  const StepCounts& step_counts(int64_t s) const { return counts_[static_cast<size_t>(s)]; }

 private:
  size_t at(int64_t s, size_t i) const { return static_cast<size_t>(s) * n_nodes_ + i; }

  const runtime::Plan* plan_;
  size_t n_nodes_;
  int64_t max_steps_;
  bool read_moe_routing_;
  int64_t steps_ = 0;
  bool in_step_ = false;
  int64_t origin_ = 0;
  std::vector<int64_t> step_begin_, step_end_;   // [steps]
  std::vector<StepCounts> counts_;               // [steps]
  std::vector<int64_t> node_begin_, node_end_;   // [steps * nodes]
  std::vector<int32_t> moe_experts_;             // [steps * nodes], -1 unless read
};

// Hardware counters over the profiled steps, summed over every thread of the
// process, user space only. A counter the kernel or hypervisor refuses is
// absent (never invented); `unavailable` says why.
struct HwCounters {
  std::optional<double> cycles, instructions, cache_references, cache_misses;
  int threads = 0;              // threads counted
  double running_fraction = 1;  // time counted / time enabled (< 1: multiplexed and scaled)
  std::string unavailable;      // empty when every counter was read
};

// Opens the counters on every thread of this process (before the steps,
// because opening allocates); enable()/disable() only issue ioctls.
class HwCounterSet {
 public:
  HwCounterSet() = default;
  ~HwCounterSet();
  HwCounterSet(const HwCounterSet&) = delete;
  HwCounterSet& operator=(const HwCounterSet&) = delete;
  void open();
  void enable();
  void disable();
  HwCounters read() const;

 private:
  struct Fd {
    int event;  // index into the four counters
    int fd;
  };
  std::vector<Fd> fds_;
  int threads_ = 0;
  std::string errors_[4];
};

// The arithmetic a node's weights allow: fp32 FMA (f32 weights), bf16 dot
// products (bf16 weights) or int8 dot products (kQ8 weights, rows or panels).
// Ordered from narrowest to widest compute: a node or kind holding several
// takes the last (std::max).
enum class ComputePrecision : uint8_t { kF32, kBF16, kInt8 };
inline constexpr int kNumComputePrecisions = 3;
const char* precision_name(ComputePrecision p);

// Machine limits for the roofline (from sysinfo); 0 = unknown.
struct MachineLimits {
  double read_gb_per_s = 0;  // best measured read bandwidth with the step's threads
  double peak_gflops = 0;    // fp32 peak with the step's threads
  double bf16_peak_gflops = 0;  // vdpbf16ps peak with the step's threads (0: none measured)
  bool bf16_amx = false;        // bf16_peak_gflops is the AMX tiles' (the engine runs the amx table)
  double int8_peak_gops = 0;    // vpdpbusd peak with the step's threads (0: none measured)
  int64_t cache_bytes = 0;   // last-level cache; 0 = unknown
  std::string source;        // where the numbers came from
  bool known() const { return read_gb_per_s > 0 && peak_gflops > 0; }
  // The compute ceiling for work of precision p: the highest peak a kernel
  // for it could use (bf16 weights can also be widened and FMA'd in fp32,
  // so never below the fp32 peak). Judging an int8 GEMM against the fp32
  // peak would flatter it by the int8 units' factor (4x on Zen 5).
  double peak_for(ComputePrecision p) const;
  double ridge(ComputePrecision p = ComputePrecision::kF32) const {  // flops per byte
    return known() ? peak_for(p) / read_gb_per_s : 0.0;
  }
};

// Achieved rates of a (node or aggregate) cost in a time.
struct Rates {
  double ms = 0;       // per step
  double share = 0;    // of the step's wall time
  double gb_per_s = 0;
  double gflop_per_s = 0;
  std::optional<bool> memory_bound;     // vs the ridge point, when limits are known
  std::optional<double> limit_fraction;  // of bandwidth (memory-bound) or peak (compute-bound)
};

struct NodeStats {
  std::string name;
  ir::OpKind op;
  OpClass cls;
  ComputePrecision precision = ComputePrecision::kF32;  // of its weights (fp32 without weights)
  OpCost cost;  // mean per step
  double moe_experts = -1;  // mean distinct experts routed (Moe nodes, when read)
  Rates rates;
};

struct KindStats {
  ir::OpKind op;
  int count = 0;  // nodes per step
  ComputePrecision precision = ComputePrecision::kF32;  // the widest among its nodes
  OpCost cost;
  Rates rates;
};

struct ProfileReport {
  int64_t steps = 0;       // profiled
  int64_t steps_used = 0;  // averaged: all but outliers (see build_report)
  double outlier_factor = 0;
  int64_t tokens_per_step = 0;
  double step_ms = 0;  // mean wall time of the steps used
  double step_ms_min = 0, step_ms_median = 0, step_ms_max = 0;  // over all profiled steps
  double ops_ms = 0;   // sum of node times
  // Framework overhead = step wall time - op time, split by where it falls:
  double entry_ms = 0;    // engine.step() entry to the first node (input checks and input copies)
  double between_ms = 0;  // between nodes (executor dispatch and the profiler's own hooks)
  double exit_ms = 0;     // last node to the step's return
  double class_ms[kNumOpClasses] = {};
  MachineLimits limits;
  // The precision of the nodes doing most of the step's flops, and the
  // median step's rate against that precision's peak (unset: limits
  // unknown). The median, as k3 bench quotes: in a k3-base int8 prefill
  // profile on a shared machine one step of five ran a fifth long, under the
  // outlier cut, and the mean moved this figure from 52.3 to 49.8%
  // (docs/performance.md, "int8 prefill, profile by profile").
  ComputePrecision main_precision = ComputePrecision::kF32;
  std::optional<double> step_peak_fraction;
  std::vector<NodeStats> nodes;  // one per plan node, plan order
  std::vector<KindStats> kinds;  // op kinds present, op-table order
  OpCost total;                  // all nodes, per step

  double overhead_ms() const { return entry_ms + between_ms + exit_ms; }
};

// Means over the profiled steps, leaving out steps longer than
// `outlier_factor` times the median step (0 keeps all). Why: on a shared
// machine a step now and then loses a scheduler time slice (a pool worker
// preempted while the others wait for it) and one such step can outweigh
// all the others in a mean; its time belongs to the machine, not the model.
// The trace keeps every step. `limits` may be unknown.
ProfileReport build_report(const StepProfiler& p, const MachineLimits& limits, double outlier_factor = 2.0);

// Whether the bytes a step reads fit in the last-level cache (then repeated
// steps run from cache and achieved GB/s is a cache rate).
bool fits_in_cache(const ProfileReport& r);

// Terminal table: classes, op kinds, the `top_n` slowest nodes.
std::string format_report(const ProfileReport& r, int top_n);
// The same for machines.
nlohmann::json report_json(const ProfileReport& r);
nlohmann::json counters_json(const HwCounters& c);
std::string format_counters(const HwCounters& c);

struct ProfileOptions {
  bool prefill = false;  // phase
  int64_t context = 128;
  int64_t batch = 1;
  int64_t steps = 10;
  int64_t warmup = 2;
  bool counters = true;
};

// Checks options against a model and returns the engine options a profile
// needs (max_batch, ctx_len, prefill_chunk); threads/kernels left to caller.
StatusOr<runtime::EngineOptions> profile_engine_options(const ProfileOptions& o, const ModelConfig& c);

// The inputs of the profiled step (and storage they point into).
struct StepBuffers {
  std::vector<int32_t> tokens, positions, slots, out_rows;
  runtime::StepInputs inputs() const;
  StepCounts counts() const;
};
StepBuffers profiled_step_inputs(const ProfileOptions& o, const ModelConfig& c);

// Fills the KV cache positions the profiled step attends to (decode:
// 0..context-1 of each sequence, by prefill chunks).
Status fill_kv_cache(runtime::Engine& e, const ProfileOptions& o);

// Runs `steps` profiled steps of `in` (no allocation: the profiler was sized
// before). Exposed separately so tests can count allocations around it.
Status profile_steps(runtime::Engine& e, StepProfiler& p, const StepBuffers& in, int64_t steps);

struct ProfileRun {
  std::unique_ptr<StepProfiler> profiler;
  HwCounters counters;
  int64_t allocations = -1;  // heap allocations during profiled steps; -1 = not counted in this binary
  double unprofiled_step_ms = 0;  // median of as many steps again, run without hooks
};

// Fill, warm up, then profile. The engine must come from profile_engine_options().
StatusOr<ProfileRun> run_profile(runtime::Engine& e, const ProfileOptions& o);

}  // namespace k3::profile
