// k3 chat: an interactive conversation with a model. Each line on stdin is
// a user message; the conversation is rendered with the tokenizer's chat
// template (tokenizer_config.json), tokenized, and the reply streamed to
// stdout as it is generated, until the tokenizer's or the model's
// end-of-sequence token. EOF ends the chat.
//
// Every turn re-runs the prefill over the whole conversation: simple and
// exactly what a fresh generate on the rendered text gives (templates may
// rewrite earlier turns, e.g. Qwen3 drops old <think> blocks, so the cached
// prefix is not always reusable). Reusing the KV slot's common prefix is a
// later optimization.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>
#include <string>

#include "commands.h"
#include "runtime/generator.h"
#include "text_io.h"
#include "tokenizer/chat_template.h"

namespace k3::cli {
namespace {

using Json = nlohmann::ordered_json;

struct ChatFlags {
  std::string model;
  std::string tokenizer;
  std::string chat_template;
  std::string system;
  int64_t max_new_tokens = 256;
  float temperature = 0.8f;
  int64_t top_k = 40;
  float top_p = 0.95f;
  int64_t seed = -1;
  int threads = 0;
  std::string cpus;
  bool mmap = false;
  int64_t ctx_size = 0;
  bool json = false;
};

// tokenizer_config.json next to the tokenizer (the chat template and the
// special tokens it is rendered with); --chat-template FILE replaces the
// template text.
StatusOr<tok::ChatTemplateConfig> load_template(const ChatFlags& f, const std::string& tokenizer_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path dir =
      fs::is_directory(tokenizer_path, ec) ? fs::path(tokenizer_path) : fs::path(tokenizer_path).parent_path();
  const fs::path cfg = (dir.empty() ? fs::path(".") : dir) / "tokenizer_config.json";
  tok::ChatTemplateConfig config;
  if (fs::is_regular_file(cfg, ec)) {
    auto loaded = tok::load_chat_template_config(cfg.string());
    if (loaded.ok()) {
      config = std::move(loaded).value();
    } else if (f.chat_template.empty()) {
      return loaded.status();
    }
  }
  if (!f.chat_template.empty()) {
    std::ifstream in(f.chat_template, std::ios::binary);
    if (!in) return not_found("cannot open chat template " + f.chat_template);
    std::ostringstream ss;
    ss << in.rdbuf();
    config.source = ss.str();
  }
  if (config.source.empty()) return not_found("no chat_template in " + cfg.string() + "; give --chat-template FILE");
  return config;
}

int run_chat(const ChatFlags& f) {
  runtime::EngineOptions eo;
  eo.threads = f.threads;
  eo.cpus = f.cpus;
  eo.mmap = f.mmap;
  eo.max_batch = 1;
  eo.ctx_len = f.ctx_size;
  auto engine = runtime::Engine::load(f.model, eo);
  if (!engine.ok()) return report(engine.status());
  auto tokenizer = load_model_tokenizer(f.model, f.tokenizer, (*engine)->config().vocab_size);
  if (!tokenizer.ok()) return report(tokenizer.status());
  std::string tok_path = f.tokenizer;
  if (tok_path.empty()) {
    std::error_code ec;
    tok_path =
        std::filesystem::is_directory(f.model, ec) ? f.model : std::filesystem::path(f.model).parent_path().string();
  }
  auto config = load_template(f, tok_path);
  if (!config.ok()) return report(config.status());
  auto tmpl = tok::ChatTemplate::parse(config->source);
  if (!tmpl.ok()) return report(tmpl.status());

  runtime::GenerateOptions go;
  go.max_new_tokens = f.max_new_tokens;
  go.sampling.temperature = f.temperature;
  go.sampling.top_k = f.top_k;
  go.sampling.top_p = f.top_p;
  go.sampling.seed = f.seed >= 0 ? static_cast<uint64_t>(f.seed) : std::random_device{}();
  add_tokenizer_stop(*tokenizer, go.stop_ids);
  std::optional<StdoutTextStream> stream;
  if (!f.json) go.on_token = [&](int64_t, int32_t id) { stream->push(id); };
  runtime::Generator gen(**engine);

  Json messages = Json::array();
  if (!f.system.empty()) messages.push_back({{"role", "system"}, {"content", f.system}});
  const bool interactive = isatty(STDIN_FILENO) != 0;
  tok::EncodeOptions enc;
  enc.add_special_tokens = false;  // the template writes BOS and the turn markers itself
  std::string line;
  for (int64_t turn = 1;; ++turn) {
    if (interactive) std::fputs("> ", stderr);
    if (!std::getline(std::cin, line)) break;
    messages.push_back({{"role", "user"}, {"content", line}});
    auto text = tmpl->render_json(messages, /*add_generation_prompt=*/true, config->special_tokens);
    if (!text.ok()) return report(text.status());
    auto ids = tokenizer->encode(*text, enc);
    if (!ids.ok()) return report(ids.status());
    if (ids->empty()) return report(invalid_argument("turn " + std::to_string(turn) + ": empty rendered prompt"));
    if (!f.json) stream.emplace(*tokenizer, /*skip_special=*/true);
    auto r = gen.generate({*ids}, go);
    if (!r.ok()) return report(r.status().with_context("turn " + std::to_string(turn)));
    if (stream && !stream->status().ok()) return report(stream->status());
    auto reply = generated_text(*tokenizer, r->tokens[0], /*skip_special=*/true);
    if (!reply.ok()) return report(reply.status());
    if (f.json) {
      const Json out = {{"turn", turn},
                        {"prompt_ids", *ids},
                        {"generated_ids", r->tokens[0]},
                        {"finish_reason", r->finish_reason[0]},
                        {"text", *reply}};
      std::printf("%s\n", out.dump(-1, ' ', false, Json::error_handler_t::replace).c_str());
      std::fflush(stdout);
    } else {
      stream->finish_line();
    }
    messages.push_back({{"role", "assistant"}, {"content", *reply}});
  }
  return 0;
}

}  // namespace

Registered add_chat(CLI::App& app) {
  auto f = std::make_shared<ChatFlags>();
  CLI::App* sub = app.add_subcommand(
      "chat", "Chat with a model: user lines from stdin, replies streamed (chat template from tokenizer_config.json)");
  sub->add_option("-m,--model", f->model, "Model: a .k3m file or a checkpoint directory")->required();
  sub->add_option("--tokenizer", f->tokenizer,
                  "tokenizer.json (or its directory, with tokenizer_config.json); default: the model's directory");
  sub->add_option("--chat-template", f->chat_template, "A file holding the Jinja chat template to use instead");
  sub->add_option("--system", f->system, "System message at the start of the conversation");
  sub->add_option("-n,--max-new-tokens", f->max_new_tokens, "Most tokens per reply")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sub->add_option("--temp,--temperature", f->temperature, "Sampling temperature; 0 = greedy")
      ->check(CLI::Range(0.0f, 100.0f));
  sub->add_option("--top-k", f->top_k, "Keep the k most likely tokens; 0 = all")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  sub->add_option("--top-p", f->top_p, "Nucleus sampling mass in (0, 1]; 1 = off")->check(CLI::Range(0.0f, 1.0f));
  sub->add_option("-s,--seed", f->seed, "Random seed; -1 = random")->check(CLI::Range(int64_t{-1}, INT64_MAX));
  sub->add_option("-t,--threads", f->threads, "Threads; 0 = all cores")->check(CLI::Range(0, 1024));
  sub->add_option("--cpus", f->cpus,
                  "Pin thread t to the t-th CPU of this list (taskset -c syntax, e.g. 0,1 or 0-3); "
                  "one CPU per thread, --threads defaults to their count");
  add_mmap_flag(sub, &f->mmap);
  sub->add_option("-c,--ctx-size", f->ctx_size, "KV cache positions; 0 = the model's max_seq_len")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  sub->add_flag("--json", f->json, "One JSON object per turn (prompt_ids, generated_ids, text) instead of streaming");
  return {sub, [f]() { return run_chat(*f); }};
}

}  // namespace k3::cli
