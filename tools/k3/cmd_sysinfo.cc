// k3 sysinfo: this machine's measured limits (memory bandwidth, compute
// peaks) plus its caches and instruction sets, the denominators for every
// performance number K3 reports. Results are cached per machine (see
// profile/sysinfo.h); --refresh re-measures.
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "kernels/kernels.h"
#include "profile/sysinfo.h"

namespace k3::cli {
namespace {

struct SysinfoFlags {
  bool json = false;
  bool refresh = false;
  int threads = 0;
  int64_t read_mib = 0;  // 0: the default pass (profile::default_bytes_per_array)
};

std::string bytes_text(int64_t b) {
  if (b <= 0) return "unknown";
  if (b % (int64_t{1} << 20) == 0) return std::to_string(b >> 20) + " MiB";
  if (b % (int64_t{1} << 10) == 0) return std::to_string(b >> 10) + " KiB";
  return std::to_string(b) + " B";
}

std::string optional_text(const std::optional<double>& v, const char* unit) {
  if (!v) return "unavailable (CPU lacks the instruction)";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f %s per core", *v, unit);
  return buf;
}

void print_table(const profile::SysInfo& s) {
  std::printf("cpu                %s\n", s.cpu.c_str());
  std::printf("hardware threads   %d\n", s.hardware_threads);
  std::printf("simd               kernels use %s; cpu has %s\n", s.kernel_isa.c_str(), s.cpu_isa.c_str());
  // Not cached with the measurements: K3_PREFETCH can change it per process.
  if (const std::string_view p = kernels::table_prefetch(kernels::best_table()); !p.empty())
    std::printf("prefetch           %s (weights streamed by the kernels; --prefetch or K3_PREFETCH=l1|l2 to change)\n",
                std::string(p).c_str());
  std::printf("caches             L1d %s, L2 %s, L3 %s\n", bytes_text(s.l1d_bytes).c_str(), bytes_text(s.l2_bytes).c_str(),
              bytes_text(s.l3_bytes).c_str());
  const int max_t = s.max_measured_threads();
  std::printf("peak fp32 fma      %.1f GFLOP/s per core, %.1f total (%d threads)\n", s.fp32_gflops_per_core, s.fp32_gflops_total, max_t);
  std::printf("peak bf16 dot      %s\n", optional_text(s.bf16_gflops_per_core, "GFLOP/s").c_str());
  std::printf("peak bf16 amx      %s\n", optional_text(s.amx_bf16_gflops_per_core, "GFLOP/s").c_str());
  std::printf("peak int8 amx      %s\n", optional_text(s.amx_int8_gops_per_core, "GOP/s").c_str());
  std::string int8_dot = optional_text(s.int8_gops_per_core, "GOP/s");
  if (const char* name = profile::int8_dot_instruction(); s.int8_gops_per_core && name)
    int8_dot += std::string(" (") + name + ")";
  std::printf("peak int8 dot      %s\n", int8_dot.c_str());
  if (s.core_round_trip_ns)
    std::printf(
        "core round trip    %.0f ns (threads 0 and 1 handing a cache line back and forth; on one host "
        "50-65 with the cores sharing an L3, 300-400 without; docs/performance.md)\n",
        *s.core_round_trip_ns);
  std::printf("measured           %s, %s per read pass, median of %d\n\n", s.measured_at.c_str(), bytes_text(s.bytes_per_measurement).c_str(),
              s.repetitions);
  std::printf("%-8s %7s %8s %9s\n", "test", "threads", "streams", "GB/s");
  for (int t = 1; t <= max_t; ++t) {
    bool any = false;
    for (const auto& p : s.read)
      if (p.threads == t) {
        std::printf("%-8s %7d %8d %9.2f\n", "read", t, p.streams_per_thread, p.gb_per_s);
        any = true;
      }
    if (any) std::printf("%-8s %7d %8s %9.2f\n", "read", t, "best", s.best_read_gb_per_s(t));
    for (const auto& [threads, gb] : s.copy)
      if (threads == t) std::printf("%-8s %7d %8s %9.2f\n", "copy", t, "-", gb);
    for (const auto& [threads, gb] : s.triad)
      if (threads == t) std::printf("%-8s %7d %8s %9.2f\n", "triad", t, "-", gb);
  }
}

int run_sysinfo(const SysinfoFlags& f) {
  // A chosen pass size is an experiment (how much of the pass the caches
  // serve), not the machine's limits: measured, printed, never cached.
  profile::MeasureOptions o;
  o.max_threads = f.threads;
  o.bytes_per_array = f.read_mib * (int64_t{1} << 20) / 2;
  auto info = f.read_mib > 0 ? profile::measure_sysinfo(o) : profile::load_or_measure_sysinfo(f.threads, f.refresh);
  if (!info.ok()) return report(info.status());
  if (f.json) {
    std::printf("%s\n", info->to_json().dump(2).c_str());
  } else {
    print_table(*info);
    const std::string path = profile::sysinfo_cache_path();
    if (f.read_mib > 0)
      std::printf("\nnot cached: --read-mib measures a chosen pass size, not this machine's limits\n");
    else if (!path.empty())
      std::printf("\ncache              %s (--refresh to re-measure)\n", path.c_str());
  }
  return 0;
}

}  // namespace

Registered add_sysinfo(CLI::App& app) {
  auto f = std::make_shared<SysinfoFlags>();
  CLI::App* sub = app.add_subcommand("sysinfo", "Measure this machine's limits: memory bandwidth, compute peaks, caches, SIMD");
  sub->add_flag("--json", f->json, "Print JSON");
  CLI::Option* refresh = sub->add_flag("--refresh", f->refresh, "Re-measure instead of using the cached result");
  sub->add_option("-t,--threads", f->threads, "Measure 1..N threads; 0 = all hardware threads")->check(CLI::Range(0, 1024));
  sub->add_option("--read-mib", f->read_mib,
                  "Bytes per read pass in MiB, measured now and not cached (default: 256, or twice the L3 where that "
                  "is more, within 1/8 of RAM, so the pass measures memory; smaller passes show how much the caches "
                  "serve)")
      ->check(CLI::Range(1, 16384))
      ->excludes(refresh);  // it always measures and never touches the cache
  return {sub, [f]() { return run_sysinfo(*f); }};
}

}  // namespace k3::cli
