// k3 sysinfo: what this machine offers the kernels (the measured limits come
// with the measurement tools; this reports what CPUID and the OS say).
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "commands.h"
#include "kernels/kernels.h"

namespace k3::cli {
namespace {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      return p == std::string::npos ? line : line.substr(p + 2);
    }
  return "unknown";
}

}  // namespace

Registered add_sysinfo(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  CLI::App* sub = app.add_subcommand("sysinfo", "Describe this machine: CPU, instruction sets, caches, threads");
  sub->add_flag("--json", *json, "Print JSON");
  return {sub, [json]() {
            nlohmann::json j;
            j["cpu"] = cpu_model();
            j["hardware_threads"] = std::thread::hardware_concurrency();
            j["kernel_isa"] = std::string(kernels::isa_name(kernels::best_table().isa));
            j["cpu_isa"] = std::string(kernels::isa_name(kernels::detect_isa()));
            j["l1d_bytes"] = sysconf(_SC_LEVEL1_DCACHE_SIZE);
            j["l2_bytes"] = sysconf(_SC_LEVEL2_CACHE_SIZE);
            j["l3_bytes"] = sysconf(_SC_LEVEL3_CACHE_SIZE);
            if (*json) {
              std::printf("%s\n", j.dump(2).c_str());
            } else {
              for (auto it = j.begin(); it != j.end(); ++it) std::printf("%-18s %s\n", it.key().c_str(), it.value().dump().c_str());
            }
            return 0;
          }};
}

}  // namespace k3::cli
