// k3 bench: the article's tables as medians and ratios from one run.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include "bench_report.h"
#include "bench_runner.h"
#include "commands.h"
#include "compiled/k3m.h"
#include "passes/pipeline.h"
#include "profile/sysinfo.h"

namespace k3::cli {
namespace {

struct BenchFlags {
  std::string model;
  std::string compare;
  std::string batches = "1";
  int64_t prompt_len = 128, gen_len = 128;
  int repeat = 5, warmup = 1, threads = 0;
  std::string cpus, isa, prefetch;
  float temperature = 0.8f, top_p = 0.95f;
  int64_t top_k = 0;
  int64_t seed = 1;
  std::string json, markdown, plot;
  bool no_sysinfo = false;
  bool no_probe = false;
  bool compare_moe = false;
  bool compare_mmap = false;
  bool mmap = false;
  bool ablate = false;
};

// "O0".."O3" -> the level, else -1.
int opt_level_spec(const std::string& s) {
  return s.size() == 2 && (s[0] == 'O' || s[0] == 'o') && s[1] >= '0' && s[1] <= '3' ? s[1] - '0' : -1;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

Status write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) return io_error("cannot write " + path);
  out << text;
  return out ? Status() : io_error("error writing " + path);
}

int run(const BenchFlags& f) {
  BenchSettings s;
  if (f.ablate && (f.compare_moe || !f.compare.empty() || f.model.empty()))
    return report(invalid_argument("--ablate takes one --model (a checkpoint or .onnx), not --compare"));
  if (f.ablate) {
    if (is_k3m_file(f.model))
      return report(invalid_argument("--ablate recompiles the model without each pass: give a checkpoint or .onnx"));
    // O3, then O3 with each optimization pass switched off in turn.
    s.models = {f.model};
    s.labels = {"O3"};
    s.opt_levels = {3};
    s.disabled_passes = {{}};
    s.ablate = true;
    for (const passes::PassInfo& p : passes::list_passes()) {
      const std::string name(p.name);
      if (p.min_opt_level < 1 || std::find(s.labels.begin(), s.labels.end(), "-" + name) != s.labels.end()) continue;
      s.models.push_back(f.model);
      s.labels.push_back("-" + name);
      s.opt_levels.push_back(3);
      s.disabled_passes.push_back({name});
    }
  } else if (!f.compare.empty() && opt_level_spec(split(f.compare).front()) >= 0) {
    // --model M --compare O0,O3: one model compiled at each level.
    if (f.model.empty() || is_k3m_file(f.model))
      return report(invalid_argument("--compare O0,O3 compiles --model (a checkpoint or .onnx) at each level"));
    for (const std::string& spec : split(f.compare)) {
      const int level = opt_level_spec(spec);
      if (level < 0) return report(invalid_argument("--compare: '" + spec + "' is not an opt level O0..O3"));
      s.models.push_back(f.model);
      s.labels.push_back("O" + std::to_string(level));
      s.opt_levels.push_back(level);
    }
    if (s.models.size() < 2)
      return report(invalid_argument("--compare needs at least two opt levels, comma-separated"));
  } else if (!f.compare.empty()) {
    s.models = split(f.compare);
    if (s.models.size() < 2) return report(invalid_argument("--compare needs at least two models, comma-separated"));
  } else if (!f.model.empty() && (f.compare_moe || f.compare_mmap)) {
    if (f.compare_moe && f.compare_mmap)
      return report(invalid_argument("give --compare-moe or --compare-mmap, not both"));
    s.models = {f.model, f.model};
  } else if (!f.model.empty()) {
    s.models = {f.model};
  } else {
    return report(invalid_argument("give --model or --compare"));
  }
  for (size_t i = s.labels.size(); i < s.models.size(); ++i) {
    std::string label = s.models[i];
    while (label.size() > 1 && label.back() == '/') label.pop_back();
    s.labels.push_back(label.substr(label.find_last_of('/') == std::string::npos ? 0 : label.find_last_of('/') + 1));
  }
  if (f.compare_moe) {
    if (!f.compare.empty()) return report(invalid_argument("--compare-moe takes one --model, not --compare"));
    s.labels = {"routed-moe", "dense-moe"};
    s.moe_dense = {false, true};
  }
  if (f.compare_mmap) {
    if (!f.compare.empty()) return report(invalid_argument("--compare-mmap takes one --model, not --compare"));
    if (!is_k3m_file(f.model))
      return report(invalid_argument("--compare-mmap needs a .k3m --model (its weights are mapped or read)"));
    if (f.mmap) return report(invalid_argument("--compare-mmap measures both ways; drop --mmap"));
    s.labels = {"mapped", "read"};
    s.mmap = {true, false};
  } else {
    s.mmap.assign(s.models.size(), f.mmap);
  }
  for (const auto& b : split(f.batches)) {
    auto ids = parse_id_list(b);
    if (!ids.ok() || ids->size() != 1 || (*ids)[0] < 1 || (*ids)[0] > 256)
      return report(invalid_argument("--batch takes sizes 1..256, comma-separated; got \"" + f.batches + "\""));
    s.batches.push_back((*ids)[0]);
  }
  s.batches.erase(s.batches.begin());  // drop the default
  if (s.batches.empty()) return report(invalid_argument("--batch is empty"));
  s.prompt_len = f.prompt_len;
  s.gen_len = f.gen_len;
  s.repeat = f.repeat;
  s.warmup = f.warmup;
  s.threads = f.threads;
  s.cpus = f.cpus;
  auto kt = kernels_for_isa_flag(f.isa, f.prefetch);
  if (!kt.ok()) return report(kt.status());
  s.kernels = *kt;
  s.sampling.temperature = f.temperature;
  s.sampling.top_p = f.top_p;
  s.sampling.top_k = f.top_k;
  s.sampling.seed = static_cast<uint64_t>(f.seed);
  if (Status st = s.sampling.validate(); !st.ok()) return report(st);
  if (!f.no_sysinfo) {
    const int threads = engine_threads(f.threads, f.cpus);
    auto si = profile::load_or_measure_sysinfo(threads, false);
    if (si.ok())
      s.read_gb_per_s = si->best_read_gb_per_s(threads);
    else
      std::fprintf(stderr, "k3: warning: no machine limits (%s)\n", si.status().message().c_str());
  }
  std::unique_ptr<profile::ReadProbe> probe;
  if (!f.no_sysinfo && !f.no_probe) {
    auto p = profile::ReadProbe::create(engine_threads(f.threads, f.cpus));
    if (p.ok()) {
      probe = std::move(p).value();
      s.read_probe = [&probe] { return probe->measure(); };
      s.round_trip_probe = [&probe] { return probe->round_trip_ns(); };
    } else {
      std::fprintf(stderr, "k3: warning: no in-run bandwidth probe (%s)\n", p.status().message().c_str());
    }
  }
  auto r = run_bench(s);
  if (!r.ok()) return report(r.status());
  const std::string table = bench_table(*r);
  std::printf("%s", table.c_str());
  if (!f.json.empty())
    if (Status st = write_file(f.json, bench_json(*r).dump(2) + "\n"); !st.ok()) return report(st);
  if (!f.markdown.empty())
    if (Status st = write_file(f.markdown, table); !st.ok()) return report(st);
  if (!f.plot.empty()) {
    if (f.plot.size() < 4 || f.plot.substr(f.plot.size() - 4) != ".svg")
      return report(invalid_argument("--plot writes SVG; give a file name ending in .svg"));
    if (Status st = write_file(f.plot, bench_svg(*r)); !st.ok()) return report(st);
  }
  return 0;
}

}  // namespace

Registered add_bench(CLI::App& app) {
  auto f = std::make_shared<BenchFlags>();
  CLI::App* sub =
      app.add_subcommand("bench", "Benchmark generation: TTFT, decode latency, throughput, bandwidth, as medians");
  sub->add_option("-m,--model", f->model,
                  "Model to benchmark: a checkpoint directory, an .onnx decoder or a .k3m file");
  sub->add_option("--compare", f->compare,
                  "Several models, comma-separated, measured run by run interleaved; ratios vs the first. "
                  "With --model: opt levels, e.g. O0,O3 (the model compiled at each)");
  sub->add_flag("--ablate", f->ablate,
                "Measure --model at O3 and with each optimization pass switched off in turn (its contribution)");
  sub->add_option("-b,--batch", f->batches, "Batch sizes, comma-separated (e.g. 1,4,8)");
  sub->add_option("-p,--prompt-len", f->prompt_len, "Prompt tokens per sequence")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sub->add_option("-n,--gen-len", f->gen_len, "Generated tokens per sequence")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sub->add_option("-r,--repeat", f->repeat, "Measured runs per configuration")->check(CLI::Range(1, 1000));
  sub->add_option("--warmup", f->warmup, "Unmeasured runs first")->check(CLI::Range(0, 100));
  sub->add_option("-t,--threads", f->threads, "Threads; 0 = all cores")->check(CLI::Range(0, 1024));
  sub->add_option("--cpus", f->cpus,
                  "Pin thread t to the t-th CPU of this list (taskset -c syntax, e.g. 0,1 or 0-3); "
                  "one CPU per thread, --threads defaults to their count");
  sub->add_option("--temp,--temperature", f->temperature, "Sampling temperature (article: 0.8)")
      ->check(CLI::Range(0.0f, 100.0f));
  sub->add_option("--top-p", f->top_p, "Nucleus mass (article: 0.95)")->check(CLI::Range(0.0f, 1.0f));
  sub->add_option("--top-k", f->top_k, "Top-k; 0 = off")->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  sub->add_option("-s,--seed", f->seed, "Base seed (run r uses seed + r)")->check(CLI::Range(int64_t{0}, INT64_MAX));
  sub->add_option("--json", f->json, "Also write the results as JSON to this file");
  sub->add_option("--markdown", f->markdown, "Also write the table as Markdown to this file");
  sub->add_option("--plot", f->plot, "Also write an SVG plot (latency and throughput against batch size)");
  sub->add_flag(
      "--compare-moe", f->compare_moe,
      "Compare the routed MoE (only chosen experts run) with the article's dense one-hot-mask MoE on --model");
  sub->add_flag("--compare-mmap", f->compare_mmap,
                "Compare --model (.k3m) with its weights mapped against read into 2 MiB pages (the default)");
  add_mmap_flag(sub, &f->mmap);
  add_isa_flag(sub, &f->isa, &f->prefetch);
  sub->add_flag("--no-sysinfo", f->no_sysinfo, "Do not measure/read machine limits (no bandwidth fraction)");
  sub->add_flag("--no-probe", f->no_probe,
                "Do not re-measure read bandwidth after each run (the fraction then uses the k3 sysinfo cache)");
  return {sub, [f]() { return run(*f); }};
}

}  // namespace k3::cli
