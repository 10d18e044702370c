// The step profiler on real engines (k3-tiny, k3-small from init_model):
// one report row per plan node, a Chrome trace that parses and whose node
// durations account for the measured step time, Moe expert counts read from
// the routing, and no heap allocation while profiled steps run.
//
// No assertion depends on how fast anything runs, only on how times relate
// within one run.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <new>
#include <nlohmann/json.hpp>
#include <thread>

#include "compiled/compiled_model.h"
#include "profile/profiler.h"
#include "profile/trace.h"
#include "runtime/test_models.h"
#include "util/alloc_counter.h"

// Count every allocation in this test binary (feeds util/alloc_counter.h, so
// run_profile() reports its own count too). noinline: once inlined, GCC pairs
// the malloc/free inside with the new/delete expressions and warns of a
// mismatch (-Wmismatched-new-delete) that is not there.
[[gnu::noinline]] void* operator new(std::size_t n) {
  k3::note_heap_allocation();
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
[[gnu::noinline]] void* operator new[](std::size_t n) { return operator new(n); }
// The nothrow forms too (std::stable_sort's buffer uses them): left to the
// library, their memory would reach the free() below from another allocator.
[[gnu::noinline]] void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  k3::note_heap_allocation();
  return std::malloc(n == 0 ? 1 : n);
}
[[gnu::noinline]] void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return operator new(n, std::nothrow); }
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace k3::profile {
namespace {

struct Loaded {
  std::unique_ptr<runtime::Engine> engine;
  ProfileOptions opts;
};

Loaded load(const std::string& preset, ProfileOptions o, int threads = 1) {
  Loaded l;
  l.opts = o;
  const std::string dir = k3::testing::model_dir(preset);
  EXPECT_FALSE(dir.empty());
  auto cfg = load_config(dir + "/config.json");
  EXPECT_TRUE(cfg.ok());
  auto eo = profile_engine_options(o, *cfg);
  EXPECT_TRUE(eo.ok()) << eo.status().message();
  eo->threads = threads;
  auto e = runtime::Engine::load(dir, *eo);
  EXPECT_TRUE(e.ok()) << e.status().message();
  if (e.ok()) l.engine = std::move(e).value();
  return l;
}

TEST(Profiler, OneReportRowPerPlanNode) {
  ProfileOptions o;
  o.context = 16;
  o.steps = 3;
  o.warmup = 1;
  o.counters = false;
  Loaded l = load("k3-tiny", o);
  ASSERT_TRUE(l.engine);
  auto run = run_profile(*l.engine, o);
  ASSERT_TRUE(run.ok()) << run.status().message();
  const ir::Graph& g = l.engine->decode_plan().graph();
  EXPECT_EQ(&run->profiler->plan(), &l.engine->decode_plan());
  EXPECT_EQ(run->profiler->steps(), 3);
  const ProfileReport r = build_report(*run->profiler, MachineLimits{});
  ASSERT_EQ(r.nodes.size(), g.nodes().size());
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    EXPECT_EQ(r.nodes[i].name, g.nodes()[i].name);
    EXPECT_EQ(r.nodes[i].op, g.nodes()[i].op);
    EXPECT_GE(r.nodes[i].rates.ms, 0.0);
  }
  int counted = 0;
  for (const KindStats& k : r.kinds) counted += k.count;
  EXPECT_EQ(counted, static_cast<int>(g.nodes().size()));
  // Op time + overhead is the step time (the two are measured together).
  EXPECT_NEAR(r.ops_ms + r.overhead_ms(), r.step_ms, 1e-9 + r.step_ms * 1e-9);
  double class_sum = 0;
  for (double ms : r.class_ms) class_sum += ms;
  EXPECT_NEAR(class_sum, r.ops_ms, 1e-9);
  // Unknown limits: no roofline verdict, rather than an invented one.
  for (const NodeStats& n : r.nodes) EXPECT_FALSE(n.rates.limit_fraction.has_value());
  EXPECT_FALSE(format_report(r, 5).empty());
  const nlohmann::json j = report_json(r);
  EXPECT_EQ(j["nodes"].size(), g.nodes().size());
  EXPECT_TRUE(j["limits"].is_null());
  // Counters not requested: reported as absent, never as numbers.
  EXPECT_TRUE(counters_json(run->counters)["cycles"].is_null());
}

TEST(Profiler, TraceIsValidJsonAndNodeTimesAccountForTheStep) {
  ProfileOptions o;
  o.context = 128;
  o.steps = 7;
  o.warmup = 2;
  o.counters = false;
  Loaded l = load("k3-small", o);
  ASSERT_TRUE(l.engine);
  auto run = run_profile(*l.engine, o);
  ASSERT_TRUE(run.ok()) << run.status().message();
  const StepProfiler& p = *run->profiler;

  const auto path = std::filesystem::temp_directory_path() / ("k3-trace-" + std::to_string(getpid()) + ".json");
  ASSERT_TRUE(write_chrome_trace(p, path.string()).ok());
  std::ifstream in(path);
  const nlohmann::json trace = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  std::filesystem::remove(path);
  ASSERT_FALSE(trace.is_discarded()) << "trace is not valid JSON";
  ASSERT_TRUE(trace.contains("traceEvents") && trace["traceEvents"].is_array());

  const size_t nodes = p.n_nodes();
  std::vector<double> step_us(static_cast<size_t>(o.steps), -1), ops_us(static_cast<size_t>(o.steps), 0);
  std::vector<size_t> node_events(static_cast<size_t>(o.steps), 0);
  const int64_t top_k = l.engine->config().top_k;
  for (const auto& ev : trace["traceEvents"]) {
    if (ev["ph"] != "X") continue;
    for (const char* key : {"name", "cat", "ts", "dur", "pid", "tid", "args"}) ASSERT_TRUE(ev.contains(key)) << key;
    EXPECT_EQ(ev["tid"], 0);
    const size_t s = ev["args"]["step"].get<size_t>();
    ASSERT_LT(s, step_us.size());
    if (ev["cat"] == "step") {
      step_us[s] = ev["dur"].get<double>();
      continue;
    }
    ops_us[s] += ev["dur"].get<double>();
    ++node_events[s];
    EXPECT_TRUE(ev["args"].contains("bytes_read") && ev["args"].contains("flops"));
    // At batch 1 the routing table says exactly top_k experts ran.
    if (ev["cat"] == "Moe") {
      EXPECT_EQ(ev["args"]["experts_routed"], top_k);
    }
  }
  // Node events nest inside their step and cover >= 90% of it. Checked on
  // most steps, not all: on a shared machine the scheduler can preempt the
  // step thread between two nodes, which is real time outside any op.
  int covered = 0;
  for (size_t s = 0; s < step_us.size(); ++s) {
    EXPECT_EQ(node_events[s], nodes) << "step " << s;
    ASSERT_GT(step_us[s], 0) << "step " << s;
    EXPECT_LE(ops_us[s], step_us[s] * 1.0001) << "step " << s;
    covered += ops_us[s] >= 0.9 * step_us[s];
  }
  EXPECT_GT(covered, static_cast<int>(step_us.size()) / 2) << "node events cover too little of the step time";
}

TEST(Profiler, BatchedDecodeCountsExpertsActuallyRouted) {
  ProfileOptions o;
  o.batch = 3;
  o.context = 8;
  o.steps = 2;
  o.warmup = 0;
  o.counters = false;
  Loaded l = load("k3-small", o);
  ASSERT_TRUE(l.engine);
  auto run = run_profile(*l.engine, o);
  ASSERT_TRUE(run.ok()) << run.status().message();
  const ProfileReport r = build_report(*run->profiler, MachineLimits{});
  EXPECT_EQ(r.tokens_per_step, 3);
  const ModelConfig& c = l.engine->config();
  const ir::Graph& g = run->profiler->graph();
  int moe = 0;
  for (size_t i = 0; i < r.nodes.size(); ++i) {
    const NodeStats& n = r.nodes[i];
    if (n.op != ir::OpKind::kMoe) continue;
    ++moe;
    EXPECT_GE(n.moe_experts, static_cast<double>(c.top_k));
    EXPECT_LE(n.moe_experts, static_cast<double>(std::min(c.n_experts, 3 * c.top_k)));
    // Never more bytes than the min(E, B*top_k) upper estimate.
    EXPECT_LE(n.cost.bytes_read, op_cost(g, g.nodes()[i], 3, 3, 9).bytes_read);
  }
  EXPECT_EQ(moe, c.n_layers);
}

// One prefill chunk of `context` tokens, no warmup, no hardware counters.
ProfileOptions prefill_options(int64_t context, int64_t steps) {
  ProfileOptions o;
  o.prefill = true;
  o.context = context;
  o.steps = steps;
  o.warmup = 0;
  o.counters = false;
  return o;
}

TEST(Profiler, PrefillProfilesOneChunk) {
  const ProfileOptions o = prefill_options(32, 2);
  Loaded l = load("k3-tiny", o);
  ASSERT_TRUE(l.engine);
  auto run = run_profile(*l.engine, o);
  ASSERT_TRUE(run.ok()) << run.status().message();
  EXPECT_EQ(&run->profiler->plan(), &l.engine->prefill_plan());
  const StepCounts& c = run->profiler->step_counts(0);
  EXPECT_EQ(c.tokens, 32);
  EXPECT_EQ(c.out_rows, 1);
  EXPECT_EQ(c.kv_positions, 32 * 33 / 2);  // causal: token i attends i + 1 positions
}

// A compute-bound node is judged against the peak of the arithmetic its
// weights allow: int8 matrices against the int8 dot peak, bf16 against the
// higher of the bf16 dot and fp32 FMA peaks, weightless ops against fp32.
TEST(Profiler, ComputeBoundNodesAreJudgedAgainstTheirPrecisionsPeak) {
  MachineLimits lim;
  lim.read_gb_per_s = 1e6;  // ridge 1e-4 flop/byte: every matrix product is compute-bound
  lim.peak_gflops = 100;
  lim.bf16_peak_gflops = 50;  // slower than fp32 FMA (as on some Intel parts): fp32 is the ceiling
  lim.int8_peak_gops = 400;
  EXPECT_EQ(lim.peak_for(ComputePrecision::kF32), 100);
  EXPECT_EQ(lim.peak_for(ComputePrecision::kBF16), 100);
  EXPECT_EQ(lim.peak_for(ComputePrecision::kInt8), 400);
  EXPECT_DOUBLE_EQ(lim.ridge(ComputePrecision::kInt8), 4 * lim.ridge());

  // int8-channel in panels: the channel-scale panels (q8cp16) are int8 too.
  for (const char* precision : {"int8", "bf16", "int8-channel"}) {
    SCOPED_TRACE(precision);
    const bool int8 = std::string(precision).starts_with("int8");
    const ProfileOptions o = prefill_options(32, 1);
    auto cfg = load_config(k3::testing::model_dir("k3-tiny") + "/config.json");
    ASSERT_TRUE(cfg.ok());
    auto eo = profile_engine_options(o, *cfg);
    ASSERT_TRUE(eo.ok());
    CompileOptions co;
    co.prefill_chunk = eo->prefill_chunk;
    co.ctx_len = eo->ctx_len;
    co.precision = precision;
    co.pipeline.weight_layout = std::string(precision) == "int8-channel" ? "panels" : "rows";
    auto model = compile_checkpoint(k3::testing::model_dir("k3-tiny"), co);
    ASSERT_TRUE(model.ok()) << model.status().message();
    eo->threads = 1;
    auto engine = runtime::Engine::create(std::move(model).value(), *eo);
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    auto run = run_profile(**engine, o);
    ASSERT_TRUE(run.ok()) << run.status().message();
    const ProfileReport r = build_report(*run->profiler, lim);
    const ComputePrecision want = int8 ? ComputePrecision::kInt8 : ComputePrecision::kBF16;
    int judged = 0;
    for (const NodeStats& n : r.nodes) {
      if (n.op == ir::OpKind::kMoe) {
        EXPECT_EQ(n.precision, want) << n.name;
      }
      if (n.op == ir::OpKind::kLayerNorm) {
        EXPECT_EQ(n.precision, ComputePrecision::kF32) << n.name;
      }
      if (n.op != ir::OpKind::kMoe || n.rates.ms <= 0) continue;
      ASSERT_TRUE(n.rates.memory_bound.has_value() && !*n.rates.memory_bound) << n.name;
      EXPECT_NEAR(*n.rates.limit_fraction, n.rates.gflop_per_s / (int8 ? 400.0 : 100.0), 1e-12) << n.name;
      ++judged;
    }
    EXPECT_GT(judged, 0);
    EXPECT_EQ(r.main_precision, want);  // the experts do most of the flops
    ASSERT_TRUE(r.step_peak_fraction.has_value());
    EXPECT_NEAR(*r.step_peak_fraction, r.total.flops / (r.step_ms_median * 1e6) / (int8 ? 400.0 : 100.0), 1e-12);
    const nlohmann::json j = report_json(r);
    EXPECT_EQ(j["main_precision"], int8 ? "int8" : precision);
    // Without machine limits (--no-limits) the precisions are still the weights'.
    const ProfileReport unjudged = build_report(*run->profiler, MachineLimits{});
    for (const KindStats& k : unjudged.kinds)
      if (k.op == ir::OpKind::kMoe) {
        EXPECT_EQ(k.precision, want);
      }
    EXPECT_EQ(unjudged.main_precision, want);
  }
}

// The whole step's peak fraction is the median step's rate, as k3 bench
// quotes medians: four steps of about 1 ms and one of 20 (one node of a
// real plan, timed around a sleep) give a median well apart from the mean,
// and the fraction follows the median. All steps kept (outlier factor 0);
// a late wake-up would have to stretch three of the short steps past the
// long one to move the median.
TEST(Profiler, PeakFractionIsTheMedianStepsRate) {
  const ProfileOptions o = prefill_options(32, 1);
  Loaded l = load("k3-tiny", o);
  ASSERT_TRUE(l.engine);
  auto run = run_profile(*l.engine, o);
  ASSERT_TRUE(run.ok()) << run.status().message();
  const runtime::Plan& plan = run->profiler->plan();
  StepProfiler replay(plan, 5);
  for (int ms : {1, 1, 20, 1, 1}) {
    replay.begin_step(run->profiler->step_counts(0));
    for (size_t i = 0; i < replay.n_nodes(); ++i) {
      const ir::Node& node = plan.graph().nodes()[i];
      replay.before_node(i, node);
      if (i == 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      replay.after_node(i, node, nullptr, 0);
    }
    replay.end_step();
  }
  MachineLimits lim;
  lim.read_gb_per_s = 10;
  lim.peak_gflops = 100;
  const ProfileReport r = build_report(replay, lim, 0.0);
  ASSERT_EQ(r.steps_used, 5);
  ASSERT_GT(r.total.flops, 0);
  ASSERT_TRUE(r.step_peak_fraction.has_value());
  const double peak = lim.peak_for(r.main_precision);
  EXPECT_NEAR(*r.step_peak_fraction, r.total.flops / (r.step_ms_median * 1e6) / peak, 1e-12);
  EXPECT_GT(r.step_ms, 2 * r.step_ms_median);  // the 20 ms step lifts the mean only
  EXPECT_GT(*r.step_peak_fraction, 2 * r.total.flops / (r.step_ms * 1e6) / peak);
}

TEST(Profiler, RejectsOptionsTheEngineCannotRun) {
  auto cfg = preset_config("k3-tiny");
  ASSERT_TRUE(cfg.ok());
  ProfileOptions o;
  o.prefill = true;
  o.batch = 2;
  EXPECT_FALSE(profile_engine_options(o, *cfg).ok());
  o.batch = 1;
  o.context = cfg->max_seq_len + 1;
  EXPECT_FALSE(profile_engine_options(o, *cfg).ok());
  o.prefill = false;
  o.context = cfg->max_seq_len;  // the profiled token would sit past the last position
  EXPECT_FALSE(profile_engine_options(o, *cfg).ok());
  o.context = cfg->max_seq_len - 1;
  EXPECT_TRUE(profile_engine_options(o, *cfg).ok());
  o.steps = 0;
  EXPECT_FALSE(profile_engine_options(o, *cfg).ok());
}

TEST(Profiler, ProfiledStepsDoNotAllocate) {
  for (int threads : {1, 2}) {
    ProfileOptions o;
    o.batch = 2;
    o.context = 12;
    o.steps = 10;
    o.warmup = 1;
    o.counters = false;
    Loaded l = load("k3-tiny", o, threads);
    ASSERT_TRUE(l.engine);
    // Directly around profile_steps: everything was sized before.
    ASSERT_TRUE(fill_kv_cache(*l.engine, o).ok());
    const StepBuffers in = profiled_step_inputs(o, l.engine->config());
    StepProfiler p(l.engine->decode_plan(), o.steps);
    ASSERT_TRUE(profile_steps(*l.engine, p, in, 1).ok());  // first use of any lazily created state
    const int64_t before = heap_allocations();
    ASSERT_GE(before, 0);
    const Status st = profile_steps(*l.engine, p, in, o.steps - 1);
    EXPECT_EQ(heap_allocations() - before, 0) << threads << " threads";
    ASSERT_TRUE(st.ok()) << st.message();
    // And as run_profile counts it (with the hardware counters opened first).
    o.counters = true;
    auto run = run_profile(*l.engine, o);
    ASSERT_TRUE(run.ok()) << run.status().message();
    EXPECT_EQ(run->allocations, 0) << threads << " threads";
  }
}

}  // namespace
}  // namespace k3::profile
