// Presenting bench results: terminal table, JSON, Markdown and an SVG plot.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "bench_runner.h"

namespace k3::cli {

std::string bench_table(const BenchResult& r);     // terminal / Markdown-compatible table
nlohmann::json bench_json(const BenchResult& r);
std::string bench_svg(const BenchResult& r);       // latency and throughput against batch size

}  // namespace k3::cli
