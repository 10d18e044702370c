// k3: the command-line entry point. Each subcommand lives in its own file.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <thread>
#include <vector>

#include "commands.h"
#include "runtime/engine.h"
#include "runtime/thread_pool.h"

namespace k3::cli {

int report(const Status& status) {
  std::fprintf(stderr, "k3: error: %s\n", status.message().c_str());
  return status.code() == StatusCode::kInvalidArgument || status.code() == StatusCode::kOutOfRange ? 2 : 1;
}

StatusOr<std::vector<int32_t>> parse_id_list(const std::string& text) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i <= text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    std::string item = text.substr(i, j - i);
    while (!item.empty() && (item.back() == ' ' || item.back() == '\r' || item.back() == '\t')) item.pop_back();
    while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.erase(item.begin());
    if (item.empty()) return invalid_argument("empty token id in \"" + text + "\"");
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size()) return invalid_argument("token id \"" + item + "\" is not an integer");
    if (v < 0 || v > INT32_MAX) return out_of_range("token id " + item + " is out of range");
    ids.push_back(static_cast<int32_t>(v));
    i = j + 1;
  }
  return ids;
}

void add_mmap_flag(CLI::App* sub, bool* mmap) {
  sub->add_flag("--mmap", *mmap,
                "Map a .k3m's weights (instant load, shared page cache) instead of reading them into 2 MiB pages, "
                "which decode streams faster (docs/runtime.md)");
}

void note_layout_kernels(const runtime::Engine& engine) {
  if (engine.executor() != Executor::kPlan) return;
  bool tiles = false;
  for (const ir::Value& v : engine.decode_plan().graph().values()) tiles = tiles || v.dtype == ir::DType::kBF16DotT16;
  const kernels::KernelTable& kt = engine.kernels();
  const std::string isa(kernels::isa_name(kt.isa));
  if (tiles && kt.isa != kernels::Isa::kAmx)
    std::fprintf(stderr,
                 "k3: note: the matrices are in the tile layout (--weight-layout tiles), which only the amx kernel "
                 "table (--isa amx) reads directly; the %s table unpacks them and runs slower than on rows\n",
                 isa.c_str());
}

void add_isa_flag(CLI::App* sub, std::string* isa, std::string* prefetch) {
  sub->add_option("--isa", *isa, "Kernel instruction set (default: the best this CPU has up to avx512; amx is opt-in)")
      ->check(CLI::IsMember({"scalar", "avx2", "avx512", "amx"}));
  sub->add_option(
         "--prefetch", *prefetch,
         "Where the avx512/amx kernels prefetch the weights they stream: l1 or l2 (default: l2 on AMD Zen 3/4, "
         "l1 elsewhere, or $K3_PREFETCH; docs/runtime.md)")
      ->check(CLI::IsMember({"l1", "l2"}));
}

StatusOr<const kernels::KernelTable*> kernels_for_isa_flag(const std::string& isa, const std::string& prefetch) {
  if (isa.empty() && prefetch.empty()) return static_cast<const kernels::KernelTable*>(nullptr);
  kernels::Isa want = kernels::best_table().isa;
  if (!isa.empty() && !kernels::parse_isa(isa, &want))
    return invalid_argument("--isa " + isa + " is not an instruction set");
  const kernels::KernelTable* t = kernels::table_for(want);
  if (t == nullptr)
    return invalid_argument("--isa " + std::string(kernels::isa_name(want)) + " is not supported by this CPU");
  if (prefetch.empty()) return t;
  kernels::Prefetch level = kernels::Prefetch::kL1;
  if (!kernels::parse_prefetch(prefetch, &level))
    return invalid_argument("--prefetch " + prefetch + " is not l1 or l2");
  // Only the avx512 and amx tables are built at both levels; asking another
  // for one would be silently ignored.
  if (kernels::table_prefetch(*t).empty())
    return invalid_argument("--prefetch " + prefetch + ": the " + std::string(kernels::isa_name(want)) +
                            " kernels have one prefetch level (only avx512 and amx have two)");
  return kernels::table_for(want, level);
}

int engine_threads(int threads, const std::string& cpus) {
  if (threads > 0) return threads;
  if (!cpus.empty())
    if (auto list = parse_cpu_list(cpus); list.ok()) return static_cast<int>(list->size());
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace k3::cli

int main(int argc, char** argv) {
  CLI::App app{"k3: ahead-of-time compiler and runtime for sparse mixture-of-experts models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "k3 0.1.0");
  std::vector<k3::cli::Registered> commands;
  for (auto add : {k3::cli::add_init_model, k3::cli::add_generate, k3::cli::add_sysinfo, k3::cli::add_profile,
                   k3::cli::add_bench, k3::cli::add_lint, k3::cli::add_run, k3::cli::add_compile, k3::cli::add_quality,
                   k3::cli::add_tokenize, k3::cli::add_detokenize, k3::cli::add_chat_template, k3::cli::add_chat})
    commands.push_back(add(app));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& c : commands)
      if (c.app->parsed()) return c.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k3: error: %s\n", e.what());
    return 1;
  }
  return 1;
}
