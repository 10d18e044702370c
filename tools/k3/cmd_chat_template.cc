// k3 chat-template: render a conversation with the chat_template of a
// tokenizer_config.json (as transformers' apply_chat_template would), to
// debug prompts and compare with Python.
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "commands.h"
#include "tokenizer/chat_template.h"

namespace k3::cli {
namespace {

using Json = nlohmann::ordered_json;

struct ChatTemplateFlags {
  std::string config;
  std::string template_file;
  std::string template_name;
  std::string messages;
  std::string context;
  bool add_generation_prompt = false;
  int64_t now = -1;
};

StatusOr<Json> read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  Json j = Json::parse(ss.str(), nullptr, false);
  if (j.is_discarded()) return invalid_argument(path + ": not valid JSON");
  return j;
}

int run_chat_template(const ChatTemplateFlags& f) {
  tok::ChatTemplateConfig config;
  if (!f.config.empty()) {
    auto loaded = tok::load_chat_template_config(f.config, f.template_name);
    if (!loaded.ok()) return report(loaded.status());
    config = std::move(*loaded);
  }
  if (!f.template_file.empty()) {
    std::ifstream in(f.template_file, std::ios::binary);
    if (!in) return report(not_found("cannot open " + f.template_file));
    std::ostringstream ss;
    ss << in.rdbuf();
    config.source = ss.str();
  }
  if (f.config.empty() && f.template_file.empty())
    return report(invalid_argument("give --tokenizer-config and/or --template"));
  auto messages = read_json_file(f.messages);
  if (!messages.ok()) return report(messages.status());
  Json context = config.special_tokens;
  if (!f.context.empty()) {
    auto extra = read_json_file(f.context);
    if (!extra.ok()) return report(extra.status());
    if (!extra->is_object()) return report(invalid_argument(f.context + ": must hold a JSON object"));
    for (const auto& [k, v] : extra->items()) context[k] = v;
  }
  auto tmpl = tok::ChatTemplate::parse(config.source);
  if (!tmpl.ok()) return report(tmpl.status());
  tok::jinja::RenderOptions options;
  options.now_epoch_seconds = f.now;
  auto text = tmpl->render_json(*messages, f.add_generation_prompt, context, options);
  if (!text.ok()) return report(text.status());
  std::fwrite(text->data(), 1, text->size(), stdout);
  return 0;
}

}  // namespace

Registered add_chat_template(CLI::App& app) {
  auto f = std::make_shared<ChatTemplateFlags>();
  CLI::App* sub = app.add_subcommand("chat-template", "Render messages with a tokenizer_config.json chat_template");
  sub->add_option("--tokenizer-config", f->config,
                  "tokenizer_config.json, or the directory holding it (chat_template and special tokens)");
  sub->add_option("--template", f->template_file, "A file holding the Jinja template (overrides the config's)");
  sub->add_option("--template-name", f->template_name, "Which named chat_template of a list (default: \"default\")");
  sub->add_option("--messages", f->messages, "JSON file: a list of {role, content, ...} messages")->required();
  sub->add_option("--context", f->context,
                  "JSON file: an object of extra template variables (tools, date_string, bos_token, ...)");
  sub->add_flag("--add-generation-prompt", f->add_generation_prompt, "End with the assistant turn's header");
  sub->add_option("--now", f->now, "Seconds since the epoch strftime_now() formats (default: now)");
  return {sub, [f]() { return run_chat_template(*f); }};
}

}  // namespace k3::cli
