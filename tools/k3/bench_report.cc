// Bench reports. The table is Markdown, so the terminal output can be pasted
// as it is; with several models each metric gets a ratio column against the
// first (the baseline), as in the article's baseline/optimized table.
#include "bench_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

namespace k3::cli {
namespace {

std::string fmt(double v, int prec = 2) {
  if (v < 0) return "-";  // not measured
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", prec, v);
  return buf;
}

struct Metric {
  const char* name;
  double (*get)(const BenchPoint&);
  bool lower_is_better;
  int prec;
};

const Metric kMetrics[] = {
    {"TTFT ms", [](const BenchPoint& p) { return p.ttft_ms.median; }, true, 2},
    {"decode ms/token", [](const BenchPoint& p) { return p.decode_ms_per_step.median; }, true, 3},
    {"total ms", [](const BenchPoint& p) { return p.total_ms.median; }, true, 1},
    {"tokens/s", [](const BenchPoint& p) { return p.tokens_per_s.median; }, false, 1},
    {"decode tokens/s", [](const BenchPoint& p) { return p.decode_tokens_per_s.median; }, false, 1},
    {"requests/s", [](const BenchPoint& p) { return p.requests_per_s.median; }, false, 3},
    {"decode GB/s", [](const BenchPoint& p) { return p.decode_gb_per_s.median; }, false, 1},
};

nlohmann::json stat_json(const Stat& s) {
  return {{"median", s.median}, {"min", s.min}, {"max", s.max}};
}

// Whether the core round trip was timed after this point's runs (two or
// more threads and the in-run probe on; BenchPoint::round_trip_ns).
bool has_round_trip(const BenchPoint& p) {
  return p.round_trip_ns.median > 0;
}

}  // namespace

// --ablate: one row per configuration (O3, then O3 minus one pass), the
// pass's contribution as the slowdown without it.
std::string ablation_table(const BenchResult& r) {
  std::string out = "ablation: " + r.settings.models[0] + " | prompt " + std::to_string(r.settings.prompt_len) +
                    ", generate " + std::to_string(r.settings.gen_len) + ", " + std::to_string(r.threads) +
                    " threads, " + r.kernels + ", medians of " + std::to_string(r.settings.repeat) + " runs\n";
  auto ratio = [](double without, double with) {
    return without < 0 || with <= 0 ? std::string("-") : fmt(without / with, 2) + "x";
  };
  for (int64_t batch : r.settings.batches) {
    std::vector<const BenchPoint*> pts;
    for (const auto& p : r.points)
      if (p.batch == batch) pts.push_back(&p);
    out +=
        "\nbatch " + std::to_string(batch) +
        "\n\n| configuration | decode ms/token | slower than O3 | TTFT ms | slower than O3 | allocations per step |\n"
        "|---|---:|---:|---:|---:|---:|\n";
    for (const BenchPoint* p : pts)
      out += "| " + p->label + " | " + fmt(p->decode_ms_per_step.median, 3) + " | " +
             ratio(p->decode_ms_per_step.median, pts[0]->decode_ms_per_step.median) + " | " +
             fmt(p->ttft_ms.median, 2) + " | " + ratio(p->ttft_ms.median, pts[0]->ttft_ms.median) + " | " +
             fmt(p->allocations_per_step, 1) + " |\n";
  }
  return out;
}

std::string bench_table(const BenchResult& r) {
  if (r.settings.ablate) return ablation_table(r);
  const auto& labels = r.settings.labels;
  std::string out;
  out += "model: " + labels[0];
  for (size_t i = 1; i < labels.size(); ++i) out += " vs " + labels[i];
  out += " | prompt " + std::to_string(r.settings.prompt_len) + ", generate " + std::to_string(r.settings.gen_len) +
         ", " + std::to_string(r.threads) + " threads, " + r.kernels + ", medians of " +
         std::to_string(r.settings.repeat) + " runs\n\n";
  for (int64_t batch : r.settings.batches) {
    std::vector<const BenchPoint*> pts;
    for (const auto& p : r.points)
      if (p.batch == batch) pts.push_back(&p);
    out += "batch " + std::to_string(batch) + "\n\n| metric |";
    for (const auto* p : pts) out += " " + p->label + " |";
    for (size_t i = 1; i < pts.size(); ++i) out += " " + pts[i]->label + " vs " + pts[0]->label + " |";
    out += "\n|---|";
    for (size_t i = 0; i < pts.size() * 2 - 1; ++i) out += "---:|";
    out += "\n";
    for (const Metric& m : kMetrics) {
      out += std::string("| ") + m.name + " |";
      for (const auto* p : pts) out += " " + fmt(m.get(*p), m.prec) + " |";
      for (size_t i = 1; i < pts.size(); ++i) {
        const double a = m.get(*pts[0]), b = m.get(*pts[i]);
        // Speedup: > 1 means the compared model is better on this metric.
        const double ratio = m.lower_is_better ? (b > 0 ? a / b : 0) : (a > 0 ? b / a : 0);
        out += a < 0 || b < 0 ? std::string(" - |") : " " + fmt(ratio, 2) + "x |";  // "-": not measured
      }
      out += "\n";
    }
    auto row = [&](const char* name, auto get, int prec) {
      out += std::string("| ") + name + " |";
      for (const auto* p : pts) out += " " + fmt(get(*p), prec) + " |";
      for (size_t i = 1; i < pts.size(); ++i) out += " |";
      out += "\n";
    };
    row(
        "MB read per step", [](const BenchPoint& p) { return p.bytes_per_step / 1e6; }, 1);
    const bool probed =
        std::any_of(pts.begin(), pts.end(), [](const BenchPoint* p) { return p->probe_gb_per_s.median > 0; });
    if (probed)
      row(
          "read bandwidth now GB/s", [](const BenchPoint& p) { return p.probe_gb_per_s.median; }, 1);
    if (std::any_of(pts.begin(), pts.end(), [](const BenchPoint* p) { return has_round_trip(*p); }))
      row(
          "core round trip ns", [](const BenchPoint& p) { return p.round_trip_ns.median; }, 0);
    if (r.settings.read_gb_per_s > 0 || probed)
      row(
          "% of read bandwidth",
          [](const BenchPoint& p) { return p.read_fraction < 0 ? -1.0 : 100.0 * p.read_fraction; }, 1);
    row(
        "first-request TTFT ms", [](const BenchPoint& p) { return p.first_ttft_ms; }, 2);
    row(
        "first-request ms/token", [](const BenchPoint& p) { return p.first_decode_ms_per_step; }, 3);
    row(
        "allocations per step", [](const BenchPoint& p) { return p.allocations_per_step; }, 1);
    out += "\n";
  }
  // Where each model's weights live, and what loading cost (once per model).
  for (size_t i = 0; i < r.points.size(); ++i)
    if (i == 0 || r.points[i].label != r.points[i - 1].label)
      out += "weights of " + r.points[i].label + ": " + r.points[i].weights_memory + "; loaded in " +
             fmt(r.points[i].load_ms, 0) + " ms\n";
  if (r.settings.has_read_probe())
    out +=
        "read bandwidth now: the machine's best read bandwidth measured right after each run (median); "
        "% of read bandwidth is the median over runs of the run's GB/s over that measurement\n";
  if (std::any_of(r.points.begin(), r.points.end(), has_round_trip))
    out +=
        "core round trip: ns for two threads to hand a cache line back and forth, taken with each probe "
        "(where vCPUs move, tens of ns on one L3, hundreds across two; docs/performance.md)\n";
  if (r.settings.read_gb_per_s > 0)
    out += "machine read bandwidth (k3 sysinfo cache" +
           std::string(r.settings.has_read_probe() ? ", for reference" : "") +
           "): " + fmt(r.settings.read_gb_per_s, 1) + " GB/s\n";
  return out;
}

nlohmann::json bench_json(const BenchResult& r) {
  nlohmann::json j;
  j["settings"] = {{"models", r.settings.models},
                   {"labels", r.settings.labels},
                   {"batches", r.settings.batches},
                   {"prompt_len", r.settings.prompt_len},
                   {"gen_len", r.settings.gen_len},
                   {"repeat", r.settings.repeat},
                   {"warmup", r.settings.warmup},
                   {"threads", r.threads},
                   {"isa", r.isa},
                   {"prefetch", r.prefetch.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.prefetch)},
                   {"temperature", r.settings.sampling.temperature},
                   {"top_k", r.settings.sampling.top_k},
                   {"top_p", r.settings.sampling.top_p},
                   {"read_gb_per_s", r.settings.read_gb_per_s}};
  j["results"] = nlohmann::json::array();
  for (const BenchPoint& p : r.points) {
    j["results"].push_back(
        {{"label", p.label},
         {"batch", p.batch},
         {"ttft_ms", stat_json(p.ttft_ms)},
         {"decode_ms_per_token", stat_json(p.decode_ms_per_step)},
         {"total_ms", stat_json(p.total_ms)},
         {"tokens_per_s", stat_json(p.tokens_per_s)},
         {"decode_tokens_per_s", stat_json(p.decode_tokens_per_s)},
         {"requests_per_s", stat_json(p.requests_per_s)},
         {"decode_gb_per_s", stat_json(p.decode_gb_per_s)},
         {"bytes_per_step", p.bytes_per_step},
         {"read_bandwidth_fraction", p.read_fraction},
         {"read_gb_per_s_now", stat_json(p.probe_gb_per_s)},
         {"core_round_trip_ns", has_round_trip(p) ? stat_json(p.round_trip_ns) : nlohmann::json(nullptr)},
         {"first_request_ttft_ms", p.first_ttft_ms},
         {"first_request_decode_ms_per_token", p.first_decode_ms_per_step},
         {"allocations_per_step", p.allocations_per_step},
         {"load_ms", p.load_ms},
         {"weights_memory", p.weights_memory}});
  }
  return j;
}

std::string bench_svg(const BenchResult& r) {
  // Two panels: decode ms/token and tokens/s against batch size, a line per model.
  const int w = 420, h = 300, pad = 50;
  const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"};
  std::string svg =
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(2 * w) + "\" height=\"" +
      std::to_string(h + 30) +
      "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  const auto& batches = r.settings.batches;
  const double bmax = static_cast<double>(*std::max_element(batches.begin(), batches.end()));
  for (int panel = 0; panel < 2; ++panel) {
    auto value = [&](const BenchPoint& p) { return panel == 0 ? p.decode_ms_per_step.median : p.tokens_per_s.median; };
    double vmax = 0;
    for (const auto& p : r.points) vmax = std::max(vmax, value(p));
    if (vmax <= 0) vmax = 1;
    const int x0 = panel * w + pad, y0 = h - pad / 2, pw = w - pad - 20, ph = h - pad - 10;
    auto px = [&](double b) { return x0 + (bmax > 1 ? (b - 1) / (bmax - 1) : 0.5) * pw; };
    auto py = [&](double v) { return y0 - v / (vmax * 1.1) * ph; };
    svg +=
        "<text x=\"" + std::to_string(x0) + "\" y=\"16\" font-weight=\"bold\">" +
        (panel == 0 ? std::string("decode ms/token (lower is better)") : std::string("tokens/s (higher is better)")) +
        "</text>\n";
    svg += "<line x1=\"" + std::to_string(x0) + "\" y1=\"" + std::to_string(y0) + "\" x2=\"" + std::to_string(x0 + pw) +
           "\" y2=\"" + std::to_string(y0) + "\" stroke=\"black\"/>\n<line x1=\"" + std::to_string(x0) + "\" y1=\"" +
           std::to_string(y0) + "\" x2=\"" + std::to_string(x0) + "\" y2=\"" + std::to_string(y0 - ph) +
           "\" stroke=\"black\"/>\n";
    for (int k = 0; k <= 4; ++k) {
      const double v = vmax * 1.1 * k / 4;
      svg += "<text x=\"" + std::to_string(x0 - 5) + "\" y=\"" + fmt(py(v) + 4, 1) + "\" text-anchor=\"end\">" +
             fmt(v, v < 10 ? 2 : 0) + "</text>\n";
    }
    for (int64_t b : batches)
      svg += "<text x=\"" + fmt(px(static_cast<double>(b)), 1) + "\" y=\"" + std::to_string(y0 + 15) +
             "\" text-anchor=\"middle\">" + std::to_string(b) + "</text>\n";
    svg += "<text x=\"" + std::to_string(x0 + pw / 2) + "\" y=\"" + std::to_string(y0 + 28) +
           "\" text-anchor=\"middle\">batch size</text>\n";
    for (size_t li = 0; li < r.settings.labels.size(); ++li) {
      std::string pts;
      for (const auto& p : r.points)
        if (p.label == r.settings.labels[li]) {
          pts += fmt(px(static_cast<double>(p.batch)), 1) + "," + fmt(py(value(p)), 1) + " ";
          svg += "<circle cx=\"" + fmt(px(static_cast<double>(p.batch)), 1) + "\" cy=\"" + fmt(py(value(p)), 1) +
                 "\" r=\"3\" fill=\"" + colors[li % 5] + "\"/>\n";
        }
      svg += "<polyline fill=\"none\" stroke-width=\"2\" stroke=\"" + std::string(colors[li % 5]) + "\" points=\"" +
             pts + "\"/>\n";
      svg += "<text x=\"" + std::to_string(x0 + 10) + "\" y=\"" + std::to_string(36 + 14 * static_cast<int>(li)) +
             "\" fill=\"" + colors[li % 5] + "\">" + r.settings.labels[li] + "</text>\n";
    }
  }
  return svg + "</svg>\n";
}

}  // namespace k3::cli
