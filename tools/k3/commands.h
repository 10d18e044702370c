// The k3 subcommands: each registers its flags on the CLI11 app and returns
// the function that runs it (exit code).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

#include "kernels/kernels.h"
#include "util/status.h"

namespace k3::runtime {
class Engine;
}

namespace k3::cli {

using Command = std::function<int()>;
// A registered subcommand and what runs it.
struct Registered {
  CLI::App* app;
  Command run;
};

Registered add_init_model(CLI::App& app);
Registered add_generate(CLI::App& app);
Registered add_sysinfo(CLI::App& app);
Registered add_profile(CLI::App& app);
Registered add_bench(CLI::App& app);
Registered add_lint(CLI::App& app);
Registered add_run(CLI::App& app);
Registered add_tokenize(CLI::App& app);
Registered add_detokenize(CLI::App& app);
Registered add_chat_template(CLI::App& app);
Registered add_chat(CLI::App& app);
Registered add_compile(CLI::App& app);
Registered add_quality(CLI::App& app);

// Prints "k3: error: <message>" on stderr and returns the exit code for it.
int report(const Status& status);

// "1,2,3" -> ids; error names the bad entry.
StatusOr<std::vector<int32_t>> parse_id_list(const std::string& text);

// The threads an engine given --threads and --cpus will run: --threads, else
// one per listed CPU, else every core (an invalid list counts as unset: the
// engine reports it).
int engine_threads(int threads, const std::string& cpus);

// --mmap, the same text in every command that loads a model.
void add_mmap_flag(CLI::App* sub, bool* mmap);

// One "k3: note:" line on stderr for each weight layout the engine's kernel
// table has no fast kernel for: the tile layout (k3 compile --weight-layout
// tiles) off the amx table, which the others unpack and run slower than on
// rows; int8 panels (--precision int8|int8-channel --weight-layout panels) on a table
// other than scalar that runs the scalar kernel for them (no AVX-512 VNNI).
void note_layout_kernels(const runtime::Engine& engine);

// --isa scalar|avx2|avx512|amx and --prefetch l1|l2, the same in every
// command that runs a model.
void add_isa_flag(CLI::App* sub, std::string* isa, std::string* prefetch);
// The kernel table --isa and --prefetch name: nullptr when both are "" (the
// engine's default: the best up to avx512, prefetching where this CPU
// streams best), an error naming the flag if this CPU cannot run it.
StatusOr<const kernels::KernelTable*> kernels_for_isa_flag(const std::string& isa, const std::string& prefetch);

}  // namespace k3::cli
