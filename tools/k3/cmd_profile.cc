// k3 profile: where every microsecond and byte of a decode or prefill step
// goes, per op kind and per node, against the machine's measured limits.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "compiled/k3m.h"
#include "profile/profiler.h"
#include "profile/sysinfo.h"
#include "profile/trace.h"

namespace k3::cli {
namespace {

struct ProfileFlags {
  std::string model;
  std::string phase = "decode";
  int64_t context = 128;
  int64_t batch = 1;
  int64_t steps = 10;
  int64_t warmup = 2;
  int threads = 0;
  std::string cpus;
  bool mmap = false;
  int top = 10;
  std::string isa;
  std::string prefetch;
  std::string trace;
  bool json = false;
  bool no_limits = false;
  bool refresh_sysinfo = false;
  bool no_counters = false;
};

// Roofline denominators for `threads` threads from the (cached) sysinfo
// measurement. Peak compute is per-core peak times the threads used, capped
// by what all measured threads reached together (SMT siblings share units).
// amx: the engine runs the amx kernel table, whose bf16 GEMM is bound by the
// AMX tiles' peak rather than vdpbf16ps's.
profile::MachineLimits machine_limits(int threads, bool refresh, bool amx) {
  profile::MachineLimits lim;
  auto si = profile::load_or_measure_sysinfo(threads, refresh);
  if (!si.ok()) {
    lim.source = "sysinfo failed: " + si.status().message();
    return lim;
  }
  lim.read_gb_per_s = si->best_read_gb_per_s(threads);
  const int used = si->hardware_threads > 0 ? std::min(threads, si->hardware_threads) : threads;
  lim.peak_gflops = si->fp32_gflops_per_core * used;
  if (si->fp32_gflops_total > 0) lim.peak_gflops = std::min(lim.peak_gflops, si->fp32_gflops_total);
  // Only per-core dot peaks are measured: times the threads, as FMA would
  // scale without an all-thread measurement.
  if (si->bf16_gflops_per_core) lim.bf16_peak_gflops = *si->bf16_gflops_per_core * used;
  if (amx && si->amx_bf16_gflops_per_core) {
    lim.bf16_peak_gflops = *si->amx_bf16_gflops_per_core * used;
    lim.bf16_amx = true;
  }
  if (si->int8_gops_per_core) lim.int8_peak_gops = *si->int8_gops_per_core * used;
  lim.cache_bytes = si->l3_bytes;
  lim.source = "sysinfo, " + std::to_string(threads) + " threads, measured " + si->measured_at;
  return lim;
}

int run_profile(const ProfileFlags& f) {
  profile::ProfileOptions po;
  po.prefill = f.phase == "prefill";
  po.context = f.context;
  po.batch = f.batch;
  po.steps = f.steps;
  po.warmup = f.warmup;
  po.counters = !f.no_counters;

  // The config: inside a .k3m (header and metadata only: the engine below
  // verifies the weights), or the checkpoint's config.json.
  // A file that is not a valid .k3m gets read_k3m's error naming what is
  // wrong with it, not a missing config.json inside it.
  std::error_code ec;
  StatusOr<ModelConfig> cfg = not_found("model directory " + f.model + " does not exist");
  if (std::filesystem::is_regular_file(f.model, ec)) {
    K3mReadOptions ro;
    ro.verify_data = false;
    auto m = read_k3m(f.model, ro);
    if (!m.ok()) return report(m.status());
    cfg = m->config;
  } else if (std::filesystem::is_directory(f.model, ec)) {
    cfg = load_config(f.model + "/config.json");
  }
  if (!cfg.ok()) return report(cfg.status());
  auto eo = profile::profile_engine_options(po, *cfg);
  if (!eo.ok()) return report(eo.status());
  eo->threads = f.threads;
  eo->cpus = f.cpus;
  eo->mmap = f.mmap;
  auto kt = kernels_for_isa_flag(f.isa, f.prefetch);
  if (!kt.ok()) return report(kt.status());
  eo->kernels = *kt;
  // The bandwidth probe is made before the engine: its threads must not
  // inherit the pinning (--cpus) the engine gives this thread.
  std::unique_ptr<profile::ReadProbe> probe;
  if (!f.no_limits) {
    auto p = profile::ReadProbe::create(engine_threads(f.threads, f.cpus));
    if (p.ok()) probe = std::move(p).value();
  }
  // Prefill is compute-bound: its peaks are re-measured too (sysinfo.h,
  // PeakProbe), with threads made here for the same reason. The probe is
  // made in every phase and with --no-limits as well, for the core round
  // trip (20000 trips of 60-400 ns, before and after: 2-16 ms): A/B runs
  // skip the limits but still need to know where the threads sat, and
  // batched decode's fraction of the read limit depends on it as much as
  // prefill's step does (docs/performance.md, "The far placement").
  std::unique_ptr<profile::PeakProbe> peak_probe;
  {
    auto p = profile::PeakProbe::create(engine_threads(f.threads, f.cpus));
    if (p.ok()) peak_probe = std::move(p).value();
  }
  auto engine = runtime::Engine::load(f.model, *eo);
  if (!engine.ok()) return report(engine.status());
  runtime::Engine& e = **engine;
  note_layout_kernels(e);
  if (e.executor() != Executor::kPlan)
    return report(
        unimplemented("k3 profile times the ops of a planned model; this one runs an ONNX graph op by op, "
                      "with no plan to time"));

  // Limits first: measuring them (once per machine, then cached) must not
  // overlap the profiled steps.
  profile::MachineLimits lim;
  if (f.no_limits)
    lim.source = "--no-limits";
  else
    lim = machine_limits(e.threads(), f.refresh_sysinfo, e.kernels().isa == kernels::Isa::kAmx);

  // Where the threads sit (sysinfo.h, measure_round_trip_ns): before and
  // after the steps (every op hands activations between the threads); a
  // host may move its vCPUs in between.
  double round_trip_before = 0, round_trip_after = 0;
  if (peak_probe != nullptr) round_trip_before = peak_probe->round_trip_ns();
  auto run = profile::run_profile(e, po);
  if (!run.ok()) return report(run.status());
  // The machine's bandwidth drifts on a shared host: the read limit is
  // re-measured right after the profiled steps, with the engine's threads.
  if (probe != nullptr && probe->threads() == e.threads() && lim.read_gb_per_s > 0) {
    lim.read_gb_per_s = probe->measure();
    lim.source += "; read bandwidth re-measured after the profiled steps";
  }
  if (f.phase == "prefill" && peak_probe != nullptr && peak_probe->threads() == e.threads() && lim.peak_gflops > 0) {
    auto now = peak_probe->measure();
    if (now.ok() && now->fp32_gflops > 0) {
      lim.peak_gflops = now->fp32_gflops;
      if (now->bf16_gflops > 0) lim.bf16_peak_gflops = now->bf16_gflops;
      if (e.kernels().isa == kernels::Isa::kAmx && now->amx_bf16_gflops > 0) {
        lim.bf16_peak_gflops = now->amx_bf16_gflops;
        lim.bf16_amx = true;
      }
      if (now->int8_gops > 0) lim.int8_peak_gops = now->int8_gops;
      lim.source += "; compute peaks re-measured after the profiled steps, all threads at once";
      round_trip_after = now->round_trip_ns;
    }
  }
  if (peak_probe != nullptr && round_trip_after == 0) round_trip_after = peak_probe->round_trip_ns();
  const profile::ProfileReport rep = profile::build_report(*run->profiler, lim);
  if (!f.trace.empty()) {
    Status s = profile::write_chrome_trace(*run->profiler, f.trace);
    if (!s.ok()) return report(s);
  }

  const std::string isa(kernels::isa_name(e.kernels().isa));
  const std::string_view prefetch = kernels::table_prefetch(e.kernels());
  if (f.json) {
    nlohmann::json j = profile::report_json(rep);
    j["model"] = f.model;
    j["phase"] = f.phase;
    j["context"] = f.context;
    j["batch"] = f.batch;
    j["warmup"] = f.warmup;
    j["threads"] = e.threads();
    j["isa"] = isa;
    j["prefetch"] = prefetch.empty() ? nlohmann::json(nullptr) : nlohmann::json(std::string(prefetch));
    j["counters"] = profile::counters_json(run->counters);
    j["unprofiled_step_ms"] = run->unprofiled_step_ms;
    j["allocations_during_steps"] = run->allocations >= 0 ? nlohmann::json(run->allocations) : nlohmann::json(nullptr);
    j["trace"] = f.trace.empty() ? nlohmann::json(nullptr) : nlohmann::json(f.trace);
    j["weights_memory"] = e.weights_memory();
    j["core_round_trip_ns"] =
        round_trip_before > 0 ? nlohmann::json{round_trip_before, round_trip_after} : nlohmann::json(nullptr);
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("k3 profile: %s, %s, batch %ld, context %ld, %d threads, %s kernels, %ld steps after %ld warmup\n",
              f.model.c_str(), f.phase.c_str(), static_cast<long>(f.batch), static_cast<long>(f.context), e.threads(),
              kernels::table_label(e.kernels()).c_str(), static_cast<long>(f.steps), static_cast<long>(f.warmup));
  std::printf("weights %s\n", e.weights_memory().c_str());
  if (round_trip_before > 0)
    std::printf(
        "core round trip %.0f ns before the steps, %.0f after (on one host "
        "50-65 with the cores sharing an L3, 300-400 without, where each handoff between the threads costs "
        "more; docs/performance.md)\n",
        round_trip_before, round_trip_after);
  std::printf("%s\n", profile::format_report(rep, f.top).c_str());
  std::printf("%s", profile::format_counters(run->counters).c_str());
  std::printf("same step without profiler hooks: %.4f ms median (profiled: %.4f ms median)\n", run->unprofiled_step_ms,
              rep.step_ms_median);
  if (run->allocations >= 0)
    std::printf("heap allocations during profiled steps: %ld\n", static_cast<long>(run->allocations));
  if (!f.trace.empty())
    std::printf("trace: %s (open in https://ui.perfetto.dev or chrome://tracing)\n", f.trace.c_str());
  return 0;
}

}  // namespace

Registered add_profile(CLI::App& app) {
  auto f = std::make_shared<ProfileFlags>();
  CLI::App* sub = app.add_subcommand(
      "profile", "Per-op time, bytes and FLOPs of a decode or prefill step, against the machine's limits");
  sub->add_option("-m,--model", f->model,
                  "Model: a .k3m file (k3 compile) or a checkpoint directory (config.json + model.safetensors)")
      ->required();
  sub->add_option("--phase", f->phase,
                  "decode: one token per sequence at position --context; prefill: one chunk of --context tokens")
      ->check(CLI::IsMember({"decode", "prefill"}));
  sub->add_option("-c,--context", f->context,
                  "Decode: cached positions before the profiled token; prefill: chunk length")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  sub->add_option("-b,--batch", f->batch, "Sequences decoded together (decode only)")
      ->check(CLI::Range(int64_t{1}, int64_t{1024}));
  sub->add_option("--steps", f->steps, "Profiled steps (the report is their mean)")
      ->check(CLI::Range(int64_t{1}, int64_t{1000000}));
  sub->add_option("--warmup", f->warmup, "Unprofiled steps first")->check(CLI::Range(int64_t{0}, int64_t{1000000}));
  sub->add_option("-t,--threads", f->threads, "Threads; 0 = all cores")->check(CLI::Range(0, 1024));
  sub->add_option("--cpus", f->cpus,
                  "Pin thread t to the t-th CPU of this list (taskset -c syntax, e.g. 0,1 or 0-3); "
                  "one CPU per thread, --threads defaults to their count");
  add_mmap_flag(sub, &f->mmap);
  sub->add_option("--top", f->top, "Slowest nodes to list")->check(CLI::Range(0, 100000));
  add_isa_flag(sub, &f->isa, &f->prefetch);
  sub->add_option("--trace", f->trace, "Write a Chrome trace-event JSON file (Perfetto, chrome://tracing)");
  sub->add_flag("--json", f->json, "Print one JSON object instead of tables");
  sub->add_flag(
      "--no-limits", f->no_limits,
      "Skip the machine limits (sysinfo) and the % of limit columns (prefill still measures the core round trip)");
  sub->add_flag("--refresh-sysinfo", f->refresh_sysinfo,
                "Re-measure the machine limits instead of using the cached ones");
  sub->add_flag("--no-counters", f->no_counters, "Do not open hardware performance counters");
  return {sub, [f]() { return run_profile(*f); }};
}

}  // namespace k3::cli
