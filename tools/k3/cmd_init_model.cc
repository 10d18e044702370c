// k3 init-model: write a checkpoint with deterministic random weights.
#include <cstdio>

#include "commands.h"
#include "frontend/checkpoint/checkpoint.h"

namespace k3::cli {

Registered add_init_model(CLI::App& app) {
  struct Opts {
    std::string preset, config, out, dtype = "f32";
    uint64_t seed = 0;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* sub = app.add_subcommand("init-model", "Write a K3 checkpoint (config.json + model.safetensors) with random weights");
  // From the preset table, so the help cannot fall behind it.
  sub->add_option("--preset", o->preset, "Model preset: " + preset_list());
  sub->add_option("--config", o->config, "A config.json to use instead of (or to override) a preset")->check(CLI::ExistingFile);
  sub->add_option("--seed", o->seed, "Random seed; the same seed gives the same bytes")->required();
  sub->add_option("--out", o->out, "Output directory")->required();
  sub->add_option("--dtype", o->dtype, "Weight dtype in the file")->check(CLI::IsMember({"f32", "bf16"}));
  return {sub, [o]() {
    if (o->preset.empty() == o->config.empty()) return report(invalid_argument("give exactly one of --preset or --config"));
    StatusOr<ModelConfig> cfg = o->preset.empty() ? load_config(o->config) : preset_config(o->preset);
    if (!cfg.ok()) return report(cfg.status());
    Status s = init_model(*cfg, o->seed, o->dtype == "bf16" ? ir::DType::kBF16 : ir::DType::kF32, o->out);
    if (!s.ok()) return report(s);
    std::printf("wrote %s (%.1fM parameters, %s)\n", o->out.c_str(), static_cast<double>(cfg->param_count()) / 1e6, o->dtype.c_str());
    return 0;
  }};
}

}  // namespace k3::cli
