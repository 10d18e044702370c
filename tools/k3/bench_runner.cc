// run_bench: loads each model once, then for every batch size runs warm-up
// and measured generations, alternating between the compared models run by
// run so that machine noise hits them alike.
#include "bench_runner.h"

#include <algorithm>
#include <chrono>

#include "commands.h"
#include "runtime/ops/fast_ops.h"
#include "util/rng.h"

namespace k3::cli {
namespace {

using runtime::Engine;

Stat summarize(std::vector<double> v) {
  Stat s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  s.min = v.front();
  s.max = v.back();
  return s;
}

// Counts, over decode steps, the bytes each step had to read: weights of
// every non-MoE op, the gate and the experts actually routed, KV positions.
class ByteCounter : public runtime::StepHooks {
 public:
  explicit ByteCounter(const ModelConfig& c) : c_(c) {}
  void after_call(size_t, const runtime::OpCall& call) override {
    const ir::Node& n = *call.node;
    switch (n.op) {
      case ir::OpKind::kLinear:
        bytes_ += static_cast<double>(call.in[1].value->bytes());
        break;
      case ir::OpKind::kLayerNorm:
      case ir::OpKind::kRmsNorm:
        for (size_t i = 1; i < n.inputs.size(); ++i) bytes_ += static_cast<double>(call.in[i].value->bytes());
        break;
      case ir::OpKind::kEmbedding:
        bytes_ += static_cast<double>(call.out[0].rows * call.out[0].cols() * 4);
        break;
      case ir::OpKind::kMoe: {
        // One expert's matrices, in whatever dtype they are stored.
        double expert = 0;
        for (int64_t j = 0; j < c_.expert_matrices(); ++j) expert += static_cast<double>(call.in[2 + j].value->bytes());
        bytes_ += static_cast<double>(call.in[1].value->bytes()) +
                  expert * static_cast<double>(runtime::moe_active_experts(call));
        break;
      }
      case ir::OpKind::kCachedAttention: {
        // K and V rows 0..p of each token's slot, f32 or bf16 (--kv-dtype).
        const int64_t row = c_.n_kv_heads * c_.head_dim * static_cast<int64_t>(ir::dtype_size(call.in[5].value->dtype));
        for (int64_t t = 0; t < call.in[3].rows; ++t)
          bytes_ += 2.0 * static_cast<double>((call.in[3].i32()[t] + 1) * row);
        break;
      }
      default:
        break;
    }
  }
  double take() {
    double b = bytes_;
    bytes_ = 0;
    return b;
  }

 private:
  const ModelConfig& c_;
  double bytes_ = 0;
};

struct Loaded {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<runtime::Generator> gen;
  double load_ms = 0;
  bool first_done = false;
};

}  // namespace

StatusOr<BenchResult> run_bench(const BenchSettings& s) {
  if (s.models.empty()) return invalid_argument("no model to benchmark");
  if (s.prompt_len < 1 || s.gen_len < 1) return invalid_argument("--prompt-len and --gen-len must be >= 1");
  if (s.repeat < 1 || s.warmup < 0) return invalid_argument("--repeat must be >= 1 and --warmup >= 0");
  const int64_t max_batch = *std::max_element(s.batches.begin(), s.batches.end());
  BenchResult result;
  result.settings = s;

  std::vector<Loaded> loaded(s.models.size());
  for (size_t m = 0; m < s.models.size(); ++m) {
    runtime::EngineOptions eo;
    eo.threads = s.threads;
    eo.cpus = s.cpus;
    eo.kernels = s.kernels;
    eo.max_batch = max_batch;
    eo.ctx_len = s.prompt_len + s.gen_len;
    eo.prefill_chunk = std::min<int64_t>(s.prompt_len, 512);
    eo.moe_dense = m < s.moe_dense.size() && s.moe_dense[m];
    eo.mmap = m < s.mmap.size() && s.mmap[m];
    if (m < s.opt_levels.size()) eo.opt_level = s.opt_levels[m];
    if (m < s.disabled_passes.size()) eo.disabled_passes = s.disabled_passes[m];
    const auto t0 = std::chrono::steady_clock::now();
    auto e = Engine::load(s.models[m], eo);
    if (!e.ok()) return e.status().with_context(s.models[m]);
    loaded[m].load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    loaded[m].engine = std::move(e).value();
    note_layout_kernels(*loaded[m].engine);
    loaded[m].gen = std::make_unique<runtime::Generator>(*loaded[m].engine);
    result.isa = std::string(kernels::isa_name(loaded[m].engine->kernels().isa));
    result.prefetch = std::string(kernels::table_prefetch(loaded[m].engine->kernels()));
    result.kernels = kernels::table_label(loaded[m].engine->kernels());
    result.threads = loaded[m].engine->threads();
  }

  for (int64_t batch : s.batches) {
    // Prompts: fixed pseudo-random ids, the same for every model.
    std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(batch));
    Rng rng(1234);
    const int64_t vocab = loaded[0].engine->config().vocab_size;
    for (auto& p : prompts)
      for (int64_t i = 0; i < s.prompt_len; ++i)
        p.push_back(static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(vocab)));

    struct Samples {
      std::vector<double> ttft, step, total, tps, dtps, rps, gbps, bytes, allocs, probe, fraction, round_trip;
      double first_ttft = -1, first_step = -1;
    };
    std::vector<Samples> samples(s.models.size());
    for (int rep = 0; rep < s.warmup + s.repeat; ++rep) {
      for (size_t m = 0; m < s.models.size(); ++m) {
        ByteCounter counter(loaded[m].engine->config());
        runtime::GenerateOptions go;
        go.max_new_tokens = s.gen_len;
        go.sampling = s.sampling;
        go.sampling.seed = s.sampling.seed + static_cast<uint64_t>(rep);
        go.stop_at_eos = false;  // every run generates exactly gen_len tokens
        go.decode_hooks = &counter;
        auto r = loaded[m].gen->generate(prompts, go);
        if (!r.ok()) return r.status();
        const double step_ms = r->decode_steps > 0 ? r->decode_ms / static_cast<double>(r->decode_steps) : 0.0;
        Samples& sm = samples[m];
        if (!loaded[m].first_done) {
          loaded[m].first_done = true;
          sm.first_ttft = r->prefill_ms;
          sm.first_step = step_ms;
        }
        if (rep < s.warmup) continue;
        const double total = r->prefill_ms + r->decode_ms;
        const double tokens = static_cast<double>(batch * s.gen_len);
        // Bytes read are counted by plan hooks; an ONNX graph run op by op has
        // none ("-" in the table, not a misleading 0).
        const bool counted = loaded[m].engine->executor() == Executor::kPlan;
        const double bytes = !counted              ? -1.0
                             : r->decode_steps > 0 ? counter.take() / static_cast<double>(r->decode_steps)
                                                   : 0.0;
        sm.ttft.push_back(r->prefill_ms);
        sm.step.push_back(step_ms);
        sm.total.push_back(total);
        sm.tps.push_back(tokens / (total / 1e3));
        sm.dtps.push_back(r->decode_ms > 0 ? static_cast<double>(r->decode_tokens) / (r->decode_ms / 1e3) : 0.0);
        sm.rps.push_back(static_cast<double>(batch) / (total / 1e3));
        sm.bytes.push_back(bytes);
        sm.gbps.push_back(!counted ? -1.0 : step_ms > 0 ? bytes / (step_ms * 1e6) : 0.0);
        if (r->decode_allocations >= 0 && r->decode_steps > 0)
          sm.allocs.push_back(static_cast<double>(r->decode_allocations) / static_cast<double>(r->decode_steps));
        if (s.read_probe) {
          const double now = s.read_probe();
          sm.probe.push_back(now);
          if (counted && now > 0) sm.fraction.push_back(sm.gbps.back() / now);
        }
        if (s.round_trip_probe) {
          const double ns = s.round_trip_probe();
          if (ns > 0) sm.round_trip.push_back(ns);
        }
      }
    }
    for (size_t m = 0; m < s.models.size(); ++m) {
      const Samples& sm = samples[m];
      BenchPoint p;
      p.label = s.labels[m];
      p.batch = batch;
      p.ttft_ms = summarize(sm.ttft);
      p.decode_ms_per_step = summarize(sm.step);
      p.total_ms = summarize(sm.total);
      p.tokens_per_s = summarize(sm.tps);
      p.decode_tokens_per_s = summarize(sm.dtps);
      p.requests_per_s = summarize(sm.rps);
      p.decode_gb_per_s = summarize(sm.gbps);
      p.bytes_per_step = summarize(sm.bytes).median;
      if (!sm.probe.empty()) p.probe_gb_per_s = summarize(sm.probe);
      if (!sm.round_trip.empty()) p.round_trip_ns = summarize(sm.round_trip);
      if (!sm.fraction.empty())
        p.read_fraction = summarize(sm.fraction).median;
      else
        p.read_fraction = s.read_gb_per_s > 0 && p.decode_gb_per_s.median >= 0 && sm.probe.empty()
                              ? p.decode_gb_per_s.median / s.read_gb_per_s
                              : -1.0;
      p.first_ttft_ms = sm.first_ttft;
      p.first_decode_ms_per_step = sm.first_step;
      p.allocations_per_step = sm.allocs.empty() ? -1.0 : summarize(sm.allocs).max;
      p.load_ms = loaded[m].load_ms;
      p.weights_memory = loaded[m].engine->weights_memory();
      result.points.push_back(p);
    }
  }
  // Label-major order for reporting.
  std::stable_sort(result.points.begin(), result.points.end(), [&](const BenchPoint& a, const BenchPoint& b) {
    auto idx = [&](const std::string& l) { return std::find(s.labels.begin(), s.labels.end(), l) - s.labels.begin(); };
    return idx(a.label) < idx(b.label);
  });
  return result;
}

}  // namespace k3::cli
