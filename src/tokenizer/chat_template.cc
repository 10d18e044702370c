// Chat templates (see chat_template.h): loading chat_template and the special
// tokens from tokenizer_config.json, and rendering with the context
// transformers' apply_chat_template builds.
#include "tokenizer/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

namespace k3::tok {

using Json = nlohmann::ordered_json;

StatusOr<ChatTemplate> ChatTemplate::parse(std::string_view source) {
  K3_ASSIGN_OR_RETURN(jinja::Body body, jinja::parse_template(source));
  ChatTemplate t;
  t.body_ = std::make_shared<const jinja::Body>(std::move(body));
  return t;
}

StatusOr<std::string> ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                           const Json& extra_context, const jinja::RenderOptions& options) const {
  Json arr = Json::array();
  for (const auto& m : messages) arr.push_back(Json{{"role", m.role}, {"content", m.content}});
  return render_json(arr, add_generation_prompt, extra_context, options);
}

StatusOr<std::string> ChatTemplate::render_json(const Json& messages, bool add_generation_prompt,
                                                const Json& extra_context, const jinja::RenderOptions& options) const {
  if (!body_) return invalid_argument("chat template not parsed");
  if (!messages.is_array()) return invalid_argument("chat messages must be a JSON array");
  if (!extra_context.is_null() && !extra_context.is_object())
    return invalid_argument("chat template context must be a JSON object");
  Json context = Json::object();
  context["messages"] = messages;
  context["tools"] = nullptr;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = add_generation_prompt;
  if (extra_context.is_object())
    for (const auto& [k, v] : extra_context.items()) context[k] = v;
  return jinja::render(*body_, context, options);
}

StatusOr<ChatTemplateConfig> chat_template_config_from_json(const Json& config, std::string_view name) {
  if (!config.is_object()) return invalid_argument("tokenizer_config.json: not a JSON object");
  ChatTemplateConfig out;
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return not_found("tokenizer_config.json has no chat_template");
  const std::string want = name.empty() ? "default" : std::string(name);
  if (it->is_string()) {
    if (!name.empty() && name != "default")
      return not_found("tokenizer_config.json has a single chat_template, not one named '" + want + "'");
    out.source = it->get<std::string>();
  } else if (it->is_array()) {
    std::string names;
    for (const auto& entry : *it) {
      if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() || !entry.contains("template") ||
          !entry["template"].is_string())
        return invalid_argument("tokenizer_config.json: chat_template list entries must be {name, template}");
      const std::string n = entry["name"].get<std::string>();
      names += (names.empty() ? "" : ", ") + n;
      if (n == want) out.source = entry["template"].get<std::string>();
    }
    if (out.source.empty()) return not_found("no chat_template named '" + want + "' (have: " + names + ")");
  } else {
    return invalid_argument("tokenizer_config.json: chat_template must be a string or a list");
  }
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    auto t = config.find(key);
    if (t == config.end() || t->is_null()) continue;
    if (t->is_string()) {
      out.special_tokens[key] = *t;
    } else if (t->is_object() && t->contains("content") && (*t)["content"].is_string()) {
      out.special_tokens[key] = (*t)["content"];
    }
  }
  auto extra = config.find("additional_special_tokens");
  if (extra != config.end() && extra->is_array() && !extra->empty()) {
    Json list = Json::array();
    for (const auto& t : *extra) {
      if (t.is_string()) list.push_back(t);
      if (t.is_object() && t.contains("content") && t["content"].is_string()) list.push_back(t["content"]);
    }
    out.special_tokens["additional_special_tokens"] = list;
  }
  return out;
}

StatusOr<ChatTemplateConfig> load_chat_template_config(const std::string& path, std::string_view name) {
  std::filesystem::path p(path);
  std::error_code ec;
  if (std::filesystem::is_directory(p, ec)) p /= "tokenizer_config.json";
  std::ifstream in(p, std::ios::binary);
  if (!in) return not_found("cannot open " + p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  Json config = Json::parse(ss.str(), nullptr, false);
  if (config.is_discarded()) return invalid_argument(p.string() + ": not valid JSON");
  auto r = chat_template_config_from_json(config, name);
  if (!r.ok()) return Status(r.status().code(), p.string() + ": " + r.status().message());
  return r;
}

}  // namespace k3::tok
