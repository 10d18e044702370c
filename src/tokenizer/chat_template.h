// Chat templates: the Jinja `chat_template` of a Hugging Face
// tokenizer_config.json, rendered the way transformers' apply_chat_template
// does (jinja2 with trim_blocks/lstrip_blocks, its tojson filter and the
// raise_exception/strftime_now globals) by a small Jinja subset in C++
// (jinja_lexer, jinja_parser, jinja_eval). See docs/tokenizer.md.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/jinja_eval.h"
#include "util/status.h"

namespace k3::tok {

struct ChatMessage {
  std::string role;
  std::string content;
};

class ChatTemplate {
 public:
  // Parses a template; syntax errors name the line.
  static StatusOr<ChatTemplate> parse(std::string_view source);

  // Renders `messages` ({role, content} each). extra_context supplies the
  // other variables (bos_token, eos_token, tools, date_string, ...); its keys
  // override the defaults messages / add_generation_prompt / tools=None /
  // documents=None.
  StatusOr<std::string> render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                               const nlohmann::ordered_json& extra_context = nlohmann::ordered_json::object(),
                               const jinja::RenderOptions& options = {}) const;

  // As render(), with messages as a JSON array of objects (which may carry
  // more than role/content: tool_calls, reasoning_content, ...).
  StatusOr<std::string> render_json(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                    const nlohmann::ordered_json& extra_context = nlohmann::ordered_json::object(),
                                    const jinja::RenderOptions& options = {}) const;

 private:
  std::shared_ptr<const jinja::Body> body_;
};

// What a tokenizer_config.json says about chat: the template text and the
// special tokens transformers passes to it (bos_token, eos_token, unk_token,
// sep_token, pad_token, cls_token, mask_token, additional_special_tokens;
// only those set, AddedToken objects reduced to their content).
struct ChatTemplateConfig {
  std::string source;
  nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object();
};

// Reads tokenizer_config.json (`path` is the file or the directory holding
// it). chat_template may be a string or a list of {name, template}; `name`
// picks one of the list ("default" when empty).
StatusOr<ChatTemplateConfig> load_chat_template_config(const std::string& path, std::string_view name = "");

// As above from already-parsed tokenizer_config.json contents.
StatusOr<ChatTemplateConfig> chat_template_config_from_json(const nlohmann::ordered_json& config,
                                                            std::string_view name = "");

}  // namespace k3::tok
