// The measurements behind `k3 bench`: generation runs per model and batch
// size, interleaved across compared models, summarized as medians.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/generator.h"

namespace k3::cli {

struct BenchSettings {
  std::vector<std::string> models;  // one or more (compare)
  std::vector<std::string> labels;  // same length as models
  std::vector<bool> moe_dense;      // same length as models: run the article's dense MoE
  // Same length as models (or empty): how a checkpoint or .onnx model is
  // compiled in memory: pipeline level and passes switched off.
  std::vector<int> opt_levels;
  std::vector<std::vector<std::string>> disabled_passes;
  bool ablate = false;  // models[0] is O3, the others O3 minus one pass each
  std::vector<int64_t> batches{1};
  int64_t prompt_len = 128;
  int64_t gen_len = 128;
  int repeat = 5;
  int warmup = 1;
  int threads = 0;
  std::string cpus;        // EngineOptions::cpus
  const kernels::KernelTable* kernels = nullptr;  // EngineOptions::kernels (nullptr: the default)
  std::vector<bool> mmap;  // per model: EngineOptions::mmap (empty: all false)
  runtime::SamplingParams sampling;
  double read_gb_per_s = 0;  // cached machine limit (k3 sysinfo); 0 = unknown
  // Measures the machine's read bandwidth now, in GB/s; called after every
  // measured run so each run's bandwidth is compared with the machine's at
  // that moment. Empty: the fraction uses read_gb_per_s.
  std::function<double()> read_probe;
  bool has_read_probe() const { return static_cast<bool>(read_probe); }
  // The core round trip now, in ns (ReadProbe::round_trip_ns; 0: one
  // thread), taken with each read probe: on a host whose two vCPUs sit
  // sometimes on one L3 and sometimes on two, it says which placement each
  // run met (docs/performance.md, "where the two threads sit"). Empty: not
  // measured.
  std::function<double()> round_trip_probe;
};

// Median and spread of one metric over the repeats.
struct Stat {
  double median = 0, min = 0, max = 0;
};

struct BenchPoint {
  std::string label;
  int64_t batch = 0;
  Stat ttft_ms;             // prefill of all prompts + first token each
  Stat decode_ms_per_step;  // one token for every sequence per step
  Stat total_ms;            // TTFT + decode
  Stat tokens_per_s;        // generated tokens / total time
  Stat decode_tokens_per_s;
  Stat requests_per_s;
  Stat decode_gb_per_s;       // bytes actually read per step / step time
  double bytes_per_step = 0;  // weights (routed experts only) + KV, mean over steps
  // Median over runs of (run's GB/s / the probe right after it), else
  // decode_gb_per_s.median / read_gb_per_s; -1 = unknown.
  double read_fraction = 0;
  Stat probe_gb_per_s;        // the probes after this point's runs (median 0: none)
  Stat round_trip_ns;         // the core round trips after them (median 0: none)
  double first_ttft_ms = -1;  // first request after load (first batch size only; -1 otherwise)
  double first_decode_ms_per_step = -1;
  double allocations_per_step = -1;  // -1 = not counted
  double load_ms = 0;
  std::string weights_memory;  // Engine::weights_memory() after the runs
};

struct BenchResult {
  BenchSettings settings;
  std::vector<BenchPoint> points;  // label-major, then batch
  std::string isa;
  std::string prefetch;  // kernels::table_prefetch: "l1", "l2" or "" (no choice)
  std::string kernels;   // kernels::table_label, for the report's header
  int threads = 0;
};

StatusOr<BenchResult> run_bench(const BenchSettings& settings);

}  // namespace k3::cli
